//! Waiting for a running claim, and what a completion stores for a replay.
//!
//! **Results** (migration V7). A completion made with `store_result` keeps the body's
//! return value as JSON in the record's `result` column, written by the completion
//! statement itself ([`crate::fenced::Fenced::Complete`]'s $4 and $5: no extra round
//! trip), and says in `result_state` what became of it ([`ResultState`]). A value that
//! cannot be stored (larger than `max_result_bytes`, or not JSON) never undoes the
//! completion: the operation is completed, `result_state` says why nothing was stored,
//! and the caller gets a warning text ([`PreparedResult::warning`]) to log. A repeat of
//! the completed operation reads `result` and `result_state` in its one claim statement
//! and gets them as its [`Replay`]. The types and the check ([`prepare`]) are
//! [`crate::record`]'s, re-exported here.
//!
//! **Waiting.** A caller that meets a live claim may wait for that claim to end
//! ([`wait`]): woken by the `pg_notify` of its completion (or release) on a LISTEN
//! connection of its own when the connections keep session state, by bounded polling
//! with pooled checkouts when they do not (PgBouncer in transaction mode); then it
//! decides again ([`crate::claim::deliver`]): a completed operation replays, a
//! released one may be claimed and run. It never holds a pooled connection while it
//! waits, and never decides to run while a live lease holds.

use std::time::{Duration, Instant};

use tokio_postgres::types::Type;
use tokio_postgres::AsyncMessage;

use crate::claim;
use crate::config::MAX_LEASE_SECONDS;
use crate::conn::{drive, Interrupt};
use crate::error::{Error, Result};
use crate::pool::{with_fresh_conn, Lane};
use crate::record::{check_request, ClaimAnswer, ClaimReply, ClaimRequest};
pub use crate::record::{prepare, PreparedResult, Replay, ResultInput, ResultState};
use crate::sql::{CHANNEL_SQL, WAIT_SQL};
use crate::store::PoolHandle;

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
    /// [`ClaimAnswer::Claimed`] (the holder released, or its lease ran out: the caller runs
    /// the body), [`ClaimAnswer::Completed`] (replay), another duplicate outcome, or
    /// [`ClaimAnswer::InProgress`] when `seconds` passed while the claim stayed live.
    pub decision: ClaimReply,
    /// How it waited: LISTEN or polling.
    pub path: WaitPath,
}

/// Waits up to `seconds` for the live claim on `req`'s operation to end, then decides
/// the delivery again ([`claim::deliver`]) as a copy coming back
/// ([`ClaimRequest::returning`]: the live claim it met counted it already). LISTEN/NOTIFY when the pool's connections
/// keep session state ([`crate::pool::Pool::session_state`]), else polling (see [`wait_by`]).
///
/// Errors: as [`wait_by`].
pub fn wait(
    pool: &PoolHandle,
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

/// The `wait` rule of every binding (`perform_once`'s `wait:`): a finite number of
/// seconds from 0 to [`MAX_LEASE_SECONDS`] (`None`: the value is no number). `shown` is
/// how the message shows the value (the caller's notation), else the number.
///
/// Errors: [`Error::Config`] `"{job}: wait must be a number of seconds from 0 to
/// 315360000, got {shown}"`.
pub fn check_wait(job: &str, seconds: Option<f64>, shown: Option<&str>) -> Result<f64> {
    match seconds {
        Some(s) if (0.0..=MAX_LEASE_SECONDS).contains(&s) => Ok(s),
        _ => {
            let shown = shown.map_or_else(
                || seconds.map_or_else(|| "nothing".to_string(), |s| s.to_string()),
                str::to_string,
            );
            Err(Error::Config(format!(
                "{job}: wait must be a number of seconds from 0 to {MAX_LEASE_SECONDS}, got {shown}"
            )))
        }
    }
}

/// [`wait`] by the path given. [`WaitPath::Listen`] opens one connection outside the
/// pool for the wait (closed when it ends) and falls back to polling when that
/// connection cannot be made or breaks. Each look ([`WAIT_SQL`]) and the final
/// decision check a pooled connection out and give it back at once.
///
/// Errors: [`Error::Config`] for a bad request or `seconds` not in
/// [0, [`MAX_LEASE_SECONDS`]]; [`Error::Interrupted`]; connection/database errors.
pub fn wait_by(
    pool: &PoolHandle,
    interrupt: &Interrupt<'_>,
    req: &ClaimRequest,
    seconds: f64,
    path: WaitPath,
) -> Result<Waited> {
    check_request(req)?;
    check_wait(&req.job_type, Some(seconds), None)?;
    let until = interrupt.bound(Instant::now() + Duration::from_secs_f64(seconds));
    // The delivery met the live claim once (counted then): each decision after the
    // wait is its return.
    let again = ClaimRequest {
        returning: true,
        ..req.clone()
    };
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
            let decision = claim::deliver(pool, interrupt, &again)?;
            // Another waiter (or delivery) claimed first: wait for that claim instead.
            if matches!(decision.outcome, ClaimAnswer::InProgress { .. }) && now < until {
                continue;
            }
            return Ok(Waited { decision, path });
        }
        let row = look.expect("a live claim has a row");
        let lease_remaining: f64 = row.try_get("lease_remaining")?;
        if now >= until {
            let outcome = ClaimAnswer::InProgress {
                holder_delivery_id: row.try_get("jid")?,
                attempt: row.try_get("attempts")?,
                lease_remaining: lease_remaining.max(0.0),
                duplicates: row.try_get("duplicates")?,
            };
            return Ok(Waited {
                decision: ClaimReply {
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
    fn open(
        pool: &crate::pool::Pool,
        interrupt: &Interrupt<'_>,
        req: &ClaimRequest,
    ) -> Result<Listener> {
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
            Some(interrupt.bound(Instant::now() + timeout)),
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
