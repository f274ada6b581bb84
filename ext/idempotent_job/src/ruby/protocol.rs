//! `IdempotentJob::Native::Protocol` and `IdempotentJob::Native::Claim`: the core
//! protocol (`core::protocol`) for the Ruby layer (`lib/idempotent_job/protocol.rb`),
//! which only runs user code between the calls (the body, the lookup, event
//! subscribers, the logger). Every call runs with the GVL released and answers
//! `[step, value, notes]`:
//!
//! * `step`: `:run` / `:ask_lookup` (value: a `Native::Claim`), `:skip` /
//!   `:in_progress` / `:wait` (value: an outcome Hash; `:wait`: call `wait` next), `:completed` (value: a completion
//!   Hash), `:error` (value: the exception to raise once the notes are told);
//! * `notes`: Array of `[event, details, level, text, attempt]`: the event's name
//!   (Symbol or nil) and its details (Hash with Symbol keys), the log line's level
//!   (`:info`, `:warn`, `:error` or nil) and text (without the gem's prefix), and the
//!   claim's attempt (nil for a delivery's note).

use std::sync::Mutex;

use magnus::{
    function, method, prelude::*, value::ReprValue, IntoValue, RArray, RHash, RModule, Ruby,
    Symbol, Value,
};

use super::convert::{claim_request, decided, Out, RbResult};
use super::errors::to_ruby;
use super::gvl::without_gvl;
use super::heartbeat::heartbeat_hash;
use super::store::{prepared, NativeStore};
use super::transaction::NativeTransaction;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::fenced::Fenced;
use idempotent_job_core::protocol::{
    deferral_delay, Channel, Claim, ClaimInfo, Completion, DeliveryRequest, Detail, Direct,
    DoorWords, JobOptions, LookupAnswer, Notes, OnMismatch, OnStale, Outcome, Protocol, Step,
    COMPLETION_RETRY_DELAYS, ERROR_TEXT_LIMIT,
};
use idempotent_job_core::record::{self, ClaimRequest};
use idempotent_job_core::results::PreparedResult;
use idempotent_job_core::store::PoolHandle;

#[magnus::wrap(class = "IdempotentJob::Native::Protocol", free_immediately, size)]
pub struct NativeProtocol(Protocol);

/// A claim held by a delivery, between protocol calls. Taken by `complete`,
/// `release`, `keep` and `after_lookup`; a second use raises.
#[magnus::wrap(class = "IdempotentJob::Native::Claim", free_immediately, size)]
pub struct NativeClaim {
    claim: Mutex<Option<Claim>>,
    info: ClaimInfo,
}

fn config_error(ruby: &Ruby, message: String) -> magnus::Error {
    to_ruby(ruby, Error::Config(message))
}

fn fetch<T: magnus::TryConvert>(ruby: &Ruby, hash: RHash, key: &str) -> RbResult<Option<T>> {
    hash.lookup::<_, Option<T>>(ruby.sym_new(key))
}

/// The delivery's fields that notes about a claim name.
fn delivery_of(info: &ClaimInfo) -> DeliveryRequest {
    DeliveryRequest {
        job_type: info.job_type.clone(),
        operation_key: info.operation_key.clone(),
        delivery_id: info.delivery_id.clone(),
        ..DeliveryRequest::default()
    }
}

fn claim_hash(ruby: &Ruby, info: &ClaimInfo) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.set("job_type", info.job_type.as_str())?
        .set("operation_key", info.operation_key.as_str())?
        .set("jid", info.delivery_id.clone())?
        .set("token", info.token.to_string())?
        .set("attempt", info.attempt)?
        .sym("kind", info.kind.as_str())?;
    Ok(out.hash)
}

fn outcome_hash(ruby: &Ruby, outcome: &Outcome) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.sym("decision", outcome.decision.as_str())?
        .set("duplicates", outcome.duplicates)?
        .set("retry_after", outcome.retry_after)?
        .set("lease_remaining", outcome.lease_remaining)?
        .set("holder", outcome.holder.clone())?
        .set("result_json", outcome.result_json.clone())?;
    match outcome.result_state {
        Some(state) => out.sym("result_state", state.as_str())?,
        None => out.set("result_state", ruby.qnil())?,
    };
    let claim: Value = match &outcome.claim {
        Some(info) => claim_hash(ruby, info)?.as_value(),
        None => ruby.qnil().as_value(),
    };
    out.set("claim", claim)?;
    Ok(out.hash)
}

fn completion_hash(ruby: &Ruby, completion: &Completion) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.set("recorded", completion.recorded)?
        .set("attempts", completion.attempts)?
        .set("result_stored", completion.result_stored)?;
    match completion.outcome.result_state {
        Some(state) => out.sym("result_state", state.as_str())?,
        None => out.set("result_state", ruby.qnil())?,
    };
    Ok(out.hash)
}

fn notes_array(
    ruby: &Ruby,
    notes: &Notes,
    delivery: &DeliveryRequest,
    words: &DoorWords,
) -> RbResult<RArray> {
    let out = ruby.ary_new_capa(notes.len());
    for note in notes {
        let event: Value = match note.event() {
            Some(name) => ruby.sym_new(name).as_value(),
            None => ruby.qnil().as_value(),
        };
        let details = ruby.hash_new();
        for (key, detail) in note.details() {
            let value: Value = match detail {
                Detail::Name(n) => ruby.sym_new(n).as_value(),
                Detail::Text(t) => ruby.str_new(&t).as_value(),
                Detail::Float(f) => ruby.float_from_f64(f).as_value(),
                Detail::Int(i) => ruby.integer_from_i64(i).as_value(),
                Detail::Bool(b) => b.into_value_with(ruby),
                Detail::Null => ruby.qnil().as_value(),
            };
            details.aset(ruby.sym_new(key), value)?;
        }
        let level: Value = match note.level() {
            Some(level) => ruby.sym_new(level.as_str()).as_value(),
            None => ruby.qnil().as_value(),
        };
        let entry = ruby.ary_new_capa(5);
        entry.push(event)?;
        entry.push(details)?;
        entry.push(level)?;
        entry.push(note.text(delivery, words))?;
        entry.push(note.attempt)?;
        out.push(entry)?;
    }
    Ok(out)
}

/// `[step, value, notes]` for a step (or the error, as `[:error, exception, notes]`).
fn step_answer(
    ruby: &Ruby,
    step: Result<Step>,
    notes: &Notes,
    delivery: &DeliveryRequest,
    words: &DoorWords,
) -> RbResult<RArray> {
    let (name, value): (&str, Value) = match step {
        Ok(Step::Run(claim)) => ("run", NativeClaim::wrap(claim).into_value_with(ruby)),
        Ok(Step::AskLookup(claim)) => {
            ("ask_lookup", NativeClaim::wrap(claim).into_value_with(ruby))
        }
        Ok(Step::Skip(outcome)) => ("skip", outcome_hash(ruby, &outcome)?.as_value()),
        Ok(Step::InProgress(outcome)) if outcome.wait_seconds.is_some() => {
            ("wait", outcome_hash(ruby, &outcome)?.as_value())
        }
        Ok(Step::InProgress(outcome)) => ("in_progress", outcome_hash(ruby, &outcome)?.as_value()),
        Err(e) => ("error", error_value(ruby, e)?),
    };
    answer(ruby, name, value, notes, delivery, words)
}

fn error_value(ruby: &Ruby, err: Error) -> RbResult<Value> {
    // An interrupt's own exception (Thread#raise, Timeout) is raised at once.
    if matches!(err, Error::Interrupted) {
        return Err(to_ruby(ruby, err));
    }
    Ok(to_ruby(ruby, err)
        .value()
        .unwrap_or_else(|| ruby.qnil().as_value()))
}

/// The exception object of a Ruby error (nil when it is a `throw`/`exit`-like jump,
/// which has none).
fn raised_value(ruby: &Ruby, raised: magnus::Error) -> Value {
    raised.value().unwrap_or_else(|| ruby.qnil().as_value())
}

fn answer(
    ruby: &Ruby,
    name: &str,
    value: Value,
    notes: &Notes,
    delivery: &DeliveryRequest,
    words: &DoorWords,
) -> RbResult<RArray> {
    let out = ruby.ary_new_capa(3);
    out.push(ruby.sym_new(name))?;
    out.push(value)?;
    out.push(notes_array(ruby, notes, delivery, words)?)?;
    Ok(out)
}

/// The error a [`RubyChannel`] call returns when Ruby raised: the Ruby exception
/// itself is kept in the channel and raised instead.
const RAISED_IN_RUBY: &str = "raised in the Ruby session";

/// A [`Channel`] over a Ruby session whose statements go through another driver
/// (`Transactional::ActiveRecord`: ActiveRecord's connection, inside its
/// transaction). Called with the GVL held. The session answers
/// `claim_row(request, lock_timeout)` → `[row, token]` (the claim statement's typed row
/// and the token it sent) and `fenced_raw(change, job_type, operation_key, token,
/// text)`; the decision is made here, by the core ([`decided`]).
struct RubyChannel<'r> {
    ruby: &'r Ruby,
    session: Value,
    raised: Option<magnus::Error>,
}

impl RubyChannel<'_> {
    fn hold(&mut self, err: magnus::Error) -> Error {
        self.raised = Some(err);
        Error::Panic(RAISED_IN_RUBY.into())
    }

    /// The Ruby exception to raise for `err`, when `err` stands for one.
    fn raised_for(&mut self, err: &Error) -> Option<magnus::Error> {
        let held = self.raised.take();
        match err {
            Error::Panic(m) if m == RAISED_IN_RUBY => held,
            _ => None,
        }
    }
}

/// A claim request as the Hash `Native::Store#claim` takes.
fn request_hash(ruby: &Ruby, req: &ClaimRequest) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.set("job_type", req.job_type.as_str())?
        .set("operation_key", req.operation_key.as_str())?
        .set("jid", req.delivery_id.clone())?
        .set("lease", req.lease_seconds)?
        .set("args_digest", req.args_digest.clone())?
        .set("job_class", req.job_class.clone())?
        .set("queue", req.queue.clone())?
        .set("args_json", req.args_json.clone())?
        .set("refuse_mismatch", req.refuse_mismatch)?
        .set("facts_json", req.facts_json.clone())?
        .set("returning", req.returning)?;
    Ok(out.hash)
}

fn fenced_name(change: Fenced) -> &'static str {
    match change {
        Fenced::Complete | Fenced::CompleteAsynchronously => "complete",
        Fenced::Release => "release",
        Fenced::Hold => "hold",
        Fenced::GiveUp => "give_up",
        Fenced::Expire => "expire",
        Fenced::Renew => "renew",
    }
}

impl Channel for RubyChannel<'_> {
    fn claim(
        &mut self,
        _interrupt: &Interrupt<'_>,
        request: &ClaimRequest,
        lock_timeout_seconds: f64,
    ) -> Result<record::ClaimReply> {
        let ruby = self.ruby;
        let asked = (|| -> RbResult<record::ClaimReply> {
            let hash = request_hash(ruby, request)?;
            let pair: RArray = self
                .session
                .funcall("claim_row", (hash, lock_timeout_seconds))?;
            let (row, token): (RHash, String) = (pair.entry(0)?, pair.entry(1)?);
            Ok(decided(ruby, row, &token, hash)?.0)
        })();
        asked.map_err(|e| self.hold(e))
    }

    /// `fenced_raw(change, job_type, operation_key, token, text)`, with `[json, state]`
    /// as a sixth argument when a completion stores a result: the change (and the
    /// result) in one statement on the session's connection.
    fn fenced_with_result(
        &mut self,
        _interrupt: &Interrupt<'_>,
        change: Fenced,
        claim: &ClaimInfo,
        text: Option<&str>,
        result: Option<&PreparedResult>,
    ) -> Result<()> {
        let ruby = self.ruby;
        let (name, job_type, key, token) = (
            ruby.sym_new(fenced_name(change)),
            claim.job_type.as_str(),
            claim.operation_key.as_str(),
            claim.token.to_string(),
        );
        let applied: RbResult<Value> = match result {
            None => self
                .session
                .funcall("fenced_raw", (name, job_type, key, token, text)),
            Some(result) => {
                let pair = ruby.ary_new_capa(2);
                pair.push(result.json.clone())
                    .and_then(|()| pair.push(result.state.as_str()))
                    .and_then(|()| {
                        self.session
                            .funcall("fenced_raw", (name, job_type, key, token, text, pair))
                    })
            }
        };
        applied.map(|_| ()).map_err(|e| self.hold(e))
    }

    fn transactional(&self) -> bool {
        true
    }

    fn heartbeat_pool(&self) -> Option<&PoolHandle> {
        None
    }

    fn pause(&mut self, _interrupt: &Interrupt<'_>, pause: std::time::Duration) -> Result<()> {
        // Never reached: a transactional completion is written once.
        std::thread::sleep(pause);
        Ok(())
    }
}

impl NativeClaim {
    fn wrap(claim: Claim) -> NativeClaim {
        NativeClaim {
            info: claim.info().clone(),
            claim: Mutex::new(Some(claim)),
        }
    }

    fn take(&self, ruby: &Ruby) -> RbResult<Claim> {
        self.claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| {
                config_error(
                    ruby,
                    format!(
                        "the claim of {} operation {:?} was already handed back to the protocol",
                        self.info.job_type, self.info.operation_key
                    ),
                )
            })
    }

    /// `info` → Hash `{job_type:, operation_key:, jid:, token: (String), attempt:,
    /// kind: (:first, :retry, :takeover)}`.
    fn info(ruby: &Ruby, rb_self: &Self) -> RbResult<RHash> {
        claim_hash(ruby, &rb_self.info)
    }

    /// `heartbeat_report` → the Hash of `Native::Heartbeat#report`, or nil without a
    /// heartbeat (off, in a transaction, stopped, or the claim handed back).
    fn heartbeat_report(ruby: &Ruby, rb_self: &Self) -> RbResult<Option<RHash>> {
        let report = rb_self
            .claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(Claim::heartbeat_report);
        report.map(|r| heartbeat_hash(ruby, r)).transpose()
    }

    /// `heartbeat?` → whether the claim's heartbeat renews it now (false: off, in a
    /// transaction, stopped, or the claim handed back). Builds no report.
    fn heartbeat_running(&self) -> bool {
        self.claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|c| c.heartbeat_report().is_some())
    }

    /// `stop_heartbeat(words)` → notes: stops renewing (a body that ended without
    /// reaching complete, release or keep: a killed thread), telling what the heartbeat
    /// found. Idempotent; nothing once the claim was handed back.
    fn stop_heartbeat(ruby: &Ruby, rb_self: &Self, words: RHash) -> RbResult<RArray> {
        let mut notes = Notes::new();
        if let Some(claim) = rb_self
            .claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            claim.stop_heartbeat(&mut notes);
        }
        if notes.is_empty() {
            // The usual stop: nothing to tell, so the words are not read.
            return Ok(ruby.ary_new());
        }
        let words = door_words(ruby, words)?;
        notes_array(ruby, &notes, &delivery_of(&rb_self.info), &words)
    }
}

fn door_words(ruby: &Ruby, words: RHash) -> RbResult<DoorWords> {
    let mut out = DoorWords {
        name_prefix: ":".into(),
        error_namespace: "IdempotentJob::".into(),
        resolve_text: "IdempotentJob.resolve / rake idempotent_job:resolve".into(),
        ..DoorWords::default()
    };
    if let Some(v) = fetch::<String>(ruby, words, "id_label")? {
        out.id_label = v;
    }
    if let Some(v) = fetch::<String>(ruby, words, "defer_text")? {
        out.defer_text = v;
    }
    if let Some(v) = fetch::<String>(ruby, words, "crash_text")? {
        out.crash_text = v;
    }
    Ok(out)
}

impl NativeProtocol {
    /// `Protocol.new(job_name, options, words)`: options Hash `{lease:, on_stale:
    /// (:reclaim, :hold, :skip), on_mismatch: (:log, :raise), lookup: (its label, or
    /// nil), heartbeat:, max_run:, lock_timeout:, defer_margin:, store_result:,
    /// max_takeovers: (Integer or nil)}` (seconds;
    /// an absent one takes the core's default); words Hash
    /// `{id_label:, defer_text:, crash_text:}` (the door's). Raises ConfigurationError
    /// for a bad value, naming the job.
    fn new(ruby: &Ruby, job: String, options: RHash, words: RHash) -> RbResult<Self> {
        let defaults = JobOptions::default();
        let name = |key: &str| -> RbResult<Option<String>> {
            fetch::<Symbol>(ruby, options, key)?
                .map(|s| s.name().map(|n| n.to_string()))
                .transpose()
        };
        let err = |e| to_ruby(ruby, e);
        let options = JobOptions {
            lease_seconds: fetch(ruby, options, "lease")?.unwrap_or(defaults.lease_seconds),
            on_stale: match name("on_stale")? {
                Some(v) => OnStale::parse(&job, &v).map_err(err)?,
                None => defaults.on_stale,
            },
            on_mismatch: match name("on_mismatch")? {
                Some(v) => OnMismatch::parse(&job, &v).map_err(err)?,
                None => defaults.on_mismatch,
            },
            lookup: fetch(ruby, options, "lookup")?,
            heartbeat: fetch(ruby, options, "heartbeat")?.unwrap_or(defaults.heartbeat),
            max_run_seconds: fetch(ruby, options, "max_run")?.unwrap_or(defaults.max_run_seconds),
            lock_timeout_seconds: fetch(ruby, options, "lock_timeout")?
                .unwrap_or(defaults.lock_timeout_seconds),
            defer_margin_seconds: fetch(ruby, options, "defer_margin")?
                .unwrap_or(defaults.defer_margin_seconds),
            store_result: fetch(ruby, options, "store_result")?.unwrap_or(defaults.store_result),
            max_takeovers: fetch(ruby, options, "max_takeovers")?,
        };
        let words = door_words(ruby, words)?;
        Protocol::new(&job, options, words)
            .map(NativeProtocol)
            .map_err(|e| to_ruby(ruby, e))
    }

    fn delivery(
        ruby: &Ruby,
        request: RHash,
        deferrals: u32,
        wait_seconds: Option<f64>,
    ) -> RbResult<DeliveryRequest> {
        let req = claim_request(ruby, request)?;
        let mut delivery = DeliveryRequest {
            job_type: req.job_type,
            operation_key: req.operation_key,
            delivery_id: req.delivery_id,
            job_class: req.job_class,
            queue: req.queue,
            args_json: req.args_json,
            args_digest: req.args_digest,
            facts_json: req.facts_json,
            deferrals,
            wait_seconds,
            wait_until: None,
        };
        // A step at a time: each step (the claim, the wait) is bounded by the wait +
        // the core's margin from its own start (one-call driving will start the bound
        // once per delivery).
        delivery.bound_wait();
        Ok(delivery)
    }

    fn direct(ruby: &Ruby, store: &NativeStore) -> RbResult<Direct> {
        let pool = store.0.pool().map_err(|e| to_ruby(ruby, e))?;
        Ok(Direct::new(pool, store.0.config().asynchronous_completion))
    }

    /// `begin(store, request, deferrals)`: claims on the store's pool (the request
    /// Hash of `Native::Store#claim`; `lease` and `refuse_mismatch` come from the
    /// options) → `[step, value, notes]`.
    fn begin(
        ruby: &Ruby,
        rb_self: &Self,
        store: &NativeStore,
        request: RHash,
        deferrals: u32,
    ) -> RbResult<RArray> {
        Self::begin_waiting(ruby, rb_self, store, request, deferrals, None)
    }

    /// `begin_waiting(store, request, deferrals, wait)`: [`NativeProtocol::begin`] for a
    /// delivery that waits up to `wait` seconds for a live claim to end: a live claim
    /// answers `[:wait, outcome, notes]` (nothing deferred); tell the notes, then call
    /// `wait` with the same arguments.
    fn begin_waiting(
        ruby: &Ruby,
        rb_self: &Self,
        store: &NativeStore,
        request: RHash,
        deferrals: u32,
        wait: Option<f64>,
    ) -> RbResult<RArray> {
        Self::on_pool(
            ruby,
            rb_self,
            store,
            request,
            deferrals,
            wait,
            Protocol::begin,
        )
    }

    /// `wait(store, request, deferrals, wait)` → `[step, value, notes]`: after
    /// `begin_waiting` answered `:wait`, waits (GVL released, no pooled connection
    /// held) for the live claim to end, then decides again (a claim still live is
    /// deferred: `:in_progress`).
    fn wait(
        ruby: &Ruby,
        rb_self: &Self,
        store: &NativeStore,
        request: RHash,
        deferrals: u32,
        wait: f64,
    ) -> RbResult<RArray> {
        Self::on_pool(
            ruby,
            rb_self,
            store,
            request,
            deferrals,
            Some(wait),
            Protocol::wait,
        )
    }

    /// Runs one protocol step that decides a delivery (`begin` or `wait`) on the
    /// store's pool, the GVL released, and answers `[step, value, notes]`.
    fn on_pool(
        ruby: &Ruby,
        rb_self: &Self,
        store: &NativeStore,
        request: RHash,
        deferrals: u32,
        wait: Option<f64>,
        step: fn(
            &Protocol,
            &mut dyn Channel,
            &Interrupt<'_>,
            &DeliveryRequest,
            &mut Notes,
        ) -> Result<Step>,
    ) -> RbResult<RArray> {
        let delivery = Self::delivery(ruby, request, deferrals, wait)?;
        let mut channel = Self::direct(ruby, store)?;
        let mut notes = Notes::new();
        let decided = without_gvl(ruby, |i| {
            step(&rb_self.0, &mut channel, i, &delivery, &mut notes)
        })?;
        step_answer(ruby, decided, &notes, &delivery, rb_self.0.words())
    }

    /// `begin_in(transaction, request, deferrals)`: [`NativeProtocol::begin`] inside
    /// an open `Native::Transaction`.
    fn begin_in(
        ruby: &Ruby,
        rb_self: &Self,
        transaction: &NativeTransaction,
        request: RHash,
        deferrals: u32,
    ) -> RbResult<RArray> {
        let delivery = Self::delivery(ruby, request, deferrals, None)?;
        let mut notes = Notes::new();
        let step = transaction.with_session_raw(ruby, |session, i| {
            rb_self.0.begin(session, i, &delivery, &mut notes)
        })?;
        step_answer(ruby, step, &notes, &delivery, rb_self.0.words())
    }

    /// `begin_with(session, request, deferrals)`: [`NativeProtocol::begin`] over a Ruby
    /// session (the ActiveRecord flavour, see [`RubyChannel`]); an exception the
    /// session raised is answered as `[:error, it, notes]`.
    fn begin_with(
        ruby: &Ruby,
        rb_self: &Self,
        session: Value,
        request: RHash,
        deferrals: u32,
    ) -> RbResult<RArray> {
        let delivery = Self::delivery(ruby, request, deferrals, None)?;
        let mut channel = RubyChannel {
            ruby,
            session,
            raised: None,
        };
        let mut notes = Notes::new();
        let step = rb_self
            .0
            .begin(&mut channel, &Interrupt::none(), &delivery, &mut notes);
        if let Err(e) = &step {
            if let Some(raised) = channel.raised_for(e) {
                return answer(
                    ruby,
                    "error",
                    raised_value(ruby, raised),
                    &notes,
                    &delivery,
                    rb_self.0.words(),
                );
            }
        }
        step_answer(ruby, step, &notes, &delivery, rb_self.0.words())
    }

    /// `after_lookup_with(session, claim, answer)`: over a Ruby session.
    fn after_lookup_with(
        ruby: &Ruby,
        rb_self: &Self,
        session: Value,
        claim: &NativeClaim,
        answer_value: Value,
    ) -> RbResult<RArray> {
        let answer_given = Self::lookup_answer(ruby, answer_value)?;
        let taken = claim.take(ruby)?;
        let mut channel = RubyChannel {
            ruby,
            session,
            raised: None,
        };
        let mut notes = Notes::new();
        let step = rb_self.0.after_lookup(
            &mut channel,
            &Interrupt::none(),
            taken,
            answer_given,
            &mut notes,
        );
        let delivery = delivery_of(&claim.info);
        if let Err(e) = &step {
            if let Some(raised) = channel.raised_for(e) {
                return answer(
                    ruby,
                    "error",
                    raised_value(ruby, raised),
                    &notes,
                    &delivery,
                    rb_self.0.words(),
                );
            }
        }
        step_answer(ruby, step, &notes, &delivery, rb_self.0.words())
    }

    /// `complete_with(session, claim, result)`: the completion over a Ruby session
    /// (written once); `result` as for [`NativeProtocol::complete`].
    fn complete_with(
        ruby: &Ruby,
        rb_self: &Self,
        session: Value,
        claim: &NativeClaim,
        result: Option<RArray>,
    ) -> RbResult<RArray> {
        Self::complete_by(ruby, rb_self, claim, result, |taken, result, notes| {
            let mut channel = RubyChannel {
                ruby,
                session,
                raised: None,
            };
            let done =
                rb_self
                    .0
                    .complete_prepared(&mut channel, &Interrupt::none(), taken, result, notes);
            let raised = done.as_ref().err().and_then(|e| channel.raised_for(e));
            Ok((done, raised))
        })
    }

    fn lookup_answer(ruby: &Ruby, answer: Value) -> RbResult<LookupAnswer> {
        if let Some(symbol) = Symbol::from_value(answer) {
            return match symbol.name()?.as_ref() {
                "done" => Ok(LookupAnswer::Done),
                "not_done" => Ok(LookupAnswer::NotDone),
                "unknown" => Ok(LookupAnswer::Unknown),
                other => Ok(LookupAnswer::Invalid {
                    answer: format!(":{other}"),
                }),
            };
        }
        let pair = RArray::from_value(answer).ok_or_else(|| {
            config_error(ruby, "a lookup answer must be a Symbol or a pair".into())
        })?;
        let (kind, text): (Symbol, String) = (pair.entry(0)?, pair.entry(1)?);
        match kind.name()?.as_ref() {
            "invalid" => Ok(LookupAnswer::Invalid { answer: text }),
            _ => Ok(LookupAnswer::Raised { error: text }),
        }
    }

    /// `after_lookup(store, claim, answer)`: answer is `:done`, `:not_done`,
    /// `:unknown`, `[:invalid, "its inspect"]` or `[:raised, "Class: message"]` →
    /// `[step, value, notes]`.
    fn after_lookup(
        ruby: &Ruby,
        rb_self: &Self,
        store: &NativeStore,
        claim: &NativeClaim,
        answer: Value,
    ) -> RbResult<RArray> {
        let answer = Self::lookup_answer(ruby, answer)?;
        let taken = claim.take(ruby)?;
        let mut channel = Self::direct(ruby, store)?;
        let mut notes = Notes::new();
        let step = without_gvl(ruby, |i| {
            rb_self
                .0
                .after_lookup(&mut channel, i, taken, answer, &mut notes)
        })?;
        step_answer(
            ruby,
            step,
            &notes,
            &delivery_of(&claim.info),
            rb_self.0.words(),
        )
    }

    /// `after_lookup_in(transaction, claim, answer)`: inside a native transaction.
    fn after_lookup_in(
        ruby: &Ruby,
        rb_self: &Self,
        transaction: &NativeTransaction,
        claim: &NativeClaim,
        answer: Value,
    ) -> RbResult<RArray> {
        let answer = Self::lookup_answer(ruby, answer)?;
        let taken = claim.take(ruby)?;
        let mut notes = Notes::new();
        let step = transaction.with_session_raw(ruby, |session, i| {
            rb_self
                .0
                .after_lookup(session, i, taken, answer, &mut notes)
        })?;
        step_answer(
            ruby,
            step,
            &notes,
            &delivery_of(&claim.info),
            rb_self.0.words(),
        )
    }

    /// The completion of `claim` with its `result` (as `Native::Store#prepare_result`
    /// returned it, or nil), sent by `send` the channel's way (the pool without the GVL,
    /// a native transaction, a Ruby session), and its answer: `[:completed, {…}, notes]`
    /// or `[:error, exception, notes]`. `send` returns the completion and, over a Ruby
    /// session, the exception Ruby raised in its statement (answered as it is).
    fn complete_by(
        ruby: &Ruby,
        rb_self: &Self,
        claim: &NativeClaim,
        result: Option<RArray>,
        send: impl FnOnce(
            Claim,
            Option<PreparedResult>,
            &mut Notes,
        ) -> RbResult<(Result<Completion>, Option<magnus::Error>)>,
    ) -> RbResult<RArray> {
        let result = Self::result(ruby, result)?;
        let taken = claim.take(ruby)?;
        let mut notes = Notes::new();
        let (done, raised) = send(taken, result, &mut notes)?;
        let (name, value) = match (done, raised) {
            (Ok(completion), _) => ("completed", completion_hash(ruby, &completion)?.as_value()),
            (Err(_), Some(raised)) => ("error", raised_value(ruby, raised)),
            (Err(e), None) => ("error", error_value(ruby, e)?),
        };
        answer(
            ruby,
            name,
            value,
            &notes,
            &delivery_of(&claim.info),
            rb_self.0.words(),
        )
    }

    /// The body's result as `Native::Store#prepare_result` returned it (`[json_or_nil,
    /// state, warning_or_nil]`), or nil (no store requested).
    fn result(ruby: &Ruby, result: Option<RArray>) -> RbResult<Option<PreparedResult>> {
        result.map(|r| prepared(ruby, r)).transpose()
    }

    /// `complete(store, claim, result)` → `[:completed, {recorded:, attempts:,
    /// result_stored:, result_state:}, notes]` or `[:error, exception, notes]` (a lost
    /// claim). `result`: the body's value as `Native::Store#prepare_result` returned it
    /// (stored by the completion statement itself), or nil without `store_result`.
    fn complete(
        ruby: &Ruby,
        rb_self: &Self,
        store: &NativeStore,
        claim: &NativeClaim,
        result: Option<RArray>,
    ) -> RbResult<RArray> {
        Self::complete_by(ruby, rb_self, claim, result, |taken, result, notes| {
            let mut channel = Self::direct(ruby, store)?;
            let done = without_gvl(ruby, |i| {
                rb_self
                    .0
                    .complete_prepared(&mut channel, i, taken, result, notes)
            })?;
            Ok((done, None))
        })
    }

    /// `complete_in(transaction, claim, result)`: the completion inside a native
    /// transaction (written once); `result` as for [`NativeProtocol::complete`].
    fn complete_in(
        ruby: &Ruby,
        rb_self: &Self,
        transaction: &NativeTransaction,
        claim: &NativeClaim,
        result: Option<RArray>,
    ) -> RbResult<RArray> {
        Self::complete_by(ruby, rb_self, claim, result, |taken, result, notes| {
            let done = transaction.with_session_raw(ruby, |session, i| {
                rb_self
                    .0
                    .complete_prepared(session, i, taken, result, notes)
            })?;
            Ok((done, None))
        })
    }

    /// `release(store, claim, error_class, message)` → notes. Never raises for the
    /// database: a release that fails is told in the notes.
    fn release(
        ruby: &Ruby,
        rb_self: &Self,
        store: &NativeStore,
        claim: &NativeClaim,
        error_class: String,
        message: String,
    ) -> RbResult<RArray> {
        let taken = claim.take(ruby)?;
        let mut channel = Self::direct(ruby, store)?;
        let mut notes = Notes::new();
        without_gvl(ruby, |i| {
            rb_self
                .0
                .release(&mut channel, i, taken, &error_class, &message, &mut notes)
        })?;
        notes_array(ruby, &notes, &delivery_of(&claim.info), rb_self.0.words())
    }

    /// `keep(claim)` → notes: a crash; the claim stays until its lease ends.
    fn keep(ruby: &Ruby, rb_self: &Self, claim: &NativeClaim) -> RbResult<RArray> {
        let taken = claim.take(ruby)?;
        let mut notes = Notes::new();
        rb_self.0.keep(taken, &mut notes);
        notes_array(ruby, &notes, &delivery_of(&claim.info), rb_self.0.words())
    }
}

/// `Native.deferral_delay(lease_remaining, deferrals, margin)` → Float seconds.
fn native_deferral_delay(lease_remaining: f64, deferrals: u32, margin: f64) -> f64 {
    deferral_delay(lease_remaining, deferrals, margin)
}

/// `Native.error_text_limit` → the longest error text stored in `last_error`, in
/// characters.
fn error_text_limit() -> usize {
    ERROR_TEXT_LIMIT
}

/// `Native.completion_retry_delays` → Array of Float seconds.
fn completion_retry_delays() -> Vec<f64> {
    COMPLETION_RETRY_DELAYS.to_vec()
}

pub fn init(ruby: &Ruby, native: RModule) -> RbResult<()> {
    native.define_module_function("deferral_delay", function!(native_deferral_delay, 3))?;
    native.define_module_function("error_text_limit", function!(error_text_limit, 0))?;
    native.define_module_function(
        "completion_retry_delays",
        function!(completion_retry_delays, 0),
    )?;
    let class = native.define_class("Protocol", ruby.class_object())?;
    class.define_singleton_method("new", function!(NativeProtocol::new, 3))?;
    class.define_method("begin", method!(NativeProtocol::begin, 3))?;
    class.define_method("begin_waiting", method!(NativeProtocol::begin_waiting, 4))?;
    class.define_method("wait", method!(NativeProtocol::wait, 4))?;
    class.define_method("begin_in", method!(NativeProtocol::begin_in, 3))?;
    class.define_method("after_lookup", method!(NativeProtocol::after_lookup, 3))?;
    class.define_method(
        "after_lookup_in",
        method!(NativeProtocol::after_lookup_in, 3),
    )?;
    class.define_method("begin_with", method!(NativeProtocol::begin_with, 3))?;
    class.define_method(
        "after_lookup_with",
        method!(NativeProtocol::after_lookup_with, 3),
    )?;
    class.define_method("complete_with", method!(NativeProtocol::complete_with, 3))?;
    class.define_method("complete", method!(NativeProtocol::complete, 3))?;
    class.define_method("complete_in", method!(NativeProtocol::complete_in, 3))?;
    class.define_method("release", method!(NativeProtocol::release, 4))?;
    class.define_method("keep", method!(NativeProtocol::keep, 1))?;
    let claim = native.define_class("Claim", ruby.class_object())?;
    claim.define_method("info", method!(NativeClaim::info, 0))?;
    claim.define_method(
        "heartbeat_report",
        method!(NativeClaim::heartbeat_report, 0),
    )?;
    claim.define_method("heartbeat?", method!(NativeClaim::heartbeat_running, 0))?;
    claim.define_method("stop_heartbeat", method!(NativeClaim::stop_heartbeat, 1))?;
    Ok(())
}
