//! `IdempotentJob::Native::Store`: one configured database (its pool, lazily built,
//! rebuilt after fork). Internal: the public API is the Ruby facade in
//! `lib/idempotent_job.rb`. Every method copies its arguments into owned Rust values,
//! then runs the core with the GVL released.

use chrono::{DateTime, Utc};
use magnus::{function, method, prelude::*, Integer, RArray, RHash, RModule, Ruby, Symbol, Value};

use super::convert::{
    claim_request, decided, decision_hash, record_hash, transaction_id, Out, RbResult,
};
use super::errors::to_ruby;
use super::gvl::without_gvl;
use super::transaction::NativeTransaction;
use idempotent_job_core::bookkeeping::Repeat;
use idempotent_job_core::config::Config;
use idempotent_job_core::conn::{Conn, Interrupt};
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::migrate;
use idempotent_job_core::operations;
use idempotent_job_core::pool::{with_fresh_conn, Lane};
use idempotent_job_core::records::{self, Listed, Resolution};
use idempotent_job_core::report;
use idempotent_job_core::results;
use idempotent_job_core::session::Session;
use idempotent_job_core::store::{PoolHandle, Store};

/// A purge cursor as Ruby holds it: `[first claim time in microseconds since the epoch,
/// job_type, operation_key]`.
type RbPurgeCursor = (i64, String, String);

/// A limit or batch size given as a Ruby Integer (the facade clamps it to 64 bits) as
/// an `i64`; anything else (a Float such as `1.5`, a String such as `"5"`) refused with
/// `refused(its inspect)`, the core's words, rather than taken as a whole number.
fn whole(ruby: &Ruby, value: Value, refused: impl Fn(&str) -> Error) -> RbResult<i64> {
    match Integer::from_value(value) {
        Some(n) => n.to_i64(),
        None => Err(to_ruby(ruby, refused(&value.inspect()))),
    }
}

#[magnus::wrap(class = "IdempotentJob::Native::Store", free_immediately, size)]
pub struct NativeStore(pub Store);

impl NativeStore {
    /// `Store.new(config_json)`: validates the configuration; connects lazily.
    fn new(ruby: &Ruby, config_json: String) -> RbResult<Self> {
        Config::from_json(&config_json)
            .and_then(Store::new)
            .map(NativeStore)
            .map_err(|e| to_ruby(ruby, e))
    }

    /// Runs one core call with this process's pool, with the GVL released.
    pub(super) fn run<T>(
        &self,
        ruby: &Ruby,
        op: impl FnOnce(&PoolHandle, &Interrupt<'_>) -> Result<T>,
    ) -> RbResult<T> {
        let pool = self.0.pool().map_err(|e| to_ruby(ruby, e))?;
        without_gvl(ruby, |interrupt| op(&pool, interrupt))?.map_err(|e| to_ruby(ruby, e))
    }

    /// Runs `op` on a pooled connection with the GVL released, again on a fresh connection of
    /// `lane` when its connection dies under it (see [`with_fresh_conn`]): only for
    /// statements that are safe to send twice.
    fn with_fresh_conn<T>(
        &self,
        ruby: &Ruby,
        lane: Lane,
        op: impl AsyncFn(&mut Conn) -> Result<T>,
    ) -> RbResult<T> {
        self.run(ruby, |pool, interrupt| {
            with_fresh_conn(pool, interrupt, lane, op)
        })
    }

    /// `transaction` → an open `IdempotentJob::Native::Transaction` (BEGIN sent).
    fn transaction(ruby: &Ruby, rb_self: &Self) -> RbResult<NativeTransaction> {
        let session = rb_self.run(ruby, Session::begin)?;
        Ok(NativeTransaction::new(session))
    }

    /// `wait(request, seconds)` → the decision Hash ([`decision_hash`]) once the
    /// live claim on the request's operation ended or `seconds` passed (then
    /// `:in_progress`), plus `:wait_path` (`:listen` or `:poll`). Holds no pooled
    /// connection while it waits (see `core::results::wait`).
    fn wait(ruby: &Ruby, rb_self: &Self, request: RHash, seconds: f64) -> RbResult<RHash> {
        let request = claim_request(ruby, request)?;
        let waited = rb_self.run(ruby, |pool, i| results::wait(pool, i, &request, seconds))?;
        let hash = decision_hash(ruby, waited.decision)?;
        hash.aset(
            ruby.sym_new("wait_path"),
            ruby.sym_new(waited.path.as_str()),
        )?;
        Ok(hash)
    }

    /// `find(job_type, operation_key)` → Hash of the record's columns, or nil.
    fn find(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
    ) -> RbResult<Option<RHash>> {
        let record = rb_self.run(ruby, |pool, i| {
            operations::find(pool, i, &job_type, &operation_key)
        })?;
        record.map(|r| record_hash(ruby, r)).transpose()
    }

    /// `find_listed(job_type, operation_key)` → Hash of the record's columns, or nil; for
    /// a record the core cannot read (a time edited to 'infinity'), `{"unreadable" =>
    /// column, "error" => message}` instead of raising (the core's
    /// `operations::find_listed`): a list shows the others and marks that one.
    fn find_listed(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
    ) -> RbResult<Option<RHash>> {
        let listed = rb_self.run(ruby, |pool, i| {
            operations::find_listed(pool, i, &job_type, &operation_key)
        })?;
        match listed {
            None => Ok(None),
            Some(Listed::Read(record)) => record_hash(ruby, *record).map(Some),
            Some(Listed::Unreadable { column, error }) => {
                let hash = ruby.hash_new();
                hash.aset("unreadable", column)?;
                hash.aset("error", error.to_string())?;
                Ok(Some(hash))
            }
        }
    }

    /// `held(job_type_or_nil, limit)` → Array of `[job_type, operation_key]`, oldest first.
    fn held(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: Option<String>,
        limit: Value,
    ) -> RbResult<Vec<(String, String)>> {
        let limit = whole(ruby, limit, operations::held_limit_refused)?;
        rb_self.run(ruby, |pool, i| {
            operations::held(pool, i, job_type.as_deref(), limit)
        })
    }

    /// `resolve(job_type, operation_key, as)`: as is `:done` or `:rerun`. Settles the
    /// operation in one statement (the core's `operations::resolve`, whose `WHERE` is the
    /// one test of which statuses settle) and returns the record after the change (a
    /// Hash as `find` returns it: status `:completed` or `:released`, and the last
    /// claim's job_class, queue and args_json a rerun re-sends), or nil when the
    /// operation was not held or given up when the statement met it. Never sent twice: a
    /// repeat after a lost answer would find the operation settled and answer nil.
    /// Raises `ConfigurationError` for a rerun of a record that holds no stored job (it
    /// stays as it was), `ConnectionError`/`DatabaseError` as every call.
    fn resolve(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
        resolution: Symbol,
    ) -> RbResult<Option<RHash>> {
        let resolution = Resolution::parse(&resolution.name()?).map_err(|e| to_ruby(ruby, e))?;
        let resolved = rb_self.run(ruby, |pool, i| {
            operations::resolve(pool, i, &job_type, &operation_key, resolution)
        })?;
        resolved.map(|r| record_hash(ruby, r.record)).transpose()
    }

    /// `repeats(since_epoch_seconds, job_type_or_nil)` → Array of Hashes: job_type,
    /// operation_key, status, attempts, takeovers, duplicates, mismatches,
    /// first_claimed_at (Time), repeat_times (Array of Time), job_classes, jid (the last
    /// claiming delivery's), completed_at (Time or nil), first_facts_json (JSON object
    /// text or nil), repeat_facts_json (JSON array text).
    fn repeats(
        ruby: &Ruby,
        rb_self: &Self,
        since: f64,
        job_type: Option<String>,
    ) -> RbResult<RArray> {
        let since = DateTime::<Utc>::from_timestamp_micros((since * 1e6) as i64)
            .ok_or_else(|| to_ruby(ruby, Error::Config("since is out of range".into())))?;
        let rows = rb_self.run(ruby, |pool, i| {
            operations::repeats(pool, i, since, job_type.as_deref())
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
                .set("job_classes", r.job_classes)?
                .set("jid", r.delivery_id)?
                .time("completed_at", r.completed_at)?
                .set("first_facts_json", r.first_facts)?
                .set("repeat_facts_json", r.repeat_facts)?;
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
        rb_self.with_fresh_conn(ruby, Lane::Main, async |c| {
            report::given_up(c, job_type.as_deref(), limit).await
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
        rb_self.with_fresh_conn(ruby, Lane::Main, async |c| {
            report::search(
                c,
                &job_type,
                key_prefix.as_deref(),
                status.as_deref(),
                limit,
            )
            .await
        })
    }

    /// `takeovers(since_epoch_seconds, limit)` → Array of `[job_type, operation_key]`
    /// whose latest claim was a takeover, newest first.
    fn takeovers(ruby: &Ruby, rb_self: &Self, since: f64, limit: i64) -> RbResult<report::Keys> {
        let since = DateTime::<Utc>::from_timestamp_micros((since * 1e6) as i64)
            .ok_or_else(|| to_ruby(ruby, Error::Config("since is out of range".into())))?;
        rb_self.with_fresh_conn(ruby, Lane::Main, async |c| {
            report::takeovers(c, since, limit).await
        })
    }

    /// `stale_claims(limit)` → Array of `[job_type, operation_key]` of expired leases
    /// not yet taken over, longest expired first.
    fn stale_claims(ruby: &Ruby, rb_self: &Self, limit: i64) -> RbResult<report::Keys> {
        rb_self.with_fresh_conn(ruby, Lane::Main, async |c| {
            report::stale_claims(c, limit).await
        })
    }

    /// `completed(job_type, operation_key)` → true when the operation's record is
    /// completed (the enqueue check of `on_enqueue: :skip_completed`; one read-only
    /// statement, sent again on a fresh connection if the first one dies), within the
    /// `enqueue_check_timeout` setting (a `TimeoutError` past it).
    fn completed(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
    ) -> RbResult<bool> {
        let bound = rb_self.0.config().enqueue_check_timeout();
        rb_self.run(ruby, |pool, interrupt| {
            interrupt.end_by(Some(std::time::Instant::now() + bound));
            with_fresh_conn(pool, interrupt, Lane::Main, async |c| {
                records::completed(c, &job_type, &operation_key).await
            })
        })
    }

    /// `metrics(retention_seconds)` → String: the table's metrics in Prometheus' text
    /// exposition format (see `report::exposition`).
    fn metrics(ruby: &Ruby, rb_self: &Self, retention: f64) -> RbResult<String> {
        let rows = rb_self.with_fresh_conn(ruby, Lane::Main, async |c| {
            report::metrics(c, retention).await
        })?;
        Ok(report::exposition(&rows, retention))
    }

    /// `job_types(limit)` → Array of the job types present, in order.
    fn job_types(ruby: &Ruby, rb_self: &Self, limit: i64) -> RbResult<Vec<String>> {
        rb_self.with_fresh_conn(ruby, Lane::Main, async |c| {
            report::job_types(c, limit).await
        })
    }

    /// `purge_batch(older_than_seconds, batch, cursor)` → `[deleted, picked, cursor]`:
    /// one batch after `cursor` (nil at the start; else the cursor the previous batch
    /// returned, `[first claim time in microseconds since the epoch, job_type, operation_key]`).
    /// See the core's `records::purge_batch`: a purge is done when `picked < batch`.
    fn purge_batch(
        ruby: &Ruby,
        rb_self: &Self,
        older_than: Value,
        batch: Value,
        cursor: Option<RbPurgeCursor>,
    ) -> RbResult<(u64, u64, Option<RbPurgeCursor>)> {
        // An age is a number of seconds (an Integer, a Float, or 10.minutes, a Rational, a
        // BigDecimal as their to_f); anything else (true, "30", nil) is refused in the
        // core's words, never read by Float().
        let number = super::options::number_of(older_than)?.unwrap_or(older_than);
        if !(number.is_kind_of(ruby.class_integer()) || number.is_kind_of(ruby.class_float())) {
            return Err(to_ruby(
                ruby,
                records::purge_refused(&older_than.inspect(), &batch.inspect()),
            ));
        }
        let older_than: f64 = number.funcall("to_f", ())?;
        let shown_age = older_than.to_string();
        let batch = whole(ruby, batch, |shown| {
            records::purge_refused(&shown_age, shown)
        })?;
        let after = match cursor {
            None => records::PurgeCursor::default(),
            Some((micros, job_type, operation_key)) => records::PurgeCursor {
                first_claimed_at: Some(DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(
                    || {
                        to_ruby(
                            ruby,
                            Error::Config(format!("purge cursor time out of range: {micros}")),
                        )
                    },
                )?),
                job_type,
                operation_key,
            },
        };
        let done = rb_self.run(ruby, |pool, i| {
            operations::purge_batch(pool, i, older_than, batch, &after)
        })?;
        let next = done.next.first_claimed_at.map(|at| {
            (
                at.timestamp_micros(),
                done.next.job_type,
                done.next.operation_key,
            )
        });
        Ok((done.deleted, done.picked, next))
    }

    /// `settle_repeats` → true once this process's queued repeat bookkeeping is
    /// written (see `core::bookkeeping`); false, at once, when this process never used
    /// the store (nothing can be queued; no pool is built for it).
    fn settle_repeats(ruby: &Ruby, rb_self: &Self) -> RbResult<bool> {
        let Some(pool) = rb_self.0.built_pool() else {
            return Ok(false);
        };
        without_gvl(ruby, |i| pool.bookkeeper().settle(&pool, i))?.map_err(|e| to_ruby(ruby, e))?;
        Ok(true)
    }

    /// `repeats_dropped` → Integer: repeats this process's pool dropped instead of
    /// writing them (see `Bookkeeper::dropped`); 0 when no pool was built.
    fn repeats_dropped(&self) -> u64 {
        self.0
            .built_pool()
            .map_or(0, |pool| pool.bookkeeper().dropped())
    }

    /// `close` → nil: closes this process's pool once the calls, transactions and
    /// heartbeats in flight on it are done, after writing its queued repeat
    /// bookkeeping (see `Store::close`); returns at once. For a store replaced by
    /// `IdempotentJob.configure` or `reset!`.
    fn close(&self) {
        self.0.close();
    }

    /// `record_repeat(row, token, request, decided_at)` → true when queued: the repeat
    /// bookkeeping (`repeat_facts`) of a claim another driver decided outside a
    /// delivery's native call (a delivery on ActiveRecord's transaction has its repeat
    /// queued by `Native::Protocol#perform` itself; the specs' own claim statements use
    /// this). `row`, `token`, `request`: as `Native.decide` takes them;
    /// `decided_at`: the claim statement's `decided_at` in Float epoch seconds (`row[:xid]`,
    /// the claim's transaction id, makes its `repeat_facts` entry wait for that
    /// transaction's commit, as in a delivery's native call). False for
    /// a first claim (nothing to record). Writes nothing itself: the bookkeeping does,
    /// asynchronously.
    fn record_repeat(
        ruby: &Ruby,
        rb_self: &Self,
        row: RHash,
        token: String,
        request: RHash,
        decided_at: f64,
    ) -> RbResult<bool> {
        let xid = transaction_id(ruby, row)?;
        let (decision, request) = decided(ruby, row, &token, request)?;
        let at = DateTime::<Utc>::from_timestamp_micros((decided_at * 1e6) as i64)
            .ok_or_else(|| to_ruby(ruby, Error::Config("decided_at is out of range".into())))?;
        let Some(mut repeat) = Repeat::after_claim(&request, &decision, at) else {
            return Ok(false);
        };
        repeat.xid = xid;
        let pool = rb_self.0.pool().map_err(|e| to_ruby(ruby, e))?;
        pool.bookkeeper().record(repeat);
        Ok(true)
    }

    /// `migrate` → Array of the migration names applied now.
    fn migrate(ruby: &Ruby, rb_self: &Self) -> RbResult<Vec<String>> {
        rb_self.run(ruby, |pool, i| migrate::migrate(pool, i))
    }
}

pub fn init(ruby: &Ruby, native: RModule) -> RbResult<()> {
    let class = native.define_class("Store", ruby.class_object())?;
    class.define_singleton_method("new", function!(NativeStore::new, 1))?;
    class.define_method("wait", method!(NativeStore::wait, 2))?;
    class.define_method("find", method!(NativeStore::find, 2))?;
    class.define_method("find_listed", method!(NativeStore::find_listed, 2))?;
    class.define_method("held", method!(NativeStore::held, 2))?;
    class.define_method("resolve", method!(NativeStore::resolve, 3))?;
    class.define_method("migrate", method!(NativeStore::migrate, 0))?;
    class.define_method("settle_repeats", method!(NativeStore::settle_repeats, 0))?;
    class.define_method("record_repeat", method!(NativeStore::record_repeat, 4))?;
    class.define_method("close", method!(NativeStore::close, 0))?;
    class.define_method("repeats_dropped", method!(NativeStore::repeats_dropped, 0))?;
    class.define_method("transaction", method!(NativeStore::transaction, 0))?;
    class.define_method("purge_batch", method!(NativeStore::purge_batch, 3))?;
    class.define_method("repeats", method!(NativeStore::repeats, 2))?;
    class.define_method("given_up", method!(NativeStore::given_up, 2))?;
    class.define_method("search", method!(NativeStore::search, 4))?;
    class.define_method("takeovers", method!(NativeStore::takeovers, 2))?;
    class.define_method("stale_claims", method!(NativeStore::stale_claims, 1))?;
    class.define_method("job_types", method!(NativeStore::job_types, 1))?;
    class.define_method("completed", method!(NativeStore::completed, 2))?;
    class.define_method("metrics", method!(NativeStore::metrics, 1))?;
    Ok(())
}
