//! `IdempotentJob::Native::Store`: one configured database connection (runtime +
//! pool, lazily built, rebuilt after fork). Internal: the public API is the Ruby
//! facade in `lib/idempotent_job.rb`.

use std::future::Future;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use magnus::{function, method, prelude::*, RHash, RModule, Ruby, Value};
use uuid::Uuid;

use super::errors::to_ruby;
use super::gvl::without_gvl;
use crate::core::claim::{self, ClaimRequest, Outcome};
use crate::core::config::Config;
use crate::core::error::{Error, Result};
use crate::core::migrate;
use crate::core::store::{Conn, Store};

#[magnus::wrap(class = "IdempotentJob::Native::Store", free_immediately, size)]
struct NativeStore(Store);

fn parse_token(token: &str) -> Result<Uuid> {
    Uuid::parse_str(token).map_err(|_| Error::Config(format!("{token:?} is not a claim token")))
}

fn time(ruby: &Ruby, t: Option<DateTime<Utc>>) -> std::result::Result<Value, magnus::Error> {
    match t {
        None => Ok(ruby.qnil().as_value()),
        Some(t) => Ok(ruby
            .time_new(t.timestamp(), i64::from(t.timestamp_subsec_micros()))?
            .as_value()),
    }
}

impl NativeStore {
    /// `Store.new(config_json)`: validates the configuration; connects lazily.
    fn new(ruby: &Ruby, config_json: String) -> std::result::Result<Self, magnus::Error> {
        Config::from_json(&config_json)
            .and_then(Store::new)
            .map(NativeStore)
            .map_err(|e| to_ruby(ruby, e))
    }

    /// Runs one core operation on a pooled connection with the GVL released.
    fn run<T, F, Fut>(&self, ruby: &Ruby, op: F) -> std::result::Result<T, magnus::Error>
    where
        F: Fn(Pool) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let handle = self.0.handle().map_err(|e| to_ruby(ruby, e))?;
        let pool = handle.pool.clone();
        without_gvl(ruby, &handle.runtime, || op(pool.clone()))?.map_err(|e| to_ruby(ruby, e))
    }

    /// `claim(job_type, operation_key, jid, lease_seconds)` → Hash with `:decision`
    /// (`:claimed`, `:completed`, `:in_progress`) and the decision's details.
    fn claim(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
        jid: Option<String>,
        lease_seconds: f64,
    ) -> std::result::Result<RHash, magnus::Error> {
        let request = ClaimRequest {
            job_type,
            operation_key,
            jid,
            lease_seconds,
        };
        let outcome = rb_self.run(ruby, |pool| {
            let request = request.clone();
            async move { claim::claim(&mut Conn::checkout(&pool).await?, &request).await }
        })?;
        let hash = ruby.hash_new();
        match outcome {
            Outcome::Claimed {
                token,
                attempt,
                kind,
            } => {
                hash.aset(ruby.to_symbol("decision"), ruby.to_symbol("claimed"))?;
                hash.aset(ruby.to_symbol("token"), token.to_string())?;
                hash.aset(ruby.to_symbol("attempt"), attempt)?;
                hash.aset(ruby.to_symbol("kind"), ruby.to_symbol(kind.as_str()))?;
            }
            Outcome::Completed { duplicates } => {
                hash.aset(ruby.to_symbol("decision"), ruby.to_symbol("completed"))?;
                hash.aset(ruby.to_symbol("duplicates"), duplicates)?;
            }
            Outcome::InProgress {
                holder_jid,
                attempt,
                lease_remaining,
                duplicates,
            } => {
                hash.aset(ruby.to_symbol("decision"), ruby.to_symbol("in_progress"))?;
                hash.aset(ruby.to_symbol("holder_jid"), holder_jid)?;
                hash.aset(ruby.to_symbol("attempt"), attempt)?;
                hash.aset(ruby.to_symbol("lease_remaining"), lease_remaining)?;
                hash.aset(ruby.to_symbol("duplicates"), duplicates)?;
            }
        }
        Ok(hash)
    }

    /// `complete(job_type, operation_key, token)` → true.
    fn complete(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
        token: String,
    ) -> std::result::Result<bool, magnus::Error> {
        let token = parse_token(&token).map_err(|e| to_ruby(ruby, e))?;
        rb_self.run(ruby, |pool| {
            let (job_type, operation_key) = (job_type.clone(), operation_key.clone());
            async move {
                claim::complete(
                    &mut Conn::checkout(&pool).await?,
                    &job_type,
                    &operation_key,
                    token,
                )
                .await
            }
        })?;
        Ok(true)
    }

    /// `release(job_type, operation_key, token, error_text)` → true.
    fn release(
        ruby: &Ruby,
        rb_self: &Self,
        job_type: String,
        operation_key: String,
        token: String,
        error: String,
    ) -> std::result::Result<bool, magnus::Error> {
        let token = parse_token(&token).map_err(|e| to_ruby(ruby, e))?;
        rb_self.run(ruby, |pool| {
            let (job_type, operation_key, error) =
                (job_type.clone(), operation_key.clone(), error.clone());
            async move {
                let mut conn = Conn::checkout(&pool).await?;
                claim::release(&mut conn, &job_type, &operation_key, token, &error).await
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
    ) -> std::result::Result<Option<RHash>, magnus::Error> {
        let record = rb_self.run(ruby, |pool| {
            let (job_type, operation_key) = (job_type.clone(), operation_key.clone());
            async move {
                claim::find(&mut Conn::checkout(&pool).await?, &job_type, &operation_key).await
            }
        })?;
        let Some(r) = record else { return Ok(None) };
        let hash = ruby.hash_new();
        let sym = |s: &str| ruby.to_symbol(s);
        hash.aset(sym("job_type"), r.job_type)?;
        hash.aset(sym("operation_key"), r.operation_key)?;
        hash.aset(sym("status"), sym(&r.status))?;
        hash.aset(sym("claim_token"), r.claim_token.to_string())?;
        hash.aset(sym("attempts"), r.attempts)?;
        hash.aset(sym("takeovers"), r.takeovers)?;
        hash.aset(sym("last_claim"), sym(&r.last_claim))?;
        hash.aset(sym("jid"), r.jid)?;
        hash.aset(sym("duplicates"), r.duplicates)?;
        hash.aset(sym("lease_seconds"), r.lease_seconds)?;
        hash.aset(sym("lease_expired"), r.lease_expired)?;
        hash.aset(sym("last_error"), r.last_error)?;
        hash.aset(
            sym("first_claimed_at"),
            time(ruby, Some(r.first_claimed_at))?,
        )?;
        hash.aset(sym("claimed_at"), time(ruby, Some(r.claimed_at))?)?;
        hash.aset(
            sym("lease_expires_at"),
            time(ruby, Some(r.lease_expires_at))?,
        )?;
        hash.aset(sym("completed_at"), time(ruby, r.completed_at)?)?;
        hash.aset(sym("released_at"), time(ruby, r.released_at)?)?;
        hash.aset(sym("last_duplicate_at"), time(ruby, r.last_duplicate_at)?)?;
        hash.aset(sym("updated_at"), time(ruby, Some(r.updated_at))?)?;
        Ok(Some(hash))
    }

    /// `migrate` → Array of the migration names applied now.
    fn migrate(ruby: &Ruby, rb_self: &Self) -> std::result::Result<Vec<String>, magnus::Error> {
        rb_self.run(ruby, |pool| async move {
            migrate::migrate(&mut Conn::checkout(&pool).await?).await
        })
    }
}

pub fn init(ruby: &Ruby, native: RModule) -> std::result::Result<(), magnus::Error> {
    let class = native.define_class("Store", ruby.class_object())?;
    class.define_singleton_method("new", function!(NativeStore::new, 1))?;
    class.define_method("claim", method!(NativeStore::claim, 4))?;
    class.define_method("complete", method!(NativeStore::complete, 3))?;
    class.define_method("release", method!(NativeStore::release, 4))?;
    class.define_method("find", method!(NativeStore::find, 2))?;
    class.define_method("migrate", method!(NativeStore::migrate, 0))?;
    Ok(())
}
