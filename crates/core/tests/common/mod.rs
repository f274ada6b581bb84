//! Helpers shared by the integration tests (each test file is its own crate and uses
//! only some of them).
#![allow(dead_code)]

use idempotent_job_core::config::Config;
use idempotent_job_core::conn::{Conn, Interrupt};
use idempotent_job_core::error::Result as CoreResult;
use idempotent_job_core::migrate;
use idempotent_job_core::record::ClaimRequest;
use idempotent_job_core::store::{PoolHandle, Store};
use uuid::Uuid;

/// The core's statements and record types under one name, with the conn-level
/// helpers only the tests use (a claim with a fresh or given token, a plain
/// completion, a release).
#[allow(unused_imports)]
pub mod claim {
    pub use idempotent_job_core::claim::*;
    pub use idempotent_job_core::fenced::*;
    pub use idempotent_job_core::record::*;
    pub use idempotent_job_core::records::*;
    pub use idempotent_job_core::sql::*;

    use super::{Conn, CoreResult as Result, Uuid};

    /// Decides one delivery in one round trip ([`CLAIM_SQL`]) with a fresh token.
    pub async fn claim(conn: &Conn, req: &ClaimRequest) -> Result<ClaimReply> {
        claim_as(conn, req, Uuid::new_v4()).await
    }

    /// [`claim`] with the caller's fencing token.
    pub async fn claim_as(conn: &Conn, req: &ClaimRequest, token: Uuid) -> Result<ClaimReply> {
        Ok(claim_noting(conn, req, token).await?.0)
    }

    /// Marks the claim `token` completed, storing no result.
    pub async fn complete(conn: &Conn, job_type: &str, key: &str, token: Uuid) -> Result<()> {
        fenced(conn, Fenced::Complete, job_type, key, token, None).await
    }

    /// Marks the claim `token` completed with a prepared result.
    pub async fn complete_with_result(
        conn: &Conn,
        asynchronous: bool,
        job_type: &str,
        key: &str,
        token: Uuid,
        result: &PreparedResult,
    ) -> Result<()> {
        let change = if asynchronous {
            Fenced::CompleteAsynchronously
        } else {
            Fenced::Complete
        };
        fenced_with_result(conn, change, job_type, key, token, None, Some(result)).await
    }

    /// Releases the claim `token` with `error` as its last error.
    pub async fn release(
        conn: &Conn,
        job_type: &str,
        key: &str,
        token: Uuid,
        error: &str,
    ) -> Result<()> {
        fenced(conn, Fenced::Release, job_type, key, token, Some(error)).await
    }
}

/// Uninterruptible calls on a store's pool, for the tests (the bindings pass an
/// [`Interrupt`] wired to their runtime instead).
pub trait StoreExt {
    /// Runs `f` with this process's handles on the calling thread, uninterruptibly.
    fn run<T>(&self, f: impl FnOnce(&PoolHandle, &Interrupt<'_>) -> CoreResult<T>)
        -> CoreResult<T>;
    /// `pool::with_conn` on this process's pool, uninterruptibly.
    fn with_conn<T>(&self, op: impl AsyncFnOnce(&mut Conn) -> CoreResult<T>) -> CoreResult<T>;
}

impl StoreExt for Store {
    fn run<T>(
        &self,
        f: impl FnOnce(&PoolHandle, &Interrupt<'_>) -> CoreResult<T>,
    ) -> CoreResult<T> {
        let pool = self.pool()?;
        f(&pool, &Interrupt::none())
    }

    fn with_conn<T>(&self, op: impl AsyncFnOnce(&mut Conn) -> CoreResult<T>) -> CoreResult<T> {
        self.run(|pool, interrupt| idempotent_job_core::pool::with_conn(pool, interrupt, op))
    }
}

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
    store.run(|pool, i| migrate::migrate(pool, i)).unwrap();
    store
}

/// A migrated store (2 connections) whose record table lives in a fresh schema
/// `schema` (dropped first if a crashed run left it): its table, rows and statistics
/// are the test's alone.
pub fn store_in(schema: &str) -> Store {
    store_in_through(schema, None)
}

/// [`store_in`] with the migrations applied only through version `last` when given
/// (`Some(9)`: the table as V9 left it).
pub fn store_in_through(schema: &str, last: Option<i32>) -> Store {
    let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}");
    store()
        .with_conn(async |c| Ok(c.batch_execute(&sql).await?))
        .unwrap();
    let store = store_on(schema, 2);
    store
        .run(|pool, i| migrate::migrate_through(pool, i, last))
        .unwrap();
    store
}

/// A store of `pool_size` connections on the record table of `schema`, as it is (no
/// migration of its own): a second process's view of a table another store made.
pub fn store_on(schema: &str, pool_size: usize) -> Store {
    let mut config = Config::new(database_url());
    config.schema = Some(schema.to_string());
    config.pool_size = pool_size;
    Store::new(config).unwrap()
}

/// A delivery of `(job_type, key)` with a lease of `lease` seconds and everything a
/// worker sends with it: a delivery id, the payload and its digest, job class, queue
/// and facts (so a first claim writes every column it writes in production).
pub fn request(job_type: &str, key: &str, lease: f64) -> ClaimRequest {
    ClaimRequest {
        job_type: job_type.into(),
        operation_key: key.into(),
        delivery_id: Some(format!("jid-{key}")),
        lease_seconds: lease,
        args_digest: Some("digest-a".into()),
        job_class: Some("ExampleJob".into()),
        queue: Some("default".into()),
        args_json: Some(format!("[{key:?}]")),
        refuse_mismatch: false,
        facts_json: Some(format!(r#"{{"delivery":"d-{key}"}}"#)),
        returning: false,
    }
}

/// Drops a test's schema (its table and rows), so later tests and suites never see them.
pub fn drop_schema(schema: &str) {
    let sql = format!("DROP SCHEMA {schema} CASCADE");
    store()
        .with_conn(async |c| Ok(c.batch_execute(&sql).await?))
        .unwrap();
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

/// The named statements on the connection of a one-connection store that name the record
/// table: each one's text and how many times it ran (`generic_plans + custom_plans` of
/// `pg_prepared_statements`, PostgreSQL 14 and later; `None` on 13, which does not count).
pub fn prepared_on_connection(store: &Store) -> Vec<(String, Option<i64>)> {
    store
        .with_conn(async |c| {
            let rows = c
                .query_typed(
                    "SELECT statement, (to_jsonb(p) ->> 'generic_plans')::int8 \
                            + (to_jsonb(p) ->> 'custom_plans')::int8 \
                     FROM pg_prepared_statements p \
                     WHERE statement LIKE '%idempotent_job_records%' ORDER BY statement",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
        .unwrap()
}

/// The run counts of each prepared copy of `sql` among `prepared`.
pub fn runs_of(prepared: &[(String, Option<i64>)], sql: &str) -> Vec<Option<i64>> {
    prepared
        .iter()
        .filter(|(text, _)| text == sql)
        .map(|(_, runs)| *runs)
        .collect()
}

/// What `runs_of` returns for copies that ran `runs` times on this server: the counts on
/// PostgreSQL 14 and later, one `None` per copy on 13.
pub fn counted(store: &Store, runs: &[i64]) -> Vec<Option<i64>> {
    let version: i32 = store
        .with_conn(async |c| {
            let row = c
                .query_one("SELECT current_setting('server_version_num')::int4", &[])
                .await?;
            Ok(row.get(0))
        })
        .unwrap();
    runs.iter()
        .map(|&n| (version >= 140_000).then_some(n))
        .collect()
}

/// A plain tokio-postgres session on the test database, outside the gem's pool (to
/// hold locks, read what the gem wrote, or change the server's settings).
pub struct Admin {
    runtime: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Admin {
    /// Connects to [`database_url`].
    pub fn new() -> Admin {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let client = runtime.block_on(async {
            let (client, connection) =
                tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
                    .await
                    .unwrap();
            tokio::spawn(connection);
            client
        });
        Admin { runtime, client }
    }

    /// Runs `sql` (one or more statements), returning PostgreSQL's refusal.
    pub fn try_exec(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.runtime.block_on(self.client.batch_execute(sql))
    }

    /// Runs `sql`; panics when PostgreSQL refuses it.
    pub fn exec(&self, sql: &str) {
        self.try_exec(sql).unwrap()
    }

    /// The first column of `sql`'s one row, an int8.
    pub fn int(&self, sql: &str) -> i64 {
        self.runtime
            .block_on(self.client.query_one(sql, &[]))
            .unwrap()
            .get(0)
    }

    /// The first column of `sql`'s one row, a text.
    pub fn text(&self, sql: &str) -> String {
        self.runtime
            .block_on(self.client.query_one(sql, &[]))
            .unwrap()
            .get(0)
    }

    /// `sql`'s rows, its parameters bound to `params`.
    pub fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Vec<tokio_postgres::Row> {
        self.runtime
            .block_on(self.client.query(sql, params))
            .unwrap()
    }

    /// The first column of `sql`'s one row (an int8), `$1` bound to `param`.
    pub fn count(&self, sql: &str, param: &str) -> i64 {
        self.runtime
            .block_on(self.client.query_one(sql, &[&param]))
            .unwrap()
            .get(0)
    }
}
