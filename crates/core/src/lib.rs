//! idempotent_job_core: durable idempotency records in PostgreSQL (the claim protocol, its SQL, the pool, configuration, errors). No host language here: the Ruby extension (ext/idempotent_job) and the Python one bind it; `cargo test` runs it against PostgreSQL.
pub mod bookkeeping;
pub mod claim;
pub mod config;
pub mod error;
pub mod heartbeat;
pub mod migrate;
pub mod protocol;
pub mod report;
pub mod retry;
pub mod schema;
pub mod session;
pub mod store;
pub mod tls;
pub mod values;
