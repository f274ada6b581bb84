//! `IdempotentJob::Native::Store` (one configured database: runtime + pool, lazily
//! built, rebuilt after fork) and `IdempotentJob::Native::Heartbeat`. Internal: the
//! public API is the Ruby facade in `lib/idempotent_job.rb`. Every method copies its
//! arguments into owned Rust values, then runs the core with the GVL released.

use std::future::Future;

use chrono::{DateTime, Utc};
use magnus::{
    function, method, prelude::*, IntoValue, RArray, RHash, RModule, Ruby, Symbol, Value,
};
use uuid::Uuid;

use super::errors::to_ruby;
use super::gvl::without_gvl;
use super::transaction::NativeTransaction;
use crate::core::claim::{
    self, ClaimRequest, ClaimRow, Decision, Fenced, Outcome, Record, Resolution,
};
use crate::core::config::Config;
use crate::core::error::{Error, Result};
use crate::core::heartbeat::{Heartbeat, HeartbeatReport};
use crate::core::migrate;
use crate::core::report;
use crate::core::session::Session;
use crate::core::store::{with_conn, Conn, Pool, Store};

pub(super) type RbResult<T> = std::result::Result<T, magnus::Error>;

#[magnus::wrap(class = "IdempotentJob::Native::Store", free_immediately, size)]
struct NativeStore(Store);

#[magnus::wrap(class = "IdempotentJob::Native::Heartbeat", free_immediately, size)]
struct NativeHeartbeat(Heartbeat);

pub(super) fn parse_token(token: &str) -> Result<Uuid> {
    Uuid::parse_str(token).map_err(|_| Error::Config(format!("{token:?} is not a claim token")))
}

/// A Hash with Symbol keys, filled by `set`.
struct Out<'r> {
    ruby: &'r Ruby,
    hash: RHash,
}

impl<'r> Out<'r> {
    fn new(ruby: &'r Ruby) -> Self {
        Out {
            ruby,
            hash: ruby.hash_new(),
        }
    }
    fn set<T: IntoValue>(&self, key: &str, value: T) -> RbResult<&Self> {
        self.hash.aset(self.ruby.to_symbol(key), value)?;
        Ok(self)
    }
    fn sym(&self, key: &str, value: &str) -> RbResult<&Self> {
        self.set(key, self.ruby.to_symbol(value))
    }
    fn time(&self, key: &str, t: Option<DateTime<Utc>>) -> RbResult<&Self> {
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
/// `refuse_mismatch`.
pub(super) fn claim_request(ruby: &Ruby, request: RHash) -> RbResult<ClaimRequest> {
    let get = |key: &str| request.lookup::<_, Option<String>>(ruby.to_symbol(key));
    Ok(ClaimRequest {
        job_type: get("job_type")?.unwrap_or_default(),
        operation_key: get("operation_key")?.unwrap_or_default(),
        jid: get("jid")?,
        lease_seconds: request
            .lookup::<_, Option<f64>>(ruby.to_symbol("lease"))?
            .unwrap_or(0.0),
        args_digest: get("args_digest")?,
        job_class: get("job_class")?,
        queue: get("queue")?,
        args_json: get("args_json")?,
        refuse_mismatch: request
            .lookup::<_, Option<bool>>(ruby.to_symbol("refuse_mismatch"))?
            .unwrap_or(false),
    })
}

/// A decision as a Hash: `:decision` (`:claimed`, `:completed`, `:in_progress`,
/// `:held`, `:given_up`, `:refused`), `:mismatch`, and the decision's details.
pub(super) fn decision_hash(ruby: &Ruby, decision: Decision) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.set("mismatch", decision.mismatch)?;
    match decision.outcome {
        Outcome::Claimed {
            token,
            attempt,
            kind,
        } => {
            out.sym("decision", "claimed")?
                .set("token", token.to_string())?
                .set("attempt", attempt)?
                .sym("kind", kind.as_str())?;
        }
        Outcome::InProgress {
            holder_jid,
            attempt,
            lease_remaining,
            duplicates,
        } => {
            out.sym("decision", "in_progress")?
                .set("holder_jid", holder_jid)?
                .set("attempt", attempt)?
                .set("lease_remaining", lease_remaining)?
                .set("duplicates", duplicates)?;
        }
        Outcome::Completed { duplicates } => {
            out.sym("decision", "completed")?
                .set("duplicates", duplicates)?;
        }
        Outcome::Held { duplicates } => {
            out.sym("decision", "held")?.set("duplicates", duplicates)?;
        }
        Outcome::GivenUp { duplicates } => {
            out.sym("decision", "given_up")?
                .set("duplicates", duplicates)?;
        }
        Outcome::Refused { duplicates } => {
            out.sym("decision", "refused")?
                .set("duplicates", duplicates)?;
        }
    }
    Ok(out.hash)
}

/// `:complete`, `:release`, `:hold`, `:give_up`, `:expire`, `:renew` → [`Fenced`].
pub(super) fn parse_fenced(ruby: &Ruby, change: Symbol) -> RbResult<Fenced> {
    Ok(match change.name()?.as_ref() {
        "complete" => Fenced::Complete,
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
/// `lease_remaining` with typed values; `token` is the uuid sent as $3.
pub(super) fn decide(ruby: &Ruby, row: RHash, token: String, request: RHash) -> RbResult<RHash> {
    let sym = |key: &str| ruby.to_symbol(key);
    let claim_row = ClaimRow {
        won: row.fetch(sym("won"))?,
        status: row.fetch(sym("status"))?,
        last_claim: row.fetch(sym("last_claim"))?,
        attempts: row.fetch(sym("attempts"))?,
        jid: row.lookup(sym("jid"))?,
        duplicates: row.fetch(sym("duplicates"))?,
        mismatch: row.fetch(sym("mismatch"))?,
        lease_remaining: row.fetch(sym("lease_remaining"))?,
    };
    let token = parse_token(&token).map_err(|e| to_ruby(ruby, e))?;
    let request = claim_request(ruby, request)?;
    let decision = claim::check_request(&request)
        .and_then(|()| claim::decide(claim_row, token, &request))
        .map_err(|e| to_ruby(ruby, e))?;
    decision_hash(ruby, decision)
}

/// `Native.fenced_sql(change)`: the statement of a fenced change, for other drivers.
pub(super) fn fenced_sql(ruby: &Ruby, change: Symbol) -> RbResult<&'static str> {
    Ok(parse_fenced(ruby, change)?.sql())
}

fn record_hash(ruby: &Ruby, r: Record) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.set("job_type", r.job_type)?
        .set("operation_key", r.operation_key)?
        .sym("status", &r.status)?
        .set("claim_token", r.claim_token.to_string())?
        .set("attempts", r.attempts)?
        .set("takeovers", r.takeovers)?
        .sym("last_claim", &r.last_claim)?
        .set("jid", r.jid)?
        .set("duplicates", r.duplicates)?
        .set("lease_seconds", r.lease_seconds)?
        .set("lease_expired", r.lease_expired)?
        .set("last_error", r.last_error)?
        .set("args_digest", r.args_digest)?
        .set("job_class", r.job_class)?
        .set("queue", r.queue)?
        .set("args_json", r.args)?
        .set("mismatches", r.mismatches)?
        .set("last_mismatch", r.last_mismatch)?
        .set("resolution", r.resolution)?
        .time("first_claimed_at", Some(r.first_claimed_at))?
        .time("claimed_at", Some(r.claimed_at))?
        .time("lease_expires_at", Some(r.lease_expires_at))?
        .time("completed_at", r.completed_at)?
        .time("released_at", r.released_at)?
        .time("last_duplicate_at", r.last_duplicate_at)?
        .time("heartbeat_at", r.heartbeat_at)?
        .time("held_at", r.held_at)?
        .time("given_up_at", r.given_up_at)?
        .time("resolved_at", r.resolved_at)?
        .time("updated_at", Some(r.updated_at))?;
    Ok(out.hash)
}

fn heartbeat_hash(ruby: &Ruby, r: HeartbeatReport) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.set("renewals", r.renewals)?
        .set("lost", r.lost)?
        .set("max_run_reached", r.max_run_reached)?
        .set("last_error", r.last_error)?;
    Ok(out.hash)
}

impl NativeStore {
    /// `Store.new(config_json)`: validates the configuration; connects lazily.
    fn new(ruby: &Ruby, config_json: String) -> RbResult<Self> {
        Config::from_json(&config_json)
            .and_then(Store::new)
            .map(NativeStore)
            .map_err(|e| to_ruby(ruby, e))
    }

    /// Runs one core operation on a pooled connection with the GVL released.
    fn run<T, F, Fut>(&self, ruby: &Ruby, op: F) -> RbResult<T>
    where
        F: FnOnce(Pool) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let handle = self.0.handle().map_err(|e| to_ruby(ruby, e))?;
        without_gvl(ruby, &handle.runtime, op(handle.pool.clone()))?.map_err(|e| to_ruby(ruby, e))
    }

    /// `claim(request)`: see [`claim_request`] for the Hash; returns
    /// [`decision_hash`].
    fn claim(ruby: &Ruby, rb_self: &Self, request: RHash) -> RbResult<RHash> {
        let request = claim_request(ruby, request)?;
        let decision = rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| claim::claim(c, &request).await).await
        })?;
        decision_hash(ruby, decision)
    }

    /// `transaction` → an open `IdempotentJob::Native::Transaction` (BEGIN sent).
    fn transaction(ruby: &Ruby, rb_self: &Self) -> RbResult<NativeTransaction> {
        let handle = rb_self.0.handle().map_err(|e| to_ruby(ruby, e))?;
        let pool = handle.pool.clone();
        let session = without_gvl(
            ruby,
            &handle.runtime,
            async move { Session::begin(&pool).await },
        )?
        .map_err(|e| to_ruby(ruby, e))?;
        Ok(NativeTransaction::new(handle.runtime.clone(), session))
    }

    /// `fenced(change, job_type, operation_key, token, text)`: change is one of
    /// `:complete`, `:release`, `:hold`, `:give_up`, `:expire`, `:renew`; `text` the
    /// error text stored by `:release` / `:expire` (else nil). Returns true.
    fn fenced(
        ruby: &Ruby,
        rb_self: &Self,
        change: Symbol,
        job_type: String,
        operation_key: String,
        token: String,
        text: Option<String>,
    ) -> RbResult<bool> {
        let change = parse_fenced(ruby, change)?;
        let token = parse_token(&token).map_err(|e| to_ruby(ruby, e))?;
        rb_self.run(ruby, |pool| {
            let (job_type, key, text) = (job_type.clone(), operation_key.clone(), text.clone());
            async move {
                with_conn(&pool, async |c| {
                    claim::fenced(c, change, &job_type, &key, token, text.as_deref()).await
                })
                .await
            }
        })?;
        Ok(true)
    }

    /// `find(job_type, operation_key)` → Hash of the record's columns, or nil.
    fn find(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
    ) -> RbResult<Option<RHash>> {
        let record = rb_self.run(ruby, |pool| {
            let (job_type, key) = (job_type.clone(), operation_key.clone());
            async move { with_conn(&pool, async |c| claim::find(c, &job_type, &key).await).await }
        })?;
        record.map(|r| record_hash(ruby, r)).transpose()
    }

    /// `held(job_type_or_nil, limit)` → Array of `[job_type, operation_key]`, oldest first.
    fn held(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: Option<String>,
        limit: i64,
    ) -> RbResult<Vec<(String, String)>> {
        rb_self.run(ruby, |pool| {
            let job_type = job_type.clone();
            async move {
                with_conn(&pool, async |c| {
                    claim::held(c, job_type.as_deref(), limit).await
                })
                .await
            }
        })
    }

    /// `resolve(job_type, operation_key, as)`: as is `:done` or `:rerun`. Returns false
    /// when the operation is not held or given up.
    fn resolve(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
        resolution: Symbol,
    ) -> RbResult<bool> {
        let resolution = match resolution.name()?.as_ref() {
            "done" => Resolution::Done,
            "rerun" => Resolution::Rerun,
            other => {
                return Err(to_ruby(
                    ruby,
                    Error::Config(format!("resolve as: must be :done or :rerun, got :{other}")),
                ))
            }
        };
        rb_self.run(ruby, |pool| {
            let (job_type, key) = (job_type.clone(), operation_key.clone());
            async move {
                with_conn(&pool, async |c| {
                    claim::resolve(c, &job_type, &key, resolution).await
                })
                .await
            }
        })
    }

    /// `repeats(since_epoch_seconds, job_type_or_nil)` → Array of Hashes: job_type,
    /// operation_key, status, attempts, takeovers, duplicates, mismatches,
    /// first_claimed_at (Time), repeat_times (Array of Time), job_classes.
    fn repeats(
        ruby: &Ruby,
        rb_self: &Self,
        since: f64,
        job_type: Option<String>,
    ) -> RbResult<RArray> {
        let since = DateTime::<Utc>::from_timestamp_micros((since * 1e6) as i64)
            .ok_or_else(|| to_ruby(ruby, Error::Config("since is out of range".into())))?;
        let rows = rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| {
                claim::repeats(c, since, job_type.as_deref()).await
            })
            .await
        })?;
        let out = ruby.ary_new_capa(rows.len());
        for r in rows {
            let times = ruby.ary_new_capa(r.repeat_times.len());
            for t in r.repeat_times {
                times
                    .push(ruby.time_new(t.timestamp(), i64::from(t.timestamp_subsec_micros()))?)?;
            }
            let hash = Out::new(ruby);
            hash.set("job_type", r.job_type)?
                .set("operation_key", r.operation_key)?
                .sym("status", &r.status)?
                .set("attempts", r.attempts)?
                .set("takeovers", r.takeovers)?
                .set("duplicates", r.duplicates)?
                .set("mismatches", r.mismatches)?
                .time("first_claimed_at", Some(r.first_claimed_at))?
                .set("repeat_times", times)?
                .set("job_classes", r.job_classes)?;
            out.push(hash.hash)?;
        }
        Ok(out)
    }

    /// `given_up(job_type_or_nil, limit)` → Array of `[job_type, operation_key]`,
    /// newest first.
    fn given_up(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: Option<String>,
        limit: i64,
    ) -> RbResult<report::Keys> {
        rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| {
                report::given_up(c, job_type.as_deref(), limit).await
            })
            .await
        })
    }

    /// `search(job_type, key_prefix_or_nil, status_or_nil, limit)` → Array of
    /// `[job_type, operation_key]`, most recently changed first.
    fn search(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        key_prefix: Option<String>,
        status: Option<String>,
        limit: i64,
    ) -> RbResult<report::Keys> {
        rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| {
                report::search(
                    c,
                    &job_type,
                    key_prefix.as_deref(),
                    status.as_deref(),
                    limit,
                )
                .await
            })
            .await
        })
    }

    /// `takeovers(since_epoch_seconds, limit)` → Array of `[job_type, operation_key]`
    /// whose latest claim was a takeover, newest first.
    fn takeovers(ruby: &Ruby, rb_self: &Self, since: f64, limit: i64) -> RbResult<report::Keys> {
        let since = DateTime::<Utc>::from_timestamp_micros((since * 1e6) as i64)
            .ok_or_else(|| to_ruby(ruby, Error::Config("since is out of range".into())))?;
        rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| report::takeovers(c, since, limit).await).await
        })
    }

    /// `stale_claims(limit)` → Array of `[job_type, operation_key]` of expired leases
    /// not yet taken over, longest expired first.
    fn stale_claims(ruby: &Ruby, rb_self: &Self, limit: i64) -> RbResult<report::Keys> {
        rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| report::stale_claims(c, limit).await).await
        })
    }

    /// `job_types(limit)` → Array of the job types present, in order.
    fn job_types(ruby: &Ruby, rb_self: &Self, limit: i64) -> RbResult<Vec<String>> {
        rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| report::job_types(c, limit).await).await
        })
    }

    /// `purge_batch(older_than_seconds, batch)` → Integer, records deleted.
    fn purge_batch(ruby: &Ruby, rb_self: &Self, older_than: f64, batch: i64) -> RbResult<u64> {
        rb_self.run(ruby, |pool| async move {
            with_conn(&pool, async |c| {
                claim::purge_batch(c, older_than, batch).await
            })
            .await
        })
    }

    /// `heartbeat(job_type, operation_key, token, lease_seconds, max_run_seconds)` →
    /// a running `Heartbeat`. Does not block.
    fn heartbeat(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
        token: String,
        lease_seconds: f64,
        max_run_seconds: f64,
    ) -> RbResult<NativeHeartbeat> {
        let token = parse_token(&token).map_err(|e| to_ruby(ruby, e))?;
        let handle = rb_self.0.handle().map_err(|e| to_ruby(ruby, e))?;
        Ok(NativeHeartbeat(Heartbeat::start(
            &handle,
            job_type,
            operation_key,
            token,
            lease_seconds,
            max_run_seconds,
        )))
    }

    /// `migrate` → Array of the migration names applied now.
    fn migrate(ruby: &Ruby, rb_self: &Self) -> RbResult<Vec<String>> {
        rb_self.run(ruby, |pool| async move {
            migrate::migrate(&mut Conn::checkout(&pool).await?).await
        })
    }
}

impl NativeHeartbeat {
    /// `stop` → Hash `{renewals:, lost:, max_run_reached:, last_error:}`; idempotent.
    fn stop(ruby: &Ruby, rb_self: &Self) -> RbResult<RHash> {
        heartbeat_hash(ruby, rb_self.0.stop())
    }

    /// `report` → the same Hash, without stopping.
    fn report(ruby: &Ruby, rb_self: &Self) -> RbResult<RHash> {
        heartbeat_hash(ruby, rb_self.0.report())
    }
}

pub fn init(ruby: &Ruby, native: RModule) -> RbResult<()> {
    let class = native.define_class("Store", ruby.class_object())?;
    class.define_singleton_method("new", function!(NativeStore::new, 1))?;
    class.define_method("claim", method!(NativeStore::claim, 1))?;
    class.define_method("fenced", method!(NativeStore::fenced, 5))?;
    class.define_method("find", method!(NativeStore::find, 2))?;
    class.define_method("held", method!(NativeStore::held, 2))?;
    class.define_method("resolve", method!(NativeStore::resolve, 3))?;
    class.define_method("heartbeat", method!(NativeStore::heartbeat, 5))?;
    class.define_method("migrate", method!(NativeStore::migrate, 0))?;
    class.define_method("transaction", method!(NativeStore::transaction, 0))?;
    class.define_method("purge_batch", method!(NativeStore::purge_batch, 2))?;
    class.define_method("repeats", method!(NativeStore::repeats, 2))?;
    class.define_method("given_up", method!(NativeStore::given_up, 2))?;
    class.define_method("search", method!(NativeStore::search, 4))?;
    class.define_method("takeovers", method!(NativeStore::takeovers, 2))?;
    class.define_method("stale_claims", method!(NativeStore::stale_claims, 1))?;
    class.define_method("job_types", method!(NativeStore::job_types, 1))?;
    let heartbeat = native.define_class("Heartbeat", ruby.class_object())?;
    heartbeat.define_method("stop", method!(NativeHeartbeat::stop, 0))?;
    heartbeat.define_method("report", method!(NativeHeartbeat::report, 0))?;
    Ok(())
}
