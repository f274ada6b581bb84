//! The native core: no Ruby here, tested by `cargo test` against PostgreSQL.
pub mod bookkeeping;
pub mod claim;
pub mod config;
pub mod error;
pub mod heartbeat;
pub mod migrate;
pub mod report;
pub mod retry;
pub mod schema;
pub mod session;
pub mod store;
pub mod tls;
pub mod values;
