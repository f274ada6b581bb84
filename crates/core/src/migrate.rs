//! Schema migrations: the numbered SQL files of `migrations/`, embedded at compile
//! time and applied in order by refinery, which records each applied version in
//! [`MIGRATION_TABLE`]. Running them twice is a no-op; concurrent runs are serialised
//! by a PostgreSQL advisory lock, or under the distributed profile (no advisory locks
//! there) by a lock row ([`crate::sql::MIGRATION_LOCK_SQL`]).

use tokio_postgres::types::Type;

use crate::conn::{Conn, Interrupt};
use crate::error::Result;
use crate::pool::Pool;
use crate::sql;

mod embedded {
    // refinery's generated module and function carry no docs of their own.
    #![allow(missing_docs)]
    refinery::embed_migrations!("../../migrations");
}

/// The migrations of `migrations/`, embedded at compile time: `migrations::runner()`
/// gives refinery's runner over them, in version order.
pub use embedded::migrations;

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
    migrate_through(pool, interrupt, None)
}

/// [`migrate`], stopping after version `last` (`Some(9)`: V1–V9) when given: a staged
/// rollout (the upgrade test builds an older table with it). The table's columns are
/// checked only when every migration is applied.
///
/// Errors: as [`migrate`].
pub fn migrate_through(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    last: Option<i32>,
) -> Result<Vec<String>> {
    // Not bounded by the deadline: a migration of a large table may take long, and
    // the advisory lock waits for a concurrent migration.
    let mut pooled = pool.checkout(interrupt)?;
    let applied = if pool.distributed() {
        let holder = uuid::Uuid::new_v4().to_string();
        lock_row(pool, interrupt, &mut pooled, &holder).and_then(|()| {
            let applied = pooled.run(interrupt, async |conn| run(conn, last).await);
            let unlocked = pooled.run(interrupt, async |conn| {
                Ok(conn
                    .execute_typed(sql::MIGRATION_UNLOCK_SQL, &[(&holder, Type::TEXT)])
                    .await?)
            });
            let applied = applied?;
            unlocked?;
            Ok(applied)
        })
    } else {
        pooled.run(interrupt, async |conn| {
            conn.execute_typed("SELECT pg_advisory_lock($1)", &[(&LOCK_KEY, Type::INT8)])
                .await?;
            let applied = run(conn, last).await;
            let unlock = conn
                .execute_typed("SELECT pg_advisory_unlock($1)", &[(&LOCK_KEY, Type::INT8)])
                .await;
            let applied = applied?;
            unlock?;
            Ok(applied)
        })
    };
    pooled.finish();
    applied
}

/// Takes the distributed profile's lock row for `holder`, polling every 200 ms while
/// another migrator holds it (interruptible; not bounded by the deadline, as the
/// advisory lock is not).
fn lock_row(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    pooled: &mut crate::pool::Pooled,
    holder: &str,
) -> Result<()> {
    // Two first migrators may race to create the table: the loser's CREATE fails
    // (unique violation in the catalog) and its next round finds the table.
    let mut created = false;
    loop {
        if !created {
            created = pooled
                .run(interrupt, async |conn| {
                    Ok(conn
                        .execute_typed(sql::MIGRATION_LOCK_TABLE_SQL, &[])
                        .await?)
                })
                .is_ok();
        }
        if created {
            let taken = pooled.run(interrupt, async |conn| {
                Ok(conn
                    .query_typed(sql::MIGRATION_LOCK_SQL, &[(&holder, Type::TEXT)])
                    .await?)
            })?;
            if !taken.is_empty() {
                return Ok(());
            }
        }
        pool.pause(interrupt, std::time::Duration::from_millis(200))?;
    }
}

async fn run(conn: &mut Conn, last: Option<i32>) -> Result<Vec<String>> {
    let mut runner = migrations::runner();
    if let Some(version) = last {
        runner = runner.set_target(refinery::Target::Version(version));
    }
    runner.set_migration_table_name(MIGRATION_TABLE);
    let report = runner.run_async(conn.client_mut()).await;
    let report = report?;
    if last.is_none() {
        crate::schema::check_after_migrate(conn).await?;
    }
    Ok(report
        .applied_migrations()
        .iter()
        .map(|m| m.to_string())
        .collect())
}

/// The schema SQL of every embedded migration in version order (V1, V2, … V11: the
/// runner holds them in file-name order, where V10 sorts before V1), for teams that
/// apply migrations with their own tools (`psql -f`). Reads nothing.
pub fn schema_sql() -> String {
    let mut ordered = migrations::runner().get_migrations().clone();
    ordered.sort_by_key(|m| m.version());
    let mut out = String::new();
    for m in ordered {
        out.push_str(&format!(
            "-- {m}\n{}\n",
            m.sql().unwrap_or_default().trim_end()
        ));
    }
    out
}
