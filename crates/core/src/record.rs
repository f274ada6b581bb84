//! The idempotency record and the decision types: what a delivery asks for
//! ([`ClaimRequest`], checked by [`check_request`]), what the claim statement answers
//! ([`ClaimRow`], turned into a [`ClaimReply`] by [`decide`], the one place that reads a
//! claim's outcome), the whole stored record ([`Record`], read by `FIND_SQL`), and a
//! stored result ([`ResultState`], [`Replay`], [`PreparedResult`], checked by
//! [`prepare`]). No I/O here.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::config::MAX_LEASE_SECONDS;
use crate::error::{Error, Result};
use crate::transitions::{ClaimVerdict, Met};

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
            /// Errors: a column missing or of another type ([`Error::Database`]).
            pub fn from_row(row: &Row) -> Result<Record> {
                Ok(Record {
                    $first: row.try_get(stringify!($first))?,
                    $($field: row.try_get(stringify!($field))?,)*
                })
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
        job_type: String => Text = "job_type",
        operation_key: String => Text = "operation_key",
        status: String => Name = "status",
        claim_token: Uuid => Token = "claim_token",
        attempts: i32 => Int = "attempts",
        takeovers: i32 => Int = "takeovers",
        last_claim: String => Name = "last_claim",
        jid: Option<String> => OptText = "jid",
        duplicates: i32 => Int = "duplicates",
        lease_seconds: f64 => Float = "lease_seconds",
        /// Whether `lease_expires_at` has passed, by the database clock.
        lease_expired: bool => Bool = "lease_expires_at <= now()",
        last_error: Option<String> => OptText = "last_error",
        args_digest: Option<String> => OptText = "args_digest",
        job_class: Option<String> => OptText = "job_class",
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
        mismatches: i32 => Int = "mismatches",
        last_mismatch: bool => Bool = "last_mismatch",
        resolution: Option<String> => OptText = "resolution",
        first_claimed_at: DateTime<Utc> => Time = "first_claimed_at",
        claimed_at: DateTime<Utc> => Time = "claimed_at",
        lease_expires_at: DateTime<Utc> => Time = "lease_expires_at",
        completed_at: Option<DateTime<Utc>> => OptTime = "completed_at",
        released_at: Option<DateTime<Utc>> => OptTime = "released_at",
        last_duplicate_at: Option<DateTime<Utc>> => OptTime = "last_duplicate_at",
        heartbeat_at: Option<DateTime<Utc>> => OptTime = "heartbeat_at",
        held_at: Option<DateTime<Utc>> => OptTime = "held_at",
        given_up_at: Option<DateTime<Utc>> => OptTime = "given_up_at",
        resolved_at: Option<DateTime<Utc>> => OptTime = "resolved_at",
        /// The stored result as JSON text (V7; NULL when none is stored). The bindings
        /// give it parsed, as `result`.
        result_json: Option<String> => Json as result = "result::text",
        /// `stored`, `too_large` or `unencodable` (V7; NULL: no store was requested).
        result_state: Option<String> => OptName = "result_state",
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

/// One delivery's request for a claim. Owned, so it can cross into a runtime
/// thread while the caller's language runtime goes on.
#[derive(Debug, Clone, Default)]
pub struct ClaimRequest {
    /// The job type (idempotency scope), e.g. `"ChargeOrderJob"`.
    pub job_type: String,
    /// The canonical operation key, e.g. `"42"`.
    pub operation_key: String,
    /// The delivering job's id, stored as the record's last claiming jid.
    pub delivery_id: Option<String>,
    /// Lease length in seconds (> 0).
    pub lease_seconds: f64,
    /// Digest of the delivery's canonical arguments (payload mismatch detection).
    pub args_digest: Option<String>,
    /// Job class, queue and arguments (JSON text) stored for `resolve(as: :rerun)`.
    pub job_class: Option<String>,
    pub queue: Option<String>,
    pub args_json: Option<String>,
    /// Never take a claim over with a mismatched payload (`on_mismatch: :raise`).
    pub refuse_mismatch: bool,
    /// The door's facts about this delivery (delivery id, retry count, enqueued at…):
    /// a JSON object text, kept by a first claim (`first_facts`) and stored with the
    /// operation's repeats (`repeat_facts`).
    pub facts_json: Option<String>,
    /// A copy coming back: it met a live claim before (deferred, `deferrals` > 0) or
    /// decides again after waiting for one. It was counted in `duplicates` (and
    /// `mismatches`) when it first arrived and is not counted again; its return is
    /// still a repeat (`repeat_times`, `repeat_facts`). False for a copy's first
    /// arrival.
    pub returning: bool,
}

/// How a won claim was obtained (the decision table's type).
pub use crate::transitions::ClaimKind;

impl ClaimAnswer {
    /// What the claim statement decided, in the decision table's terms
    /// ([`crate::transitions::next`] takes it): a won claim and how, or what the
    /// delivery met.
    pub fn verdict(&self) -> ClaimVerdict {
        match self {
            ClaimAnswer::Claimed { kind, .. } => ClaimVerdict::Take(*kind),
            ClaimAnswer::Completed { .. } => ClaimVerdict::Met(Met::Completed),
            ClaimAnswer::Held { .. } => ClaimVerdict::Met(Met::Held),
            ClaimAnswer::GivenUp { .. } => ClaimVerdict::Met(Met::GivenUp),
            ClaimAnswer::InProgress { .. } => ClaimVerdict::Met(Met::Live),
            ClaimAnswer::Refused { .. } => ClaimVerdict::Met(Met::Refused),
        }
    }

    /// The outcome's name, as the Ruby layer and `repeat_facts` spell it.
    pub fn name(&self) -> &'static str {
        match self {
            ClaimAnswer::Claimed { kind, .. } => match kind {
                ClaimKind::First => "claimed",
                ClaimKind::Retry => "retry",
                ClaimKind::Takeover => "takeover",
            },
            ClaimAnswer::Completed { .. } => "completed",
            ClaimAnswer::InProgress { .. } => "in_progress",
            ClaimAnswer::Held { .. } => "held",
            ClaimAnswer::GivenUp { .. } => "given_up",
            ClaimAnswer::Refused { .. } => "refused",
        }
    }
}

/// What a delivery should do, decided atomically by the claim statement.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimAnswer {
    /// Run the job. `token` must be presented to every fenced change.
    Claimed {
        token: Uuid,
        /// Claims made on this record, this one included (1 for a first claim).
        attempt: i32,
        kind: ClaimKind,
        /// Stale takeovers of this record, this claim included when it is one (the
        /// record's `takeovers`; 0 when the statement that claimed did not read it).
        takeovers: i32,
    },
    /// The operation already completed: do not run. `duplicates` counts this one.
    /// `replay`: what its completion stored (None when no store was requested).
    Completed {
        duplicates: i32,
        replay: Option<Replay>,
    },
    /// Another delivery holds a live claim: do not run now; try again once
    /// `lease_remaining` seconds have passed (by the database clock).
    InProgress {
        holder_delivery_id: Option<String>,
        attempt: i32,
        lease_remaining: f64,
        duplicates: i32,
    },
    /// Held for a person (`:hold` policy): do not run.
    Held { duplicates: i32 },
    /// Given up (`:skip` policy): do not run.
    GivenUp { duplicates: i32 },
    /// The claim is released or stale, but this delivery's arguments differ from the
    /// claim's and mismatches are refused: do not run.
    Refused { duplicates: i32 },
}

/// The claim's answer: the outcome, and whether this delivery's arguments differed
/// from those of the operation's claim (a payload mismatch).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimReply {
    pub outcome: ClaimAnswer,
    pub mismatch: bool,
}

/// Checks a request before any statement: non-empty key and job type within
/// [`MAX_KEY_BYTES`](crate::config::MAX_KEY_BYTES), a lease in (0, [`MAX_LEASE_SECONDS`]],
/// no NUL character in the job type or the delivery's id, job class or queue (PostgreSQL's `text`
/// refuses one), facts a JSON object with no NUL.
///
/// Errors: [`Error::Config`] naming the job type.
pub fn check_request(req: &ClaimRequest) -> Result<()> {
    check_key(&req.job_type, &req.operation_key)?;
    if !(req.lease_seconds > 0.0 && req.lease_seconds <= MAX_LEASE_SECONDS) {
        return Err(Error::Config(format!(
            "the lease of {} must be a positive number of seconds up to {MAX_LEASE_SECONDS}, got {}",
            req.job_type, req.lease_seconds
        )));
    }
    let texts = [
        ("job type", Some(req.job_type.as_str())),
        ("id", req.delivery_id.as_deref()),
        ("job class", req.job_class.as_deref()),
        ("queue", req.queue.as_deref()),
    ];
    if let Some((field, _)) = texts
        .iter()
        .find(|(_, text)| text.is_some_and(|t| t.contains('\0')))
    {
        return Err(Error::Config(format!(
            "{}: the delivery's {field} holds a NUL character (U+0000), which PostgreSQL's \
             text cannot store; the job {}",
            req.job_type,
            crate::error::NOT_RUN
        )));
    }
    if let Some(facts) = &req.facts_json {
        let parsed = serde_json::from_str(facts);
        let Ok(value @ serde_json::Value::Object(_)) = &parsed else {
            return Err(Error::Config(format!(
                "the delivery facts of {} must be a JSON object text, got {facts:?}",
                req.job_type
            )));
        };
        if holds_nul(value) {
            return Err(Error::Config(format!(
                "{}: the facts hold a NUL character (U+0000), which PostgreSQL's jsonb cannot \
                 store; the job {}",
                req.job_type,
                crate::error::NOT_RUN
            )));
        }
    }
    Ok(())
}

/// Whether a string (or an object's key) inside `value` holds U+0000. Walks without
/// recursion (a parsed value is at most 128 levels deep anyway).
fn holds_nul(value: &serde_json::Value) -> bool {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            serde_json::Value::String(s) if s.contains('\0') => return true,
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return true;
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    false
}

fn check_key(job_type: &str, operation_key: &str) -> Result<()> {
    if job_type.is_empty() {
        return Err(Error::Config("job_type must not be empty".into()));
    }
    if operation_key.is_empty() {
        return Err(Error::Config(format!(
            "the operation key of {job_type} must not be empty"
        )));
    }
    if let Some(problem) = crate::keys::size_problem(job_type.as_bytes(), operation_key.as_bytes())
    {
        return Err(Error::Config(format!(
            "the operation key of {job_type}: {problem}"
        )));
    }
    Ok(())
}

/// The columns [`CLAIM_SQL`](crate::sql::CLAIM_SQL) returns, read by whichever driver ran it (the native
/// pool, or ActiveRecord's connection for `idempotency_transaction: :active_record`).
#[derive(Debug, Clone)]
pub struct ClaimRow {
    pub won: bool,
    pub status: String,
    pub last_claim: String,
    pub attempts: i32,
    pub delivery_id: Option<String>,
    pub duplicates: i32,
    pub mismatch: bool,
    pub lease_remaining: f64,
    /// The record's `takeovers` after the statement (0 when the driver did not read it).
    pub takeovers: i32,
    /// A completed record's stored result (JSON text) and `result_state` (V7).
    pub result: Option<String>,
    pub result_state: Option<String>,
}

/// Turns the row of [`CLAIM_SQL`](crate::sql::CLAIM_SQL) into the delivery's [`ClaimReply`]: the one place
/// that reads a claim's outcome. `token` is the token the caller sent as $3.
pub fn decide(row: ClaimRow, token: Uuid, req: &ClaimRequest) -> Result<ClaimReply> {
    let ClaimRow {
        won,
        status,
        last_claim,
        attempts: attempt,
        delivery_id,
        duplicates,
        mismatch,
        lease_remaining,
        takeovers,
        result,
        result_state,
    } = row;
    let lease_remaining = lease_remaining.max(0.0);
    let outcome = if won {
        let kind = match last_claim.as_str() {
            "takeover" => ClaimKind::Takeover,
            "retry" => ClaimKind::Retry,
            _ => ClaimKind::First,
        };
        ClaimAnswer::Claimed {
            token,
            attempt,
            kind,
            takeovers,
        }
    } else {
        match status.as_str() {
            "completed" => ClaimAnswer::Completed {
                duplicates,
                replay: Replay::from_columns(result, result_state.as_deref())?,
            },
            "held" => ClaimAnswer::Held { duplicates },
            "given_up" => ClaimAnswer::GivenUp { duplicates },
            "claimed" if lease_remaining > 0.0 => ClaimAnswer::InProgress {
                holder_delivery_id: delivery_id,
                attempt,
                lease_remaining,
                duplicates,
            },
            "claimed" | "released" => ClaimAnswer::Refused { duplicates },
            other => {
                return Err(Error::Database {
                    message: format!(
                        "idempotency record {}/{} has status {other:?}, which this version of \
                         idempotent_job does not know (apply the latest migrations and upgrade \
                         idempotent_job)",
                        req.job_type, req.operation_key
                    ),
                    sqlstate: "XX000".into(),
                })
            }
        }
    };
    Ok(ClaimReply { outcome, mismatch })
}

/// What became of the result a completion was asked to store (`result_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultState {
    /// Stored in `result`: a repeat replays it.
    Stored,
    /// Larger than `max_result_bytes`: not stored.
    TooLarge,
    /// Not JSON (or JSON that jsonb cannot hold, such as `\u0000`): not stored.
    Unencodable,
}

impl ResultState {
    /// The name stored in `result_state`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultState::Stored => "stored",
            ResultState::TooLarge => "too_large",
            ResultState::Unencodable => "unencodable",
        }
    }

    /// The state named `name` in `result_state`.
    ///
    /// Errors: [`Error::Database`] for a name this version does not know.
    pub fn parse(name: &str) -> Result<ResultState> {
        match name {
            "stored" => Ok(ResultState::Stored),
            "too_large" => Ok(ResultState::TooLarge),
            "unencodable" => Ok(ResultState::Unencodable),
            other => Err(Error::Database {
                message: format!(
                    "an idempotency record has result_state {other:?}, which this version of \
                     idempotent_job does not know (upgrade idempotent_job)"
                ),
                sqlstate: "XX000".into(),
            }),
        }
    }
}

/// What a repeat of a completed operation learns of its first run's result: the
/// stored JSON text (None unless `state` is [`ResultState::Stored`]) and the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub json: Option<String>,
    pub state: ResultState,
}

impl Replay {
    /// The replay of a record's `result` and `result_state` columns; None when its
    /// completion stored nothing (no store requested, or a record from before V7).
    ///
    /// Errors: an unknown `result_state` ([`ResultState::parse`]).
    pub fn from_columns(json: Option<String>, state: Option<&str>) -> Result<Option<Replay>> {
        let Some(state) = state else {
            return Ok(None);
        };
        Ok(Some(Replay {
            json,
            state: ResultState::parse(state)?,
        }))
    }

    /// Whether the first run's value was stored (a repeat gets it).
    pub fn stored(&self) -> bool {
        self.state == ResultState::Stored
    }
}

/// What the body gave a completion to store.
#[derive(Debug, Clone, Copy)]
pub enum ResultInput<'a> {
    /// The body's value as JSON text (the host language encoded it).
    Json(&'a str),
    /// The host language could not encode the value as JSON; the text says why (e.g.
    /// `"a Time at [\"at\"] is not a JSON value"`).
    Unencodable(&'a str),
}

/// A result ready for the completion statement ([`prepare`]): the JSON text to store
/// (None when it is not stored), its `result_state`, and, when it is not stored, the
/// warning to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedResult {
    pub json: Option<String>,
    pub state: ResultState,
    pub warning: Option<String>,
}

/// Checks a body's result for storing with the completion: JSON that jsonb holds, at
/// most `max_bytes` bytes. Never fails: a value that cannot be stored is prepared as
/// not stored ([`ResultState::TooLarge`] / [`ResultState::Unencodable`]) with a
/// warning naming the job, the operation and the reason, and the completion goes on.
pub fn prepare(
    max_bytes: usize,
    job_type: &str,
    operation_key: &str,
    input: ResultInput<'_>,
) -> PreparedResult {
    let not_stored = |state: ResultState, why: String| PreparedResult {
        json: None,
        state,
        warning: Some(format!(
            "{job_type} operation {operation_key:?} completed, but its result was not stored: \
             {why}; a repeat gets no value (result_stored? false) and the operation is not run \
             again"
        )),
    };
    match input {
        ResultInput::Unencodable(why) => not_stored(
            ResultState::Unencodable,
            format!("it cannot be encoded as JSON ({why})"),
        ),
        ResultInput::Json(json) if json.len() > max_bytes => not_stored(
            ResultState::TooLarge,
            format!(
                "its JSON is {} bytes, over max_result_bytes ({max_bytes})",
                json.len()
            ),
        ),
        ResultInput::Json(json) => {
            if let Err(e) = serde_json::from_str::<serde_json::Value>(json) {
                return not_stored(
                    ResultState::Unencodable,
                    format!("it is not valid JSON ({e})"),
                );
            }
            if json.contains("\\u0000") {
                return not_stored(
                    ResultState::Unencodable,
                    "its JSON contains the character U+0000, which PostgreSQL's jsonb cannot \
                     hold"
                        .into(),
                );
            }
            PreparedResult {
                json: Some(json.to_string()),
                state: ResultState::Stored,
                warning: None,
            }
        }
    }
}

/// The completion statement's $4 (JSON text) and $5 (`result_state`) for `result`
/// (both NULL when no store was requested).
pub(crate) fn params(result: Option<&PreparedResult>) -> (Option<&str>, Option<&str>) {
    match result {
        Some(r) => (r.json.as_deref(), Some(r.state.as_str())),
        None => (None, None),
    }
}
