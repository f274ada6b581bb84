//! Stored results and replays (migration V7), and waiting for a running claim.
//!
//! **Results.** A completion made with `store_result` keeps the body's return value
//! as JSON in the record's `result` column, written by the completion statement itself
//! ([`super::claim::Fenced::Complete`]'s $4 and $5: no extra round trip), and says in
//! `result_state` what became of it ([`ResultState`]). A value that cannot be stored
//! (larger than `max_result_bytes`, or not JSON) never undoes the completion: the
//! operation is completed, `result_state` says why nothing was stored, and the caller
//! gets a warning text ([`PreparedResult::warning`]) to log. A repeat of the completed
//! operation reads `result` and `result_state` in its one claim statement and gets
//! them as its [`Replay`].
//!
//! **Waiting.** A caller that meets a live claim may wait for that claim to end
//! ([`wait`]): woken by the `pg_notify` of its completion (or release) on a LISTEN
//! connection of its own when the connections keep session state, by bounded polling
//! with pooled checkouts when they do not (PgBouncer in transaction mode); then it
//! decides again ([`super::claim::deliver`]): a completed operation replays, a
//! released one may be claimed and run. It never holds a pooled connection while it
//! waits, and never decides to run while a live lease holds.

use std::time::{Duration, Instant};

use tokio_postgres::types::Type;
use tokio_postgres::AsyncMessage;

use super::claim::{self, check_request, ClaimRequest, Decision, Outcome, MAX_LEASE_SECONDS};
use super::error::{Error, Result};
use super::retry::with_fresh_conn;
use super::store::{drive, Interrupt, Lane, Pool};

/// Default of `max_result_bytes` ([`crate::config::Config::max_result_bytes`]): 64 KiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 65_536;

/// Largest `max_result_bytes` accepted: just under jsonb's limit (256 MiB).
pub const MAX_RESULT_BYTES_LIMIT: usize = 268_435_455;

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
                     idempotent_job does not know (run the latest gem)"
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

/// The record's LISTEN channel name ([`notify_channel!`]). Parameters: $1 job_type,
/// $2 operation_key.
pub const CHANNEL_SQL: &str = concat!(
    "SELECT ",
    notify_channel!(),
    " FROM (SELECT $1::text AS job_type, $2::text AS operation_key) AS k"
);

/// A waiter's look at the record: whether a live claim still holds it, and (for an
/// answer when the wait ends) the holder's delivery id, attempt, duplicate count and
/// remaining lease. Reads only. Parameters: $1 job_type, $2 operation_key.
pub const WAIT_SQL: &str = r#"
SELECT status = 'claimed' AND lease_expires_at > now() AS live, jid, attempts, duplicates,
       EXTRACT(EPOCH FROM lease_expires_at - now())::float8 AS lease_remaining
  FROM idempotent_job_records
 WHERE job_type = $1 AND operation_key = $2"#;

/// Polling: the first pause between two looks, in seconds; each pause doubles up to
/// [`POLL_MAX_SECONDS`].
pub const POLL_FIRST_SECONDS: f64 = 0.02;
/// Polling: the longest pause between two looks, in seconds.
pub const POLL_MAX_SECONDS: f64 = 0.5;
/// LISTEN: a waiter looks again at least this often, in seconds, even without a
/// notification (a completion that stored no result notifies nobody).
pub const LISTEN_RECHECK_SECONDS: f64 = 1.0;

/// How a waiter learns that the claim it waits for ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPath {
    /// A LISTEN connection of its own, woken by the completion's `pg_notify`.
    Listen,
    /// Bounded polling with pooled checkouts (PgBouncer in transaction mode).
    Poll,
}

impl WaitPath {
    /// `"listen"` or `"poll"`.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitPath::Listen => "listen",
            WaitPath::Poll => "poll",
        }
    }
}

/// [`wait`]'s answer: the delivery's decision once the wait ended, and how it waited.
#[derive(Debug, Clone, PartialEq)]
pub struct Waited {
    /// [`Outcome::Claimed`] (the holder released, or its lease ran out: the caller runs
    /// the body), [`Outcome::Completed`] (replay), another duplicate outcome, or
    /// [`Outcome::InProgress`] when `seconds` passed while the claim stayed live.
    pub decision: Decision,
    pub path: WaitPath,
}

/// Waits up to `seconds` for the live claim on `req`'s operation to end, then decides
/// the delivery again ([`claim::deliver`]). LISTEN/NOTIFY when the pool's connections
/// keep session state ([`Pool::session_state`]), else polling (see [`wait_by`]).
///
/// Errors: as [`wait_by`].
pub fn wait(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    req: &ClaimRequest,
    seconds: f64,
) -> Result<Waited> {
    let path = if pool.session_state() {
        WaitPath::Listen
    } else {
        WaitPath::Poll
    };
    wait_by(pool, interrupt, req, seconds, path)
}

/// [`wait`] by the path given. [`WaitPath::Listen`] opens one connection outside the
/// pool for the wait (closed when it ends) and falls back to polling when that
/// connection cannot be made or breaks. Each look ([`WAIT_SQL`]) and the final
/// decision check a pooled connection out and give it back at once.
///
/// Errors: [`Error::Config`] for a bad request or `seconds` not in
/// [0, [`MAX_LEASE_SECONDS`]]; [`Error::Interrupted`]; connection/database errors.
pub fn wait_by(
    pool: &Pool,
    interrupt: &Interrupt<'_>,
    req: &ClaimRequest,
    seconds: f64,
    path: WaitPath,
) -> Result<Waited> {
    check_request(req)?;
    if !(0.0..=MAX_LEASE_SECONDS).contains(&seconds) {
        return Err(Error::Config(format!(
            "{}: wait must be a number of seconds from 0 to {MAX_LEASE_SECONDS}, got {seconds}",
            req.job_type
        )));
    }
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut listener = match path {
        WaitPath::Listen => match Listener::open(pool, interrupt, req) {
            Ok(listener) => Some(listener),
            Err(Error::Interrupted) => return Err(Error::Interrupted),
            Err(_) => None, // polling instead
        },
        WaitPath::Poll => None,
    };
    let path = if listener.is_some() {
        WaitPath::Listen
    } else {
        WaitPath::Poll
    };
    let mut pause = POLL_FIRST_SECONDS;
    loop {
        let look = with_fresh_conn(pool, interrupt, Lane::Main, async |c| {
            let rows = c
                .query_typed(
                    WAIT_SQL,
                    &[
                        (&req.job_type, Type::TEXT),
                        (&req.operation_key, Type::TEXT),
                    ],
                )
                .await?;
            Ok(rows.into_iter().next())
        })?;
        let live = match &look {
            Some(row) => row.try_get::<_, bool>("live")?,
            None => false,
        };
        let now = Instant::now();
        if !live {
            let decision = claim::deliver(pool, interrupt, req)?;
            // Another waiter (or delivery) claimed first: wait for that claim instead.
            if matches!(decision.outcome, Outcome::InProgress { .. }) && now < until {
                continue;
            }
            return Ok(Waited { decision, path });
        }
        let row = look.expect("a live claim has a row");
        let lease_remaining: f64 = row.try_get("lease_remaining")?;
        if now >= until {
            let outcome = Outcome::InProgress {
                holder_jid: row.try_get("jid")?,
                attempt: row.try_get("attempts")?,
                lease_remaining: lease_remaining.max(0.0),
                duplicates: row.try_get("duplicates")?,
            };
            return Ok(Waited {
                decision: Decision {
                    outcome,
                    mismatch: false,
                },
                path,
            });
        }
        // Look again once the lease has run out (the holder may have died), at the
        // wait's end, and (listening) at least every LISTEN_RECHECK_SECONDS.
        let lease_end = now + Duration::from_secs_f64(lease_remaining.max(0.0) + 0.01);
        let wake = until.min(lease_end);
        match listener.as_mut() {
            Some(l) => {
                let recheck = now + Duration::from_secs_f64(LISTEN_RECHECK_SECONDS);
                if !l.next(interrupt, wake.min(recheck))? {
                    listener = None; // the LISTEN connection broke: poll from now on
                }
            }
            None => {
                let step = Duration::from_secs_f64(pause).min(wake.saturating_duration_since(now));
                pool.pause(interrupt, step)?;
                pause = (pause * 2.0).min(POLL_MAX_SECONDS);
            }
        }
    }
}

/// A connection of its own that LISTENs on one record's channel ([`CHANNEL_SQL`]).
struct Listener {
    /// Its own current-thread runtime: the connection's task runs while [`Listener::next`]
    /// blocks on it.
    runtime: Option<tokio::runtime::Runtime>,
    _client: tokio_postgres::Client,
    woken: tokio::sync::mpsc::UnboundedReceiver<()>,
}

impl Listener {
    /// Connects (within the pool's connect timeout) and LISTENs on `req`'s channel.
    fn open(pool: &Pool, interrupt: &Interrupt<'_>, req: &ClaimRequest) -> Result<Listener> {
        let (config, tls, timeout) = pool.dedicated();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::connection(format!("cannot start a LISTEN runtime: {e}")))?;
        let (tx, woken) = tokio::sync::mpsc::unbounded_channel();
        let opened = drive(
            &runtime,
            interrupt,
            None,
            Some(Instant::now() + timeout),
            async {
                let (client, mut connection) = config.connect(tls).await?;
                tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(_))) => {
                                if tx.send(()).is_err() {
                                    break;
                                }
                            }
                            Some(Ok(_)) => {}
                            _ => break, // closed: dropping tx tells the waiter
                        }
                    }
                });
                let row = client
                    .query_typed(
                        CHANNEL_SQL,
                        &[
                            (&req.job_type, Type::TEXT),
                            (&req.operation_key, Type::TEXT),
                        ],
                    )
                    .await?;
                let channel: String = row
                    .first()
                    .ok_or_else(|| Error::connection("no channel name"))?
                    .try_get(0)?;
                // The name is `idempotent_job_` and hex digits: a plain identifier.
                client
                    .batch_execute(&format!("LISTEN \"{channel}\""))
                    .await?;
                Ok::<_, Error>(client)
            },
        );
        let client = match opened {
            Ok(client) => client?,
            Err(e) => {
                runtime.shutdown_background();
                return Err(e);
            }
        };
        Ok(Listener {
            runtime: Some(runtime),
            _client: client,
            woken,
        })
    }

    /// Blocks until a notification arrives or `until` passes. Returns false when the
    /// connection closed (nothing more will arrive).
    ///
    /// Errors: [`Error::Interrupted`].
    fn next(&mut self, interrupt: &Interrupt<'_>, until: Instant) -> Result<bool> {
        let runtime = self.runtime.as_ref().expect("runtime present until drop");
        let got = drive(runtime, interrupt, None, Some(until), self.woken.recv());
        match got {
            Ok(Some(())) => {
                while self.woken.try_recv().is_ok() {}
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(Error::Timeout { message, .. }) if message.is_empty() => Ok(true),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
