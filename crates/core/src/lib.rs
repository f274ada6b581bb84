//! idempotent_job_core: durable idempotency records in PostgreSQL (the claim protocol, its SQL, the pool, configuration, errors). No host language here: the Ruby extension (ext/idempotent_job) and the Python one bind it; `cargo test` runs it against PostgreSQL.
//!
//! Modules, in dependency order (no module imports one that imports it back; the test
//! `tests/module_graph.rs` checks it): `error` (the one error type and the error
//! table), `words` (message wording: a name with its article), `keys` (over
//! `canonical`), `canonical`, `declaration` (key declarations), `values`, `tls`;
//! `config` (every default and limit, over `tls`), `options` (over `config`); `sql`
//! (every statement text); `transitions` (the decision table, over `sql`); `record` (the
//! record and decision types); `conn` (one connection and its I/O
//! driver); `pool` (the pool, checkouts, retries on a fresh connection);
//! `schema`; `fenced` (completion, release and the other fenced changes);
//! `bookkeeping`, `heartbeat`; `store` (the store and its per-process handles);
//! `claim` (deliver), `records`, `operations` (the operating calls both bindings
//! make), `results` (wait), `session`, `migrate`, `report`;
//! `protocol`; `job_settings` (job options from settings, over `protocol`), `telemetry`
//! (span names and labels, over `protocol`).

#![warn(missing_docs)]

#[macro_use]
pub mod sql;

pub mod bookkeeping;
pub mod canonical;
pub mod claim;
pub mod config;
pub mod conn;
pub mod declaration;
pub mod error;
pub mod fenced;
pub mod heartbeat;
pub mod job_settings;
pub mod keys;
pub mod migrate;
pub mod operations;
pub mod options;
pub mod pool;
pub mod protocol;
pub mod record;
pub mod records;
pub mod repeats;
pub mod report;
pub mod results;
pub mod schema;
pub mod session;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod transitions;
pub mod values;
pub mod words;
