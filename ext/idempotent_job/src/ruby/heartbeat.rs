//! `IdempotentJob::Native::HeartbeatReader` (the heartbeat of a claim whose body runs;
//! see `core::heartbeat`) and `Native.heartbeat_alarm` (what the gem's heartbeat watch
//! thread sleeps in).

use magnus::{function, method, prelude::*, RHash, RModule, Ruby};

use super::convert::{Out, RbResult};
use super::errors::to_ruby;
use super::gvl::without_gvl;
use idempotent_job_core::heartbeat::{wait_for_alarm, HeartbeatReader, HeartbeatReport};

/// `IdempotentJob::Native::HeartbeatReader`: reads the heartbeat of a claim whose body
/// runs (handed to the protocol handler's `watch` by `Native::Protocol#perform`).
#[magnus::wrap(
    class = "IdempotentJob::Native::HeartbeatReader",
    free_immediately,
    size
)]
pub struct NativeHeartbeatReader(pub HeartbeatReader);

impl NativeHeartbeatReader {
    /// `report` → Hash `{renewals:, lost:, max_run_reached:, last_error:, failures:,
    /// since_confirmed: (seconds), in_doubt:}` (it keeps answering after the heartbeat
    /// stopped).
    fn report(ruby: &Ruby, rb_self: &Self) -> RbResult<RHash> {
        heartbeat_hash(ruby, rb_self.0.report())
    }
}

/// A heartbeat report as the Hash `HeartbeatReader#report` answers.
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

/// `Native.heartbeat_alarm(seen)` → Integer: blocks the calling thread, the GVL
/// released, until a lease renewal of this process fails after the `seen`-th (the
/// core's heartbeat timer rings it: `core::heartbeat::wait_for_alarm`), then the count
/// of failed renewals so far (at once when it already differs from `seen`). Never
/// times out; Thread#kill, Thread#raise and Timeout interrupt it (their exception is
/// raised). The gem's heartbeat watch thread sleeps here.
fn heartbeat_alarm(ruby: &Ruby, seen: u64) -> RbResult<u64> {
    without_gvl(ruby, |i| wait_for_alarm(seen, None, i))?.map_err(|e| to_ruby(ruby, e))
}

pub fn init(ruby: &Ruby, native: RModule) -> RbResult<()> {
    let reader = native.define_class("HeartbeatReader", ruby.class_object())?;
    reader.define_method("report", method!(NativeHeartbeatReader::report, 0))?;
    native.define_module_function("heartbeat_alarm", function!(heartbeat_alarm, 1))?;
    Ok(())
}
