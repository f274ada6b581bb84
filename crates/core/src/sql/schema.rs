//! The schema's statements outside the migrations: the table's live columns
//! ([`COLUMNS_SQL`]) and the distributed profile's migration lock.

/// The table's live columns (the table found through the connection's `search_path`),
/// or no row at all when there is no such table.
pub const COLUMNS_SQL: &str = "SELECT a.attname::text FROM pg_attribute a \
     WHERE a.attrelid = to_regclass('idempotent_job_records') AND a.attnum > 0 \
     AND NOT a.attisdropped";

/// The distributed profile's migration lock (`Config::distributed` in the config module:
/// such servers have no advisory locks): one row, made before the first migration.
pub const MIGRATION_LOCK_TABLE_SQL: &str =
    "CREATE TABLE IF NOT EXISTS idempotent_job_migration_lock \
     (id int4 PRIMARY KEY, holder text NOT NULL, locked_at timestamptz NOT NULL DEFAULT now())";

/// Takes the migration lock for holder $1 (a fresh UUID text): returns a row when taken,
/// none while another holder has it. A lock older than 15 minutes (a migrator that died
/// holding it) is taken over.
pub const MIGRATION_LOCK_SQL: &str = "INSERT INTO idempotent_job_migration_lock AS l (id, holder) \
     VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, locked_at = now() \
     WHERE l.locked_at < now() - interval '15 minutes' RETURNING l.holder";

/// Gives the migration lock of holder $1 back.
pub const MIGRATION_UNLOCK_SQL: &str =
    "DELETE FROM idempotent_job_migration_lock WHERE id = 1 AND holder = $1";
