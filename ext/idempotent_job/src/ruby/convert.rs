//! Conversions between Ruby values and the core's types, shared by the classes of
//! `IdempotentJob::Native` (`store.rs`, `transaction.rs`) and its module functions.

use chrono::{DateTime, Utc};
use magnus::value::LazyId;
use magnus::{
    prelude::*, Float, Integer, IntoValue, RArray, RHash, RModule, RString, Ruby, Symbol, Value,
};
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
/// `refuse_mismatch`, `facts_json` (the door's delivery facts: a JSON object text).
pub fn claim_request(ruby: &Ruby, request: RHash) -> RbResult<ClaimRequest> {
    let id = |key: &LazyId| LazyId::get_inner_with(key, ruby);
    let get = |key: &LazyId| request.lookup::<_, Option<String>>(id(key));
    Ok(ClaimRequest {
        job_type: get(&keys::job_type)?.unwrap_or_default(),
        operation_key: get(&keys::operation_key)?.unwrap_or_default(),
        delivery_id: get(&keys::jid)?,
        lease_seconds: request
            .lookup::<_, Option<f64>>(id(&keys::lease))?
            .unwrap_or(0.0),
        args_digest: get(&keys::args_digest)?,
        job_class: get(&keys::job_class)?,
        queue: get(&keys::queue)?,
        args_json: get(&keys::args_json)?,
        refuse_mismatch: request
            .lookup::<_, Option<bool>>(id(&keys::refuse_mismatch))?
            .unwrap_or(false),
        facts_json: get(&keys::facts_json)?,
    })
}

/// `Native.facts_json(facts)` → a delivery's facts Hash as a JSON object text (the
/// claim request's `facts_json`), written here with serde_json: a fifth of what Ruby's
/// `JSON.generate` costs for a Hash with Float timestamps. A value serde_json cannot
/// take (a Bignum, NaN, another object) falls back to `JSON.generate`, which raises
/// for what JSON cannot hold. The text is stored as `jsonb`, which keeps neither key
/// order nor number spelling, so both writers store the same value.
pub fn facts_json(ruby: &Ruby, facts: RHash) -> RbResult<String> {
    if let Some(json) = json_of(facts.as_value()) {
        return Ok(json.to_string());
    }
    let generator: RModule = ruby.class_object().const_get("JSON")?;
    generator.funcall("generate", (facts,))
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
    Ok(match change.name()?.as_ref() {
        "complete" => Fenced::Complete,
        "complete_asynchronously" => Fenced::CompleteAsynchronously,
        "release" => Fenced::Release,
        "hold" => Fenced::Hold,
        "give_up" => Fenced::GiveUp,
        "expire" => Fenced::Expire,
        "renew" => Fenced::Renew,
        other => {
            return Err(to_ruby(
                ruby,
                Error::Config(format!("unknown claim change :{other}")),
            ))
        }
    })
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
/// and its request.
pub fn decided(
    ruby: &Ruby,
    row: RHash,
    token: &str,
    request: RHash,
) -> RbResult<(ClaimReply, ClaimRequest)> {
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
    let request = claim_request(ruby, request)?;
    let decision = record::check_request(&request)
        .and_then(|()| record::decide(claim_row, token, &request))
        .map_err(|e| to_ruby(ruby, e))?;
    Ok((decision, request))
}

/// `Native.fenced_sql(change)`: the statement of a fenced change, for other drivers.
pub fn fenced_sql(ruby: &Ruby, change: Symbol) -> RbResult<&'static str> {
    Ok(parse_fenced(ruby, change)?.sql())
}

/// A record as a Hash with Symbol keys, one per [`Record::COLUMNS`]: status and
/// last_claim as Symbols, the claim token as a String, times as Time, NULL as nil.
pub fn record_hash(ruby: &Ruby, r: Record) -> RbResult<RHash> {
    let out = Out::new(ruby);
    for (name, field) in r.fields() {
        match field {
            Field::Name(v) => out.sym(name, v)?,
            Field::Text(v) => out.set(name, v.as_str())?,
            Field::OptText(v) => out.set(name, v.as_deref())?,
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

/// `Native.record_columns`: the record's column names, as [`record_hash`]'s keys.
pub fn record_columns() -> Vec<&'static str> {
    Record::COLUMNS.to_vec()
}

/// A Ruby value as JSON data, or None when JSON cannot carry it faithfully: nil, true,
/// false, an Integer within 64 bits, a finite Float, a String (as UTF-8; None when it
/// is not valid in its encoding), a Symbol (its name), an Array, a Hash with String or
/// Symbol keys (as strings) of such values. Anything else (a Time, a Proc, a
/// non-finite Float, a Bignum) is None.
pub fn json_of(value: Value) -> Option<serde_json::Value> {
    json_at(value, 0)
}

/// [`json_of`] at `depth` levels of arrays and hashes: None past the core's
/// [`idempotent_job_core::canonical::MAX_NESTING`], before recursing further.
fn json_at(value: Value, depth: usize) -> Option<serde_json::Value> {
    use serde_json::Value as Json;
    let inner = |v: Value| json_at(v, depth + 1);
    let container = RArray::from_value(value).is_some() || RHash::from_value(value).is_some();
    if container && depth >= idempotent_job_core::canonical::MAX_NESTING {
        return None;
    }
    let ruby = Ruby::get_with(value);
    if value.is_nil() {
        return Some(Json::Null);
    }
    if value.is_kind_of(ruby.class_true_class()) {
        return Some(Json::Bool(true));
    }
    if value.is_kind_of(ruby.class_false_class()) {
        return Some(Json::Bool(false));
    }
    if let Some(i) = Integer::from_value(value) {
        return i.to_i64().ok().map(Json::from);
    }
    if let Some(f) = Float::from_value(value) {
        return serde_json::Number::from_f64(f.to_f64()).map(Json::Number);
    }
    if let Some(s) = RString::from_value(value) {
        return s.to_string().ok().map(Json::String);
    }
    if let Some(sym) = Symbol::from_value(value) {
        return sym.name().ok().map(|n| Json::String(n.into_owned()));
    }
    if let Some(array) = RArray::from_value(value) {
        return array
            .into_iter()
            .map(inner)
            .collect::<Option<Vec<_>>>()
            .map(Json::Array);
    }
    if let Some(hash) = RHash::from_value(value) {
        let mut map = serde_json::Map::new();
        let mut ok = true;
        hash.foreach(|k: Value, v: Value| {
            let key = match (RString::from_value(k), Symbol::from_value(k)) {
                (Some(s), _) => s.to_string().ok(),
                (_, Some(sym)) => sym.name().ok().map(|n| n.into_owned()),
                _ => None,
            };
            match (key, inner(v)) {
                (Some(key), Some(v)) => {
                    map.insert(key, v);
                    Ok(magnus::r_hash::ForEach::Continue)
                }
                _ => {
                    ok = false;
                    Ok(magnus::r_hash::ForEach::Stop)
                }
            }
        })
        .ok()?;
        return ok.then_some(Json::Object(map));
    }
    None
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
