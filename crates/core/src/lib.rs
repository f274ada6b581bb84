//! idempotent_job_core: durable idempotency records in PostgreSQL (the claim protocol, its SQL, the pool, configuration, errors). No host language here: the Ruby extension (ext/idempotent_job) and the Python one bind it; `cargo test` runs it against PostgreSQL.
/// The LISTEN/NOTIFY channel of one record, as an SQL expression over its `job_type`
/// and `operation_key` columns: `idempotent_job_` and the md5 of the length-prefixed
/// pair (a valid identifier of 47 characters, whatever the key). Written once here;
/// the completion and release notify on it, [`results::wait`] listens on it.
macro_rules! notify_channel {
    () => {
        "'idempotent_job_' || md5(length(job_type) || ':' || job_type || operation_key)"
    };
}

pub mod bookkeeping;
pub mod canonical;
pub mod claim;
pub mod config;
pub mod error;
pub mod heartbeat;
pub mod keys;
pub mod migrate;
pub mod options;
pub mod protocol;
pub mod report;
pub mod results;
pub mod retry;
pub mod schema;
pub mod session;
pub mod store;
pub mod tls;
pub mod values;
