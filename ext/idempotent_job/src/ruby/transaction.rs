//! `IdempotentJob::Native::Transaction`: one open transaction on a pooled connection
//! (see `core::session`). Internal; the job's handle is the Ruby class
//! `IdempotentJob::Transaction`.

use std::sync::Mutex;

use magnus::{
    encoding::EncodingCapable, method, prelude::*, r_string::RString, value::ReprValue, Float,
    Integer, RArray, RModule, Ruby, Symbol, Value,
};

use super::convert::RbResult;
use super::errors::to_ruby;
use super::gvl::without_gvl;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::{Error, Result};
use idempotent_job_core::session::Session;
use idempotent_job_core::values::{Cell, Param};

#[magnus::wrap(class = "IdempotentJob::Native::Transaction", free_immediately, size)]
pub struct NativeTransaction {
    session: Mutex<Option<Session>>,
    /// The process that opened it: a forked child that garbage-collects the handle
    /// must not touch the parent's runtime or pool (see `Drop`).
    pid: u32,
}

impl Drop for NativeTransaction {
    fn drop(&mut self) {
        let session = self
            .session
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if self.pid != std::process::id() {
            // Inherited through fork: a pooled connection would go back to a pool
            // whose locks another thread may have held at fork time. Leak it.
            std::mem::forget(session);
        }
        // Otherwise `session` drops here: an open transaction's connection is
        // discarded (PostgreSQL rolls it back), never pooled.
    }
}

impl NativeTransaction {
    /// Wraps a session that has begun.
    pub fn new(session: Session) -> Self {
        NativeTransaction {
            session: Mutex::new(Some(session)),
            pid: std::process::id(),
        }
    }

    /// Runs `op` on the open session with the GVL released. If Ruby interrupts the
    /// call, the session is dropped: its connection is closed, never pooled, and
    /// PostgreSQL rolls the transaction back.
    fn with_session<T>(
        &self,
        ruby: &Ruby,
        op: impl FnOnce(&mut Session, &Interrupt<'_>) -> Result<T>,
    ) -> RbResult<T> {
        // Taken out of the mutex while it runs, so no Ruby thread ever waits on this
        // lock while holding the GVL (a second thread using the same handle gets an
        // error instead of freezing the process).
        let taken = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(mut session) = taken else {
            return Err(to_ruby(
                ruby,
                Error::Config(
                    "this idempotent transaction has ended, or another thread is using it".into(),
                ),
            ));
        };
        match without_gvl(ruby, |interrupt| op(&mut session, interrupt)) {
            Ok(result) => {
                *self.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(session);
                result.map_err(|e| to_ruby(ruby, e))
            }
            // Interrupted: `session` drops here, its connection is closed, never pooled.
            Err(interrupt) => Err(interrupt),
        }
    }

    /// Runs `op` (already without the GVL: a protocol statement) on the open session,
    /// taken out of the mutex while it runs, so the body can use the same transaction
    /// between two statements. An interrupted statement drops the session: its
    /// connection is closed, never pooled, and PostgreSQL rolls the transaction back.
    pub fn on_session<T>(&self, op: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
        let taken = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(mut session) = taken else {
            return Err(Error::Config(
                "this idempotent transaction has ended, or another thread is using it".into(),
            ));
        };
        let done = op(&mut session);
        if !matches!(done, Err(Error::Interrupted)) {
            *self.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(session);
        }
        done
    }

    /// Ends the transaction with `commit` or rollback.
    pub(super) fn finish(&self, ruby: &Ruby, commit: bool) -> RbResult<bool> {
        let session = self
            .session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(session) = session else {
            return Ok(false);
        };
        let ending = |interrupt: &Interrupt<'_>| {
            if commit {
                session.commit(interrupt)
            } else {
                session.rollback(interrupt)
            }
        };
        without_gvl(ruby, ending)?.map_err(|e| to_ruby(ruby, e))?;
        Ok(true)
    }

    /// `query(sql, params)` → Array of Hashes (column name → typed value).
    fn query(ruby: &Ruby, rb_self: &Self, sql: String, params: RArray) -> RbResult<RArray> {
        let params = to_params(ruby, params)?;
        let rows = rb_self.with_session(ruby, |s, i| s.query(i, &sql, &params))?;
        let out = ruby.ary_new_capa(rows.len());
        for row in rows {
            let hash = ruby.hash_new();
            for (name, cell) in row {
                hash.aset(name, from_cell(ruby, cell)?)?;
            }
            out.push(hash)?;
        }
        Ok(out)
    }

    /// `exec(sql, params)` → Integer, the number of rows affected.
    fn exec(ruby: &Ruby, rb_self: &Self, sql: String, params: RArray) -> RbResult<u64> {
        let params = to_params(ruby, params)?;
        rb_self.with_session(ruby, |s, i| s.execute(i, &sql, &params))
    }

    /// `commit` → true, or false when the transaction had already ended.
    fn commit(ruby: &Ruby, rb_self: &Self) -> RbResult<bool> {
        rb_self.finish(ruby, true)
    }

    /// `rollback` → true, or false when the transaction had already ended.
    fn rollback(ruby: &Ruby, rb_self: &Self) -> RbResult<bool> {
        rb_self.finish(ruby, false)
    }

    /// `open?` → whether the transaction has not ended yet.
    fn is_open(&self) -> bool {
        self.session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

/// Ruby bind parameters → owned [`Param`]s (converted with the GVL held).
fn to_params(ruby: &Ruby, params: RArray) -> RbResult<Vec<Param>> {
    let mut out = Vec::with_capacity(params.len());
    for (i, value) in params.into_iter().enumerate() {
        out.push(to_param(ruby, value).map_err(|e| {
            magnus::Error::new(
                ruby.exception_arg_error(),
                format!("bind parameter ${}: {e}", i + 1),
            )
        })?);
    }
    Ok(out)
}

fn to_param(ruby: &Ruby, value: Value) -> RbResult<Param> {
    if value.is_nil() {
        return Ok(Param::Null);
    }
    if value.is_kind_of(ruby.class_true_class()) || value.is_kind_of(ruby.class_false_class()) {
        return Ok(Param::Bool(value.to_bool()));
    }
    if let Some(i) = Integer::from_value(value) {
        return Ok(Param::Int(i.to_i64()?));
    }
    if let Some(f) = Float::from_value(value) {
        return Ok(Param::Float(f.to_f64()));
    }
    if let Some(s) = RString::from_value(value) {
        let binary = s.enc_get() == ruby.ascii8bit_encindex();
        // SAFETY: the bytes are copied before any other Ruby call.
        let bytes = unsafe { s.as_slice() }.to_vec();
        return Ok(if binary {
            Param::Bytes(bytes)
        } else {
            Param::Text(String::from_utf8(bytes).map_err(|_| {
                magnus::Error::new(
                    ruby.exception_arg_error(),
                    "a String that is not valid UTF-8",
                )
            })?)
        });
    }
    if let Some(sym) = Symbol::from_value(value) {
        return Ok(Param::Text(sym.name()?.into_owned()));
    }
    let class: String = value.class().funcall("name", ())?;
    match class.as_str() {
        "Time" | "DateTime" | "ActiveSupport::TimeWithZone" => {
            let time: Value = value.funcall("to_time", ())?;
            let seconds: i64 = time.funcall("to_i", ())?;
            let nanos: u32 = time.funcall("nsec", ())?;
            chrono::DateTime::from_timestamp(seconds, nanos)
                .map(Param::Time)
                .ok_or_else(|| magnus::Error::new(ruby.exception_arg_error(), "a Time out of range"))
        }
        "Date" | "BigDecimal" => Ok(Param::Text(value.funcall("to_s", ())?)),
        "Hash" | "Array" => Ok(Param::Json(value.funcall("to_json", ())?)),
        other => Err(magnus::Error::new(
            ruby.exception_arg_error(),
            format!("{} cannot be bound; pass nil, true/false, Integer, Float, String, Symbol, Time, Date, BigDecimal, Hash or Array", idempotent_job_core::words::with_article(other)),
        )),
    }
}

/// A column value → the matching Ruby object.
fn from_cell(ruby: &Ruby, cell: Cell) -> RbResult<Value> {
    Ok(match cell {
        Cell::Null => ruby.qnil().as_value(),
        Cell::Bool(b) => ruby.into_value(b),
        Cell::Int(i) => ruby.into_value(i),
        Cell::Float(f) => ruby.into_value(f),
        Cell::Text(s) => ruby.into_value(s),
        Cell::Bytes(b) => ruby.enc_str_new(&b, ruby.ascii8bit_encoding()).as_value(),
        Cell::Json(text) => {
            let json: RModule = ruby.class_object().const_get("JSON")?;
            json.funcall("parse", (text,))?
        }
        Cell::Time(t) => ruby
            .time_new(t.timestamp(), i64::from(t.timestamp_subsec_micros()))?
            .as_value(),
        Cell::Date(y, m, d) => {
            let date: magnus::RClass = ruby.class_object().const_get("Date")?;
            date.funcall("new", (y, m, d))?
        }
    })
}

pub fn init(ruby: &Ruby, native: RModule) -> RbResult<()> {
    let class = native.define_class("Transaction", ruby.class_object())?;
    class.define_method("query", method!(NativeTransaction::query, 2))?;
    class.define_method("exec", method!(NativeTransaction::exec, 2))?;
    class.define_method("commit", method!(NativeTransaction::commit, 0))?;
    class.define_method("rollback", method!(NativeTransaction::rollback, 0))?;
    class.define_method("open?", method!(NativeTransaction::is_open, 0))?;
    Ok(())
}
