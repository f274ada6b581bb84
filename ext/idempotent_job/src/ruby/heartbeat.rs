//! `IdempotentJob::Native::Heartbeat`: a running lease heartbeat (see
//! `core::heartbeat`), started by `Store#heartbeat`.

use magnus::{method, prelude::*, RHash, RModule, Ruby};

use super::convert::{Out, RbResult};
use idempotent_job_core::heartbeat::{Heartbeat, HeartbeatReader, HeartbeatReport};

#[magnus::wrap(class = "IdempotentJob::Native::Heartbeat", free_immediately, size)]
pub struct NativeHeartbeat(pub Heartbeat);

/// `IdempotentJob::Native::HeartbeatReader`: reads the heartbeat of a claim whose body
/// runs (handed to the protocol handler's `watch` by `Native::Protocol#perform`).
#[magnus::wrap(
    class = "IdempotentJob::Native::HeartbeatReader",
    free_immediately,
    size
)]
pub struct NativeHeartbeatReader(pub HeartbeatReader);

impl NativeHeartbeatReader {
    /// `report` → the Hash of `Native::Heartbeat#report` (it keeps answering after the
    /// heartbeat stopped).
    fn report(ruby: &Ruby, rb_self: &Self) -> RbResult<RHash> {
        heartbeat_hash(ruby, rb_self.0.report())
    }
}

/// A heartbeat report as the Hash `stop` and `report` answer.
pub fn heartbeat_hash(ruby: &Ruby, r: HeartbeatReport) -> RbResult<RHash> {
    let out = Out::new(ruby);
    out.set("renewals", r.renewals)?
        .set("lost", r.lost)?
        .set("max_run_reached", r.max_run_reached)?
        .set("last_error", r.last_error)?
        .set("failures", r.failures)?
        .set("since_confirmed", r.since_confirmed)?
        .set("in_doubt", r.in_doubt)?;
    Ok(out.hash)
}

impl NativeHeartbeat {
    /// `stop` → Hash `{renewals:, lost:, max_run_reached:, last_error:, failures:,
    /// since_confirmed: (seconds), in_doubt:}`; idempotent.
    fn stop(ruby: &Ruby, rb_self: &Self) -> RbResult<RHash> {
        heartbeat_hash(ruby, rb_self.0.stop())
    }

    /// `report` → the same Hash, without stopping.
    fn report(ruby: &Ruby, rb_self: &Self) -> RbResult<RHash> {
        heartbeat_hash(ruby, rb_self.0.report())
    }
}

pub fn init(ruby: &Ruby, native: RModule) -> RbResult<()> {
    let class = native.define_class("Heartbeat", ruby.class_object())?;
    class.define_method("stop", method!(NativeHeartbeat::stop, 0))?;
    class.define_method("report", method!(NativeHeartbeat::report, 0))?;
    let reader = native.define_class("HeartbeatReader", ruby.class_object())?;
    reader.define_method("report", method!(NativeHeartbeatReader::report, 0))?;
    Ok(())
}
