//! Native extension of the `idempotent_job` gem.
//!
//! [`core`] holds everything that talks to PostgreSQL (configuration, pool, claim
//! protocol, migrations, errors) and has no Ruby in it, so `cargo test` exercises it
//! against a real database. [`ruby`] is the thin magnus layer that exposes it as
//! `IdempotentJob::Native`.

pub mod core;
mod ruby;

#[magnus::init]
fn init(ruby: &magnus::Ruby) -> Result<(), magnus::Error> {
    ruby::init(ruby)
}
