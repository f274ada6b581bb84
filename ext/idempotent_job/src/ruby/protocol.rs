//! `IdempotentJob::Native::Protocol`: one job type's core protocol (`core::protocol`),
//! its options checked once, told in its door's words; a delivery runs through it in
//! one call (`perform`, see `perform.rs`). Also the Hashes and note Arrays that call
//! answers with:
//!
//! * notes: Array of `[event, details, level, text, attempt]`: the event's name
//!   (Symbol or nil) and its details (Hash with Symbol keys), the log line's level
//!   (`:info`, `:warn`, `:error` or nil) and text (without the gem's prefix), and the
//!   claim's attempt (nil for a delivery's note).

use std::sync::Arc;

use magnus::{
    function, method, prelude::*, value::ReprValue, IntoValue, KwArgs, RArray, RHash, RModule,
    RString, Ruby, Symbol, Value,
};

use super::convert::{claim_request, json_of, parsed_json, Out, RbResult};
use super::errors::to_ruby;
use super::store::NativeStore;
use idempotent_job_core::error::Error;
use idempotent_job_core::protocol::{
    deferral_delay, ClaimInfo, DeliveryRequest, Detail, Direct, DoorWords, JobOptions,
    LookupAnswer, Notes, Outcome, Protocol, Told, COMPLETION_RETRY_DELAYS,
};
use idempotent_job_core::record::ClaimRequest;

/// One job's core protocol, kept told in the words of each door it ran for
/// ([`Told`], see [`NativeProtocol::told`]).
#[magnus::wrap(class = "IdempotentJob::Native::Protocol", free_immediately, size)]
pub struct NativeProtocol(Told);

fn config_error(ruby: &Ruby, message: String) -> magnus::Error {
    to_ruby(ruby, Error::Config(message))
}

/// `IdempotentJob::Claim.new(job_type:, operation_key:, jid:, token:, attempt:, kind:)`.
pub(super) fn claim_object(ruby: &Ruby, info: &ClaimInfo) -> RbResult<Value> {
    let out = Out::new(ruby);
    out.set("job_type", info.job_type.as_str())?
        .set("operation_key", info.operation_key.as_str())?
        .set("jid", info.delivery_id.clone())?
        .set("token", info.token.to_string())?
        .set("attempt", info.attempt)?
        .sym("kind", info.kind.as_str())?;
    let gem: RModule = ruby.class_object().const_get("IdempotentJob")?;
    let class: Value = gem.const_get("Claim")?;
    class.funcall("new", (KwArgs(out.hash),))
}

/// The keywords of `Outcome.new(decision, **)` that `perform` answers: `label` always;
/// `duplicates`, `retry_after`, `lease_remaining`, `holder`, `result_state`, `claim` and
/// `value` only when the delivery has them, `waited` and `replayed` (a completed
/// operation whose completion stored a result) only when true. `ran`: the body's value
/// and the `Claim` it ran under, when it ran; otherwise `value` is the stored result
/// parsed from its JSON and `claim` a `Claim` of the core's (see [`claim_object`]).
pub(super) fn outcome_hash(
    ruby: &Ruby,
    outcome: &Outcome,
    ran: Option<(Value, Option<Value>)>,
) -> RbResult<RHash> {
    // Only the entries the outcome has: a duplicate's Hash keeps 3 entries instead of
    // 10, so Ruby stores it as a small array table (no separate hash table allocated).
    let out = Out::new(ruby);
    out.sym("label", outcome.label())?;
    if let Some(duplicates) = outcome.duplicates {
        out.set("duplicates", duplicates)?;
    }
    if let Some(retry_after) = outcome.retry_after {
        out.set("retry_after", retry_after)?;
    }
    if let Some(lease_remaining) = outcome.lease_remaining {
        out.set("lease_remaining", lease_remaining)?;
    }
    if let Some(holder) = &outcome.holder {
        out.set("holder", holder.as_str())?;
    }
    if let Some((value, claim)) = ran {
        out.set("value", value)?.set("claim", claim)?;
    } else {
        if let Some(json) = &outcome.result_json {
            out.set("value", parsed_json(ruby, Some(json))?)?;
        }
        if let Some(info) = &outcome.claim {
            out.set("claim", claim_object(ruby, info)?)?;
        }
    }
    if outcome.waited {
        out.set("waited", true)?;
    }
    if let Some(state) = outcome.result_state {
        out.sym("result_state", state.as_str())?;
        if outcome.replayed() {
            out.set("replayed", true)?;
        }
    }
    Ok(out.hash)
}

pub(super) fn notes_array(
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

/// A claim request as the Hash [`claim_request`] reads (`Native::Store#wait` takes).
pub(super) fn request_hash(ruby: &Ruby, req: &ClaimRequest) -> RbResult<RHash> {
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

impl NativeProtocol {
    /// `Protocol.new(job_name, settings, defer_margin)`: `settings` a Hash of job options
    /// by the core's table names (Symbol or String keys; the values `JobOptions`
    /// checked: seconds, Symbols of a choice, booleans, nil for unset) with `lookup` the
    /// lookup's label or nil, read by the core's [`JobOptions::from_settings`] (no name
    /// is mapped here); `defer_margin` the configured setting in seconds. Told in the
    /// gem's words; each delivery brings its door's (see [`NativeProtocol::told`]).
    /// Raises ConfigurationError for a bad value, naming the job.
    fn new(ruby: &Ruby, job: String, settings: RHash, defer_margin: f64) -> RbResult<Self> {
        let settings = json_of(settings.as_value())
            .map_err(|what| config_error(ruby, format!("{job}: job options: {what}")))?;
        let base = JobOptions {
            defer_margin_seconds: defer_margin,
            ..JobOptions::default()
        };
        let options =
            JobOptions::from_settings(&job, "", &settings, base).map_err(|e| to_ruby(ruby, e))?;
        let words = DoorWords {
            name_prefix: ":".into(),
            error_namespace: "IdempotentJob::".into(),
            resolve_text: "IdempotentJob.resolve / rake idempotent_job:resolve".into(),
            ..DoorWords::default()
        };
        let protocol = Protocol::new(&job, options, words).map_err(|e| to_ruby(ruby, e))?;
        Ok(NativeProtocol(Told::new(protocol)))
    }

    /// The protocol told in `door`'s words (its `id_label`, `defer_text` and
    /// `crash_text`, read for each delivery; see [`Told::in_words`]).
    pub(super) fn told(&self, door: Value) -> RbResult<Arc<Protocol>> {
        let id_label: String = door.funcall("id_label", ())?;
        let defer_text: String = door.funcall("defer_text", ())?;
        let crash_text: String = door.funcall("crash_text", ())?;
        Ok(self.0.in_words(&id_label, &defer_text, &crash_text))
    }

    pub(super) fn delivery(
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
        // The wait + the core's margin, bounded from this call's start.
        delivery.bound_wait();
        Ok(delivery)
    }

    pub(super) fn direct(ruby: &Ruby, store: &NativeStore) -> RbResult<Direct> {
        let pool = store.0.pool().map_err(|e| to_ruby(ruby, e))?;
        Ok(Direct::new(pool, store.0.config().asynchronous_completion))
    }

    /// A lookup's answer as `Driver#lookup` gives it, `[:answered, value]` or
    /// `[:raised, "Class: message"]`, in the core's terms: a value is parsed by the core
    /// ([`LookupAnswer::parse`]: a Symbol or String named by `LookupAnswer::NAMES`,
    /// anything else invalid, shown by its `inspect`).
    pub(super) fn lookup_answer(ruby: &Ruby, answer: Value) -> RbResult<LookupAnswer> {
        let pair = RArray::from_value(answer)
            .ok_or_else(|| config_error(ruby, "a lookup answer must be a pair".into()))?;
        let (kind, value): (Symbol, Value) = (pair.entry(0)?, pair.entry(1)?);
        if kind.name()? != "answered" {
            return Ok(LookupAnswer::Raised {
                error: String::try_convert(value)?,
            });
        }
        let name = match Symbol::from_value(value) {
            Some(symbol) => Some(symbol.name()?.into_owned()),
            None => RString::from_value(value).and_then(|s| s.to_string().ok()),
        };
        Ok(LookupAnswer::parse(name.as_deref(), || {
            (value.funcall::<_, _, String>("inspect", ())).unwrap_or_else(|_| "?".into())
        }))
    }
}

/// `Native.completion_retry_delays` → Array of Float seconds.
fn completion_retry_delays() -> Vec<f64> {
    COMPLETION_RETRY_DELAYS.to_vec()
}

/// `Native.delivery_count(job, what, text, shown)` → Integer: a count a delivery
/// carries in its payload, given as its decimal `text` (nil: no whole number at all),
/// by the core's rule ([`idempotent_job_core::protocol::delivery_count`]: digits only,
/// 0 to `MAX_DEFERRALS`, the Celery and SQS doors' rule too). Raises the core's
/// `ConfigurationError` naming `job`, `what` and `shown` (the value's `inspect`) otherwise.
fn delivery_count(
    ruby: &Ruby,
    job: String,
    what: String,
    text: Option<String>,
    shown: String,
) -> RbResult<u64> {
    idempotent_job_core::protocol::delivery_count(&job, &what, text.as_deref(), &shown, 0)
        .map_err(|e| to_ruby(ruby, e))
}

pub fn init(ruby: &Ruby, native: RModule) -> RbResult<()> {
    // `Native.deferral_delay(lease_remaining, deferrals, margin)` → Float seconds.
    native.define_module_function("deferral_delay", function!(deferral_delay, 3))?;
    native.define_module_function("delivery_count", function!(delivery_count, 4))?;
    native.define_module_function(
        "completion_retry_delays",
        function!(completion_retry_delays, 0),
    )?;
    let class = native.define_class("Protocol", ruby.class_object())?;
    class.define_singleton_method("new", function!(NativeProtocol::new, 3))?;
    class.define_method("perform", method!(NativeProtocol::perform, 7))?;
    Ok(())
}
