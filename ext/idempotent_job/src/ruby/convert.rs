//! Conversions between Ruby values and the core's types, shared by the classes of
//! `IdempotentJob::Native` (`store.rs`, `transaction.rs`) and its module functions.

use chrono::{DateTime, Utc};
use magnus::value::LazyId;
use magnus::{prelude::*, Float, Integer, IntoValue, RArray, RHash, RString, Ruby, Symbol, Value};
use uuid::Uuid;

use super::errors::to_ruby;
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::fenced::Fenced;
use idempotent_job_core::record::{
    self, ClaimAnswer, ClaimReply, ClaimRequest, ClaimRow, Field, Record,
};

/// Results of the binding's functions: a Ruby exception as the error.
pub type RbResult<T> = std::result::Result<T, magnus::Error>;

pub fn parse_token(token: &str) -> Result<Uuid> {
    Uuid::parse_str(token).map_err(|_| Error::Config(format!("{token:?} is not a claim token")))
}

/// The Symbols of the claim request's and the decision's keys, interned once (not
/// looked up by name at every claim).
mod keys {
    use magnus::value::LazyId;

    macro_rules! ids {
        ($($id:ident),* $(,)?) => {
            $(#[allow(non_upper_case_globals)]
            pub static $id: LazyId = LazyId::new(stringify!($id));)*
        };
    }

    ids!(
        job_type,
        operation_key,
        jid,
        lease,
        args_digest,
        job_class,
        queue,
        args_json,
        refuse_mismatch,
        facts_json,
        returning,
        mismatch,
        decision,
        token,
        attempt,
        kind,
        holder_jid,
        lease_remaining,
        duplicates,
        result_json,
        result_state,
    );
}

/// A Hash with Symbol keys, filled by `set`.
pub struct Out<'r> {
    ruby: &'r Ruby,
    pub hash: RHash,
}

impl<'r> Out<'r> {
    pub fn new(ruby: &'r Ruby) -> Self {
        Out {
            ruby,
            hash: ruby.hash_new(),
        }
    }
    pub fn set<T: IntoValue>(&self, key: &str, value: T) -> RbResult<&Self> {
        self.hash.aset(self.ruby.sym_new(key), value)?;
        Ok(self)
    }
    pub fn sym(&self, key: &str, value: &str) -> RbResult<&Self> {
        self.set(key, self.ruby.sym_new(value))
    }
    /// `set` with a key interned once.
    fn put<T: IntoValue>(&self, key: &LazyId, value: T) -> RbResult<&Self> {
        self.hash
            .aset(LazyId::get_inner_with(key, self.ruby), value)?;
        Ok(self)
    }
    pub fn time(&self, key: &str, t: Option<DateTime<Utc>>) -> RbResult<&Self> {
        let value: Value = match t {
            None => self.ruby.qnil().as_value(),
            Some(t) => self
                .ruby
                .time_new(t.timestamp(), i64::from(t.timestamp_subsec_micros()))?
                .as_value(),
        };
        self.set(key, value)
    }
}

/// A claim request from a Hash with Symbol keys `job_type`, `operation_key`, `jid`,
/// `lease` (seconds), `args_digest`, `job_class`, `queue`, `args_json`,
/// `refuse_mismatch`, `facts_json` (the door's delivery facts: a JSON object text),
/// `returning` (a copy coming back: not counted again in `duplicates`; default false).
pub fn claim_request(ruby: &Ruby, request: RHash) -> RbResult<ClaimRequest> {
    let id = |key: &LazyId| LazyId::get_inner_with(key, ruby);
    let get = |key: &LazyId| request.lookup::<_, Option<String>>(id(key));
    let job_type = get(&keys::job_type)?.unwrap_or_default();
    // The delivery's own texts: one that is not UTF-8 is the job's error, named.
    let text = |key: &LazyId, field: &str| {
        get(key).map_err(|e| {
            if !e.is_kind_of(ruby.exception_encoding_error()) {
                return e;
            }
            to_ruby(
                ruby,
                Error::Config(format!(
                    "{job_type}: the delivery's {field} is not valid UTF-8 ({e}); the job {}",
                    idempotent_job_core::error::NOT_RUN
                )),
            )
        })
    };
    Ok(ClaimRequest {
        operation_key: get(&keys::operation_key)?.unwrap_or_default(),
        delivery_id: text(&keys::jid, "id")?,
        lease_seconds: request
            .lookup::<_, Option<f64>>(id(&keys::lease))?
            .unwrap_or(0.0),
        args_digest: get(&keys::args_digest)?,
        job_class: text(&keys::job_class, "job class")?,
        queue: text(&keys::queue, "queue")?,
        args_json: get(&keys::args_json)?,
        refuse_mismatch: request
            .lookup::<_, Option<bool>>(id(&keys::refuse_mismatch))?
            .unwrap_or(false),
        facts_json: get(&keys::facts_json)?,
        returning: request
            .lookup::<_, Option<bool>>(id(&keys::returning))?
            .unwrap_or(false),
        job_type,
    })
}

/// `Native.facts_json(facts)` → `[text, nil]`: a delivery's facts Hash as a JSON
/// object text (the claim request's `facts_json`), written here with serde_json (a
/// fifth of what Ruby's `JSON.generate` costs for a Hash with Float timestamps), by the
/// rules of every value crossing the core ([`json_of`]: any Integer, the nesting
/// limit); or `[nil, problem]`: what the facts hold that JSON cannot carry (NaN, a
/// Time, a String that is not UTF-8, nesting past the limit), for the caller to
/// refuse naming the job. The text is stored as `jsonb`.
pub fn facts_json(facts: RHash) -> (Option<String>, Option<String>) {
    match json_of(facts.as_value()) {
        Ok(json) => (Some(json.to_string()), None),
        Err(problem) => (None, Some(problem)),
    }
}

/// `Native.value_json(value)` → `[text, nil]`: any Ruby value as JSON text by the rules
/// of every value crossing the core ([`json_of`]: the core's map-key, integer, float
/// and nesting rules), the text a stored result is (`ResultJson.encode`); or
/// `[nil, problem]`: what the value holds that JSON cannot carry.
pub fn value_json(value: Value) -> (Option<String>, Option<String>) {
    match json_of(value) {
        Ok(json) => (Some(json.to_string()), None),
        Err(problem) => (None, Some(problem)),
    }
}

/// A decision as a Hash: `:decision` (`:claimed`, `:completed`, `:in_progress`,
/// `:held`, `:given_up`, `:refused`), `:mismatch`, and the decision's details; a
/// completed operation's `:result_json` (the stored result's JSON text, or nil) and
/// `:result_state` (`:stored`, `:too_large`, `:unencodable`, or nil when its completion
/// stored nothing).
pub fn decision_hash(ruby: &Ruby, decision: ClaimReply) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.put(&keys::mismatch, decision.mismatch)?;
    let named = |name: &str| ruby.sym_new(name);
    match decision.outcome {
        ClaimAnswer::Claimed {
            token,
            attempt,
            kind,
            ..
        } => {
            out.put(&keys::decision, named("claimed"))?
                .put(&keys::token, token.to_string())?
                .put(&keys::attempt, attempt)?
                .put(&keys::kind, named(kind.as_str()))?;
        }
        ClaimAnswer::InProgress {
            holder_delivery_id,
            attempt,
            lease_remaining,
            duplicates,
        } => {
            out.put(&keys::decision, named("in_progress"))?
                .put(&keys::holder_jid, holder_delivery_id)?
                .put(&keys::attempt, attempt)?
                .put(&keys::lease_remaining, lease_remaining)?
                .put(&keys::duplicates, duplicates)?;
        }
        ClaimAnswer::Completed { duplicates, replay } => {
            out.put(&keys::decision, named("completed"))?
                .put(&keys::duplicates, duplicates)?;
            if let Some(replay) = replay {
                out.put(&keys::result_json, replay.json)?
                    .put(&keys::result_state, named(replay.state.as_str()))?;
            }
        }
        ClaimAnswer::Held { duplicates } => {
            out.put(&keys::decision, named("held"))?
                .put(&keys::duplicates, duplicates)?;
        }
        ClaimAnswer::GivenUp { duplicates } => {
            out.put(&keys::decision, named("given_up"))?
                .put(&keys::duplicates, duplicates)?;
        }
        ClaimAnswer::Refused { duplicates } => {
            out.put(&keys::decision, named("refused"))?
                .put(&keys::duplicates, duplicates)?;
        }
    }
    Ok(out.hash)
}

/// `:complete`, `:complete_asynchronously`, `:release`, `:hold`, `:give_up`, `:expire`,
/// `:renew` → [`Fenced`].
pub fn parse_fenced(ruby: &Ruby, change: Symbol) -> RbResult<Fenced> {
    let name = change.name()?;
    Fenced::named(&name)
        .ok_or_else(|| to_ruby(ruby, Error::Config(format!("unknown claim change :{name}"))))
}

/// `Native.decide(row, token, request)`: the decision for a row of the claim
/// statement run by another driver (ActiveRecord's connection). `row` has Symbol keys
/// `won`, `status`, `last_claim`, `attempts`, `jid`, `duplicates`, `mismatch`,
/// `lease_remaining` with typed values, and `result` / `result_state` (text or nil); `token` is the uuid sent as $3.
pub fn decide(ruby: &Ruby, row: RHash, token: String, request: RHash) -> RbResult<RHash> {
    let (decision, _) = decided(ruby, row, &token, request)?;
    decision_hash(ruby, decision)
}

/// The [`ClaimReply`] for a claim statement's row run by another driver (see [`decide`]),
/// and its request (read from the Hash: [`claim_request`]).
pub fn decided(
    ruby: &Ruby,
    row: RHash,
    token: &str,
    request: RHash,
) -> RbResult<(ClaimReply, ClaimRequest)> {
    let request = claim_request(ruby, request)?;
    Ok((decided_for(ruby, row, token, &request)?, request))
}

/// [`decided`] for a request the caller holds as the core's [`ClaimRequest`] (the
/// ActiveRecord channel's own: not read back from the Hash it gave Ruby).
pub fn decided_for(
    ruby: &Ruby,
    row: RHash,
    token: &str,
    request: &ClaimRequest,
) -> RbResult<ClaimReply> {
    let sym = |key: &str| ruby.sym_new(key);
    let claim_row = ClaimRow {
        won: row.fetch(sym("won"))?,
        status: row.fetch(sym("status"))?,
        last_claim: row.fetch(sym("last_claim"))?,
        attempts: row.fetch(sym("attempts"))?,
        delivery_id: row.lookup(sym("jid"))?,
        duplicates: row.fetch(sym("duplicates"))?,
        mismatch: row.fetch(sym("mismatch"))?,
        lease_remaining: row.fetch(sym("lease_remaining"))?,
        takeovers: row.lookup::<_, Option<i32>>(sym("takeovers"))?.unwrap_or(0),
        result: row.lookup(sym("result"))?,
        result_state: row.lookup(sym("result_state"))?,
    };
    let token = parse_token(token).map_err(|e| to_ruby(ruby, e))?;
    record::check_request(request)
        .and_then(|()| record::decide(claim_row, token, request))
        .map_err(|e| to_ruby(ruby, e))
}

/// `Native.fenced_sql(change)`: the statement of a fenced change, for other drivers.
pub fn fenced_sql(ruby: &Ruby, change: Symbol) -> RbResult<&'static str> {
    Ok(parse_fenced(ruby, change)?.sql())
}

/// A record as a Hash with Symbol keys, one per [`Record::NAMES`] (the core's names for
/// the bindings): status, last_claim and result_state as Symbols, the claim token as a
/// String, times as Time, job_classes as an Array of String, args and result parsed from
/// their JSON text (`JSON.parse`, nested at most the core's
/// [`idempotent_job_core::canonical::MAX_NESTING`]), NULL as nil.
pub fn record_hash(ruby: &Ruby, r: Record) -> RbResult<RHash> {
    let out = Out::new(ruby);
    for (name, field) in r.fields() {
        match field {
            Field::Name(v) => out.sym(name, v)?,
            Field::OptName(v) => match v {
                Some(v) => out.sym(name, v)?,
                None => out.set(name, ruby.qnil())?,
            },
            Field::Text(v) => out.set(name, v.as_str())?,
            Field::OptText(v) => out.set(name, v.as_deref())?,
            Field::Texts(v) => out.set(name, ruby.ary_from_iter(v.iter().map(String::as_str)))?,
            Field::Json(v) => out.set(name, parsed_json(ruby, v.as_deref())?)?,
            Field::Int(v) => out.set(name, *v)?,
            Field::Float(v) => out.set(name, *v)?,
            Field::Bool(v) => out.set(name, *v)?,
            Field::Token(v) => out.set(name, v.to_string())?,
            Field::Time(v) => out.time(name, Some(*v))?,
            Field::OptTime(v) => out.time(name, *v)?,
        };
    }
    Ok(out.hash)
}

/// JSON text as Ruby data (`JSON.parse`, nested at most the core's `MAX_NESTING`); nil
/// for none.
pub(super) fn parsed_json(ruby: &Ruby, text: Option<&str>) -> RbResult<Value> {
    let Some(text) = text else {
        return Ok(ruby.qnil().as_value());
    };
    let json: magnus::RModule = ruby.class_object().const_get("JSON")?;
    let options = ruby.hash_new();
    options.aset(
        ruby.sym_new("max_nesting"),
        idempotent_job_core::canonical::MAX_NESTING,
    )?;
    json.funcall("parse", (text, magnus::KwArgs(options)))
}

/// `Native.record_fields`: the record's field names ([`Record::NAMES`]), as
/// [`record_hash`]'s keys: the members of the Ruby Record.
pub fn record_fields() -> Vec<&'static str> {
    Record::NAMES.to_vec()
}

/// A Ruby value as JSON data for the core (its canonical JSON, digests, key rules):
/// nil, true, false, an Integer of any width (up to the core's
/// [`idempotent_job_core::canonical::MAX_INTEGER_DIGITS`] digits: its decimal text, as
/// Python's int), a finite Float, a String (as UTF-8), a Symbol (its name), an Array,
/// a Hash with String, Symbol or Integer keys (as strings: what `JSON.generate`
/// writes) of such values.
///
/// Errors: what the value holds that JSON cannot carry faithfully ("a Time", "the
/// float NaN …", "a String that is not valid UTF-8 …", Arrays and Hashes nested
/// deeper than the core's [`idempotent_job_core::canonical::MAX_NESTING`]: refused
/// before the conversion recurses further), for the caller to word.
pub fn json_of(value: Value) -> std::result::Result<serde_json::Value, String> {
    Converter::default().json(value, 0)
}

/// A key value as JSON data for the core's key rules: as [`json_of`], but every String
/// (inside Arrays and Hashes too) taken by its bytes, never transcoded (keys are byte
/// for byte), which must be UTF-8.
///
/// Errors: the core's message for bytes that are not UTF-8
/// ([`idempotent_job_core::keys::text_problem`]), else the core's refusal of what the
/// value holds ([`idempotent_job_core::keys::refused`] in `words`).
pub fn key_json_of(
    value: Value,
    words: &idempotent_job_core::keys::Words,
) -> std::result::Result<serde_json::Value, String> {
    let mut converter = Converter {
        key_bytes: true,
        text_problem: None,
    };
    converter.json(value, 0).map_err(|what| {
        converter
            .text_problem
            .take()
            .unwrap_or_else(|| idempotent_job_core::keys::refused(&what, false, words))
    })
}

/// A Ruby value's class name, for messages: read by the VM (`rb_obj_classname`), never
/// by a Ruby method. A method call is where Ruby delivers another thread's interrupt
/// (Thread#raise, Thread#kill, Timeout) to this thread: raised inside a conversion
/// whose failure only becomes a message, it would be lost (see [`inspect`]).
pub(super) fn class_name(value: Value) -> String {
    // SAFETY: the name is copied before any Ruby code runs again.
    unsafe { value.classname() }.into_owned()
}

/// `value.inspect` for a message, or the exception it raised. The exception is never
/// replaced by a stand-in text (as magnus's `Value::inspect` does): `inspect` is a
/// Ruby method call, where Ruby delivers a pending interrupt of this thread
/// (Thread#raise, Thread#kill, Timeout), which must reach the caller, not vanish. A
/// value with no `inspect` (a BasicObject) is shown by the VM (`#<Class:0x…>`).
pub fn inspect(value: Value) -> RbResult<String> {
    use magnus::rb_sys::{protect, AsRawValue, FromRawValue};
    let shown = if value.respond_to("inspect", true)? {
        // SAFETY: `rb_inspect` is called with the GVL; a raise is caught by protect.
        protect(|| unsafe { rb_sys::rb_inspect(value.as_raw()) })?
    } else {
        // SAFETY: `rb_any_to_s` is called with the GVL and calls no Ruby method.
        unsafe { rb_sys::rb_any_to_s(value.as_raw()) }
    };
    // SAFETY: `shown` is a live VALUE, just returned.
    let shown = RString::from_value(unsafe { Value::from_raw(shown) }).ok_or_else(|| {
        magnus::Error::new(
            Ruby::get_with(value).exception_type_error(),
            "inspect did not return a String",
        )
    })?;
    // SAFETY: the text is copied before any Ruby code runs again.
    Ok(shown
        .to_string()
        .unwrap_or_else(|_| unsafe { shown.to_string_lossy() }.into_owned()))
}

/// An Integer as the core's number ([`idempotent_job_core::canonical::integer`]).
fn integer(value: Integer) -> std::result::Result<serde_json::Number, String> {
    if let Ok(i) = value.to_i64() {
        return Ok(i.into());
    }
    if let Ok(u) = value.to_u64() {
        return Ok(u.into());
    }
    // A Bignum's digits from the VM (`rb_big2str`), not by calling `to_s` (see
    // [`class_name`]: an interrupt delivered there would become this message).
    use magnus::rb_sys::{protect, AsRawValue, FromRawValue};
    // SAFETY: called with the GVL; a raise (no memory) is caught by protect; the answer
    // is a live VALUE.
    let digits = protect(|| unsafe { rb_sys::rb_big2str(value.as_raw(), 10) })
        .map_err(|e| format!("an Integer ({e})"))?;
    let text = RString::from_value(unsafe { Value::from_raw(digits) })
        .ok_or_else(|| "an Integer".to_string())?
        .to_string()
        .map_err(|e| format!("an Integer ({e})"))?;
    idempotent_job_core::canonical::integer(&text)
}

/// Converts Ruby values to JSON data ([`json_of`], [`key_json_of`]).
#[derive(Default)]
struct Converter {
    /// Strings by their bytes (keys), not transcoded to UTF-8 (payloads, facts).
    key_bytes: bool,
    /// Why a String's bytes are not UTF-8, in key mode (the core's message).
    text_problem: Option<String>,
}

impl Converter {
    /// A String as UTF-8 text: by its bytes for a key, else transcoded from its
    /// encoding when that is not UTF-8.
    fn text(&mut self, s: RString) -> std::result::Result<String, String> {
        if self.key_bytes {
            // SAFETY: the slice is copied before any Ruby code runs again.
            let bytes = unsafe { s.as_slice() };
            return match std::str::from_utf8(bytes) {
                Ok(text) => Ok(text.to_owned()),
                Err(_) => {
                    let problem = idempotent_job_core::keys::text_problem(bytes)
                        .unwrap_or_else(|| "a String that is not valid UTF-8".into());
                    self.text_problem = Some(problem.clone());
                    Err(problem)
                }
            };
        }
        s.to_string().or_else(|e| {
            // A binary (ASCII-8BIT) String is Ruby's bytes: judged by its bytes, as a key
            // is, so "é".b is the text "é" in a key, a payload, facts and a result alike.
            use magnus::encoding::EncodingCapable;
            if s.enc_get() == Ruby::get_with(s).ascii8bit_encindex() {
                // SAFETY: the slice is copied before any Ruby code runs again.
                if let Ok(text) = std::str::from_utf8(unsafe { s.as_slice() }) {
                    return Ok(text.to_owned());
                }
            }
            Err(format!("a String that is not valid UTF-8 ({e})"))
        })
    }

    /// A Symbol's whole name, taken as a String is ([`Converter::text`]). Read with
    /// `rb_sym2str`: magnus's `Symbol::name` reads a static Symbol as a C string, cut at
    /// its first NUL, so `:"a\0b"` and `:"a\0c"` became the same key or digest `"a"`.
    fn symbol(&mut self, sym: Symbol) -> std::result::Result<String, String> {
        use magnus::rb_sys::{AsRawValue, FromRawValue};
        // SAFETY: called with the GVL; `rb_sym2str` answers the Symbol's frozen name
        // String and calls no Ruby method.
        let name = unsafe { Value::from_raw(rb_sys::rb_sym2str(sym.as_raw())) };
        let name = RString::from_value(name).ok_or_else(|| "a Symbol".to_string())?;
        self.text(name)
    }

    /// A Ruby value as JSON at `depth` levels of arrays and hashes: refused past the
    /// core's [`idempotent_job_core::canonical::MAX_NESTING`], before recursing further.
    fn json(
        &mut self,
        value: Value,
        depth: usize,
    ) -> std::result::Result<serde_json::Value, String> {
        use serde_json::Value as Json;
        let container = RArray::from_value(value).is_some() || RHash::from_value(value).is_some();
        if container && depth >= idempotent_job_core::canonical::MAX_NESTING {
            return Err(idempotent_job_core::canonical::too_deep());
        }
        let ruby = Ruby::get_with(value);
        if value.is_nil() {
            return Ok(Json::Null);
        }
        if value.is_kind_of(ruby.class_true_class()) {
            return Ok(Json::Bool(true));
        }
        if value.is_kind_of(ruby.class_false_class()) {
            return Ok(Json::Bool(false));
        }
        if let Some(i) = Integer::from_value(value) {
            return integer(i).map(Json::Number);
        }
        if let Some(f) = Float::from_value(value) {
            return idempotent_job_core::canonical::float(f.to_f64()).map(Json::Number);
        }
        if let Some(s) = RString::from_value(value) {
            return self.text(s).map(Json::String);
        }
        if let Some(sym) = Symbol::from_value(value) {
            return self.symbol(sym).map(Json::String);
        }
        if let Some(array) = RArray::from_value(value) {
            let mut items = Vec::with_capacity(array.len());
            for item in array {
                items.push(self.json(item, depth + 1)?);
            }
            return Ok(Json::Array(items));
        }
        if let Some(hash) = RHash::from_value(value) {
            let mut map = serde_json::Map::new();
            let mut failed = None;
            hash.foreach(|k: Value, v: Value| {
                let key = if let Some(s) = RString::from_value(k) {
                    self.text(s)
                } else if let Some(sym) = Symbol::from_value(k) {
                    self.symbol(sym)
                } else if let Some(i) = Integer::from_value(k) {
                    integer(i).map(|n| n.to_string())
                } else {
                    Err(idempotent_job_core::canonical::map_key_refused(
                        &class_name(k),
                    ))
                };
                let entry = key.and_then(|key| {
                    let v = self.json(v, depth + 1)?;
                    idempotent_job_core::canonical::insert_entry(&mut map, key, v)
                });
                match entry {
                    Ok(()) => Ok(magnus::r_hash::ForEach::Continue),
                    Err(problem) => {
                        failed = Some(problem);
                        Ok(magnus::r_hash::ForEach::Stop)
                    }
                }
            })
            .map_err(|e| format!("a Hash that could not be read ({e})"))?;
            return match failed {
                Some(problem) => Err(problem),
                None => Ok(Json::Object(map)),
            };
        }
        Err(idempotent_job_core::words::with_article(&class_name(value)))
    }
}

/// Whether a Ruby value holds Arrays and Hashes nested deeper than the core's
/// [`idempotent_job_core::canonical::MAX_NESTING`]: walked without recursion and
/// stopping at the first level past it, so any depth is judged in bounded stack.
pub fn nested_too_deep(value: Value) -> bool {
    let limit = idempotent_job_core::canonical::MAX_NESTING;
    let mut stack: Vec<(Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        let children: Vec<Value> = if let Some(array) = RArray::from_value(value) {
            array.into_iter().collect()
        } else if let Some(hash) = RHash::from_value(value) {
            let mut values = Vec::with_capacity(hash.len());
            let _ = hash.foreach(|_: Value, v: Value| {
                values.push(v);
                Ok(magnus::r_hash::ForEach::Continue)
            });
            values
        } else {
            continue;
        };
        if depth + 1 > limit {
            return true;
        }
        stack.extend(children.into_iter().map(|child| (child, depth + 1)));
    }
    false
}

/// The claim statement's `xid` (`CLAIM_SQL`: the claiming transaction's id, as text) in a
/// claim row Hash (`:xid`), if it has one.
pub(super) fn transaction_id(ruby: &Ruby, row: RHash) -> RbResult<Option<u64>> {
    let text: Option<String> = row.lookup(ruby.sym_new("xid"))?;
    Ok(text.and_then(|t| t.parse().ok()))
}
