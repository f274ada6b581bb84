//! Schema migrations: the numbered SQL files of `migrations/`, embedded at compile
//! time and applied in order by refinery, which records each applied version in
//! [`MIGRATION_TABLE`]. Running them twice is a no-op; concurrent runs are serialised
//! by a PostgreSQL advisory lock.

use tokio_postgres::types::Type;

use crate::conn::{Conn, Interrupt};
use crate::error::Result;
use crate::pool::Pool;

refinery::embed_migrations!("../../migrations");

/// Where refinery records applied migrations.
pub const MIGRATION_TABLE: &str = "idempotent_job_schema_migrations";

/// Advisory lock key held while migrating ("idemjob" as a number).
const LOCK_KEY: i64 = 0x0069_6465_6d6a_6f62;

/// Applies every migration not yet recorded and returns the names of those applied
/// now, e.g. `["V1__create_idempotent_job_records"]` (empty when up to date).
///
/// Errors: [`crate::error::Error::Migration`] when a migration fails (its
/// transaction is rolled back) or when every migration is recorded but the table lacks
/// columns (it drifted: see [`crate::schema::check_after_migrate`]), connection errors.
pub fn migrate(pool: &Pool, interrupt: &Interrupt<'_>) -> Result<Vec<String>> {
    // Not bounded by the deadline: a migration of a large table may take long, and
    // the advisory lock waits for a concurrent migration.
    let mut pooled = pool.checkout(interrupt)?;
    let applied = pooled.run(interrupt, async |conn| run(conn).await);
    pooled.finish();
    applied
}

async fn run(conn: &mut Conn) -> Result<Vec<String>> {
    conn.execute_typed("SELECT pg_advisory_lock($1)", &[(&LOCK_KEY, Type::INT8)])
        .await?;
    let report = migrations::runner()
        .set_migration_table_name(MIGRATION_TABLE)
        .run_async(conn.client_mut())
        .await;
    let unlock = conn
        .execute_typed("SELECT pg_advisory_unlock($1)", &[(&LOCK_KEY, Type::INT8)])
        .await;
    let report = report?;
    unlock?;
    crate::schema::check_after_migrate(conn).await?;
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| m.to_string())
        .collect())
}

/// The schema SQL of every embedded migration, in order, for teams that apply
/// migrations with their own tools.
pub fn schema_sql() -> String {
    let mut out = String::new();
    for m in migrations::runner().get_migrations() {
        out.push_str(&format!(
            "-- {m}\n{}\n",
            m.sql().unwrap_or_default().trim_end()
        ));
    }
    out
}
