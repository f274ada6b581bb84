//! Helpers shared by the integration tests (each test file is its own crate and uses
//! only some of them).
#![allow(dead_code)]

use idempotent_job::core::claim::{self, ClaimRequest};
use idempotent_job::core::config::Config;
use idempotent_job::core::migrate;
use idempotent_job::core::store::Store;

/// The PostgreSQL the tests run against.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .expect("DATABASE_URL must point at a PostgreSQL for these tests (bin/test sets it)")
}

/// A migrated store with the default settings (prepared statements, 10 connections).
pub fn store() -> Store {
    store_with(true, 10)
}

/// A migrated store whose own statements are named prepared statements (`prepared`)
/// or unnamed ones, with `pool_size` connections.
pub fn store_with(prepared: bool, pool_size: usize) -> Store {
    let mut config = Config::new(database_url());
    config.prepared_statements = prepared;
    config.pool_size = pool_size;
    let store = Store::new(config).unwrap();
    store.run(migrate::migrate).unwrap();
    store
}

/// The record of `req`'s operation, if any.
pub fn find_record(store: &Store, req: &ClaimRequest) -> Option<claim::Record> {
    let req = req.clone();
    store
        .run(|pool, i| pool.bookkeeper().settle(pool, i))
        .unwrap();
    store
        .with_conn(async |c| claim::find(c, &req.job_type, &req.operation_key).await)
        .unwrap()
}
