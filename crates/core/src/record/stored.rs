//! The stored record, defined once: the `record!` list of its columns gives [`Record`],
//! its fields for the bindings ([`Field`]), [`FIND_SQL`] and [`RESOLVE_SQL`].

use chrono::{DateTime, Utc};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::error::Result;

/// Defines the record once: each column of [`Record`] with its Rust type, the kind of
/// value it is for other layers ([`Field`]), the name the bindings give it when that is
/// not the field's own (`as args`: the JSON text `args_json` is the parsed `args`) and
/// its expression in [`FIND_SQL`]'s select list (named after the field). From that one
/// list come the struct, [`FIND_SQL`] and [`RESOLVE_SQL`] (the record after a resolve),
/// the row's conversion ([`Record::from_row`]), the column names ([`Record::COLUMNS`]),
/// the bindings' field names ([`Record::NAMES`]) and the named values both bindings
/// convert ([`Record::fields`]): the Ruby Record's members and the Python record dict's
/// keys are these, and nothing else.
macro_rules! record {
    (
        $(#[$meta:meta])*
        pub struct Record {
            $(#[$first_doc:meta])* $first:ident: $first_ty:ty => $first_kind:ident = $first_sql:expr,
            $($(#[$doc:meta])* $field:ident: $ty:ty => $kind:ident $(as $public:ident)? = $sql:expr,)*
        }
        $(#[$find_doc:meta])*
        pub const FIND_SQL = SELECT ... $from:literal;
        $(#[$resolve_doc:meta])*
        pub const RESOLVE_SQL = [$change:expr] SELECT ... $settled:literal;
    ) => {
        $(#[$meta])*
        pub struct Record {
            $(#[$first_doc])* pub $first: $first_ty,
            $($(#[$doc])* pub $field: $ty,)*
        }

        $(#[$find_doc])*
        pub const FIND_SQL: &str = concat!(
            "SELECT ", $first_sql, " AS ", stringify!($first),
            $(",\n       ", $sql, " AS ", stringify!($field),)*
            $from
        );

        $(#[$resolve_doc])*
        pub const RESOLVE_SQL: &str = concat!(
            $change,
            "SELECT ", $first_sql, " AS ", stringify!($first),
            $(",\n       ", $sql, " AS ", stringify!($field),)*
            $settled
        );

        impl Record {
            /// The record's column names, in [`FIND_SQL`]'s order (its select list's names).
            pub const COLUMNS: &'static [&'static str] = &[stringify!($first), $(stringify!($field)),*];

            /// The names the bindings give the record's fields, in [`Record::COLUMNS`]'
            /// order: the column's own name, or the one it is declared `as`.
            pub const NAMES: &'static [&'static str] =
                &[stringify!($first), $(record_name!($field $($public)?)),*];

            /// A row of [`FIND_SQL`] (or [`RESOLVE_SQL`]) as a record.
            ///
            /// Errors: [`Error::Unreadable`](crate::error::Error::Unreadable) naming the record and
            /// the column for a value the core cannot read (a timestamp of `infinity`
            /// edited into the record), never retried.
            pub fn from_row(row: &Row) -> Result<Record> {
                Ok(Record {
                    $first: column(row, stringify!($first))?,
                    $($field: column(row, stringify!($field))?,)*
                })
            }

            /// The first column of `row` the core cannot read ([`Record::from_row`]'s
            /// [`Error::Unreadable`](crate::error::Error::Unreadable)), if any: what a list
            /// marks for a record it shows without reading (`records::Listed`).
            pub fn unreadable_column(row: &Row) -> Option<&'static str> {
                if row.try_get::<_, $first_ty>(stringify!($first)).is_err() {
                    return Some(stringify!($first));
                }
                $(if row.try_get::<_, $ty>(stringify!($field)).is_err() {
                    return Some(stringify!($field));
                })*
                None
            }

            /// Every field's name for the bindings ([`Record::NAMES`]) and value, in
            /// [`Record::COLUMNS`]' order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, Field<'_>)> {
                [
                    (stringify!($first), Field::$first_kind(&self.$first)),
                    $((record_name!($field $($public)?), Field::$kind(&self.$field)),)*
                ]
                .into_iter()
            }
        }
    };
}

/// The column `name` of a record's row ([`Record::from_row`]).
///
/// Errors: [`unreadable_column`].
fn column<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, name: &str) -> Result<T> {
    row.try_get(name)
        .map_err(|e| unreadable_column(row, name, &e))
}

/// The error for a record's column the core cannot read (a `timestamptz` of
/// `infinity` or `-infinity`, which no time of the bindings can hold: only a record
/// edited by hand has one): an [`Error::Unreadable`](crate::error::Error::Unreadable) naming
/// the record (its job type and operation key when readable) and the column, so it is
/// not retried: reading again reads the same value.
pub(crate) fn unreadable_column(
    row: &Row,
    name: &str,
    err: &tokio_postgres::Error,
) -> crate::error::Error {
    let text = |c: &str| row.try_get::<_, String>(c).ok();
    let what = match (text("job_type"), text("operation_key")) {
        (Some(t), Some(k)) => format!("the record of {t} operation {k:?}"),
        _ => "a record".to_owned(),
    };
    crate::error::Error::Unreadable(format!(
        "{what} cannot be read: its column {name} holds a value the core cannot read ({}; a \
         timestamp of 'infinity' or '-infinity', edited into the record by hand, is one): \
         set {name} to a real value (or NULL where allowed); reading it again reads the same \
         value, so it is not retried",
        crate::error::convert::chain(err)
    ))
}

/// A field's name for the bindings: its own, or the one it is declared `as`.
macro_rules! record_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident $public:ident) => {
        stringify!($public)
    };
}

/// One column's value of a [`Record`], by kind, for a layer that converts it (the Ruby
/// binding makes a String, a Symbol, an Integer, a Float, true/false, a Time, an Array,
/// a parsed JSON value or nil; the Python one a str, an int, a float, a bool, epoch
/// seconds, a list, a parsed JSON value or None).
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    /// Text.
    Text(&'a String),
    /// Text or NULL.
    OptText(&'a Option<String>),
    /// One of a few names (status, last_claim): a Symbol in Ruby, a str in Python.
    Name(&'a String),
    /// One of a few names or NULL (result_state): a Symbol or nil in Ruby, a str or
    /// None in Python.
    OptName(&'a Option<String>),
    /// Texts (job_classes): an Array of String in Ruby, a list of str in Python.
    Texts(&'a Vec<String>),
    /// JSON text or NULL: each binding gives the parsed value (None/nil for NULL).
    Json(&'a Option<String>),
    /// An integer.
    Int(&'a i32),
    /// A number of seconds.
    Float(&'a f64),
    /// A boolean.
    Bool(&'a bool),
    /// A claim token.
    Token(&'a Uuid),
    /// A time (UTC).
    Time(&'a DateTime<Utc>),
    /// A time (UTC) or NULL.
    OptTime(&'a Option<DateTime<Utc>>),
}

record! {
    /// A whole idempotency record, as stored. Times are UTC.
    #[derive(Debug, Clone)]
    pub struct Record {
        /// The job type (idempotency scope: the class name by default).
        job_type: String => Text = "job_type",
        /// The canonical operation key.
        operation_key: String => Text = "operation_key",
        /// `claimed`, `completed`, `released`, `held` or `given_up`.
        status: String => Name = "status",
        /// The fencing token: a new UUID at every claim; every fenced change presents it.
        claim_token: Uuid => Token = "claim_token",
        /// Claims made on the record.
        attempts: i32 => Int = "attempts",
        /// Stale claims taken over (claims taken from a lease that ran out).
        takeovers: i32 => Int = "takeovers",
        /// How the current claim was obtained: `first`, `retry` or `takeover`.
        last_claim: String => Name = "last_claim",
        /// The last claiming delivery's id.
        jid: Option<String> => OptText = "jid",
        /// Copies turned away (completed, held, given up, or claimed under a live
        /// lease), each counted once, when it first arrives.
        duplicates: i32 => Int = "duplicates",
        /// The current claim's lease, in seconds.
        lease_seconds: f64 => Float = "lease_seconds",
        /// Whether `lease_expires_at` has passed, by the database clock.
        lease_expired: bool => Bool = "lease_expires_at <= now()",
        /// Why the last claim ended before a completion: the body's error of a release,
        /// a failed lookup, or why the reclaim budget held the operation.
        last_error: Option<String> => OptText = "last_error",
        /// The claiming delivery's argument digest (payload mismatch detection).
        args_digest: Option<String> => OptText = "args_digest",
        /// The stored job's class (see `args_json`).
        job_class: Option<String> => OptText = "job_class",
        /// The stored job's queue (see `args_json`).
        queue: Option<String> => OptText = "queue",
        /// The arguments of the delivery that last took a stale claim over, as JSON text
        /// (unwrapped when the claim had to wrap them): with `job_class` and `queue`, the
        /// stored job a rerun re-sends; `None` when no delivery took the operation over.
        /// The bindings give it parsed, as `args`.
        args_json: Option<String> => Json as args = "coalesce(args ->> 'idempotent_job:json', args::text)",
        /// Whether the record holds a stored job (what a rerun re-sends): the one rule,
        /// `sql::holds_stored_job!`, that the resolve's change and `NO_STORED_JOB_SQL`
        /// read too. A rerun of a record without one is refused.
        stored_job: bool => Bool = holds_stored_job!(),
        /// Every job class that delivered the operation (the first claim's, then each
        /// repeat's new one), in order.
        job_classes: Vec<String> => Texts = "job_classes",
        /// Copies whose arguments differed from the claim's, each counted once.
        mismatches: i32 => Int = "mismatches",
        /// The last delivery's arguments differed from the claim's.
        last_mismatch: bool => Bool = "last_mismatch",
        /// How a person settled the operation: `done` or `rerun` (`resolve`).
        resolution: Option<String> => OptText = "resolution",
        /// When the first claim was made.
        first_claimed_at: DateTime<Utc> => Time = "first_claimed_at",
        /// When the current claim was made.
        claimed_at: DateTime<Utc> => Time = "claimed_at",
        /// When the current claim's lease ends (renewed by the heartbeat).
        lease_expires_at: DateTime<Utc> => Time = "lease_expires_at",
        /// When the completion was recorded.
        completed_at: Option<DateTime<Utc>> => OptTime = "completed_at",
        /// When the last claim was released.
        released_at: Option<DateTime<Utc>> => OptTime = "released_at",
        /// When the last duplicate arrived.
        last_duplicate_at: Option<DateTime<Utc>> => OptTime = "last_duplicate_at",
        /// When the lease was last renewed.
        heartbeat_at: Option<DateTime<Utc>> => OptTime = "heartbeat_at",
        /// When the operation was (last) held for a person.
        held_at: Option<DateTime<Utc>> => OptTime = "held_at",
        /// When the operation was given up.
        given_up_at: Option<DateTime<Utc>> => OptTime = "given_up_at",
        /// When a person resolved the operation.
        resolved_at: Option<DateTime<Utc>> => OptTime = "resolved_at",
        /// The stored result as JSON text (V7; NULL when none is stored). The bindings
        /// give it parsed, as `result`.
        result_json: Option<String> => Json as result = "result::text",
        /// `stored`, `too_large` or `unencodable` (V7; NULL: no store was requested).
        result_state: Option<String> => OptName = "result_state",
        /// The record's last change.
        updated_at: DateTime<Utc> => Time = "updated_at",
    }
    /// Read one record: [`Record`]'s columns. Parameters: $1 job_type, $2 operation_key.
    pub const FIND_SQL = SELECT ... "\n  FROM idempotent_job_records\n WHERE job_type = $1 AND operation_key = $2";
    /// Settle a held (or given-up) operation (the change is `sql::resolve_update!`) and
    /// answer its record after the change — [`Record`]'s columns — plus `first_facts` (the
    /// first claim's facts as JSON object text): what a rerun re-sends is the stored
    /// delivery of its last claim (job class, queue, arguments). No row when the
    /// operation was not held or given up. Parameters: $1 job_type, $2 operation_key,
    /// $3 resolution (`done` or `rerun`).
    pub const RESOLVE_SQL = [resolve_update!()] SELECT ... ",\n       first_facts::text AS first_facts\n  FROM settled";
}
