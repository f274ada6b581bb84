//! Native extension of the `idempotent_job` gem.
//!
//! Everything that talks to PostgreSQL (configuration, pool, claim protocol, migrations,
//! errors) lives in the core crate, `idempotent_job_core` (crates/core), which knows no
//! host language and is tested by `cargo test` against a real database. `ruby` (src/ruby/) is
//! the thin magnus layer that exposes it as `IdempotentJob::Native`.

mod ruby;

#[magnus::init]
fn init(ruby: &magnus::Ruby) -> Result<(), magnus::Error> {
    ruby::init(ruby)
}
