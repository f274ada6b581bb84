//! What a Ruby body raised, or how it was left, in the core's terms ([`Body::Raised`]):
//! the exception's class name and message read without running its methods where a
//! method could replace it, and the door's crash rule over its causes (Python's
//! counterpart is `raised` in `python/src/protocol.rs`: no jumps, no `crash?` there).

use magnus::rb_sys::{AsRawId, AsRawValue, FromRawValue};
use magnus::{
    error::{ErrorType, Tag},
    value::ReprValue,
    RString, Ruby, Value,
};

use super::convert::RbResult;
use idempotent_job_core::protocol::Body;

/// What the body raised, for the release: its class name, its message (or a note
/// that `#message` raised: the exception is still released and re-raised unchanged)
/// and whether the door calls it a crash. A jump with no exception: [`left_body`].
pub(super) fn raised_body(
    ruby: &Ruby,
    door: Value,
    left: magnus::Error,
) -> Body<Value, magnus::Error> {
    let ErrorType::Exception(exception) = left.error_type() else {
        return left_body(left);
    };
    let exception = exception.as_value();
    // The class's own name (no Ruby method runs, so an overridden `name` that raises or
    // answers bytes that are not UTF-8 cannot replace what the body raised).
    // SAFETY: the name is copied before any Ruby code runs again.
    let class = unsafe { exception.classname() }.into_owned();
    let message = match exception
        .funcall::<_, _, Value>("message", ())
        .and_then(|m| m.funcall::<_, _, RString>("to_s", ()))
    {
        Ok(text) => text.to_string().unwrap_or_else(|_| {
            // SAFETY: the bytes are copied before any Ruby code runs again.
            String::from_utf8_lossy(unsafe { text.as_slice() }).into_owned()
        }),
        Err(e) => match e.value() {
            // SAFETY: the name is copied before any Ruby code runs again.
            Some(v) => format!("(#message raised {})", unsafe { v.classname() }),
            None => return left_body(e),
        },
    };
    let (crash, message) = match crash(ruby, door, exception) {
        Ok(crash) => (crash, message),
        // The door's `crash?` raised: what the body raised still goes out and its
        // claim is handled by the base rule (see [`signalled`]); the release's
        // message (the record's `last_error`, the log) names what `crash?` raised. A
        // jump with no exception (Thread#kill landing in `crash?`) goes on: the
        // thread is going away.
        Err(e) => match e.value() {
            Some(raised) => (
                signalled(ruby, exception),
                // SAFETY: the name is copied before any Ruby code runs again.
                format!(
                    "{message} (the door's crash? raised {}; the claim was kept or released \
                     by the base rule: kept for a SignalException)",
                    unsafe { raised.classname() }
                ),
            ),
            None => return left_body(e),
        },
    };
    Body::Raised {
        raised: left,
        class,
        message,
        crash,
    }
}

/// The base door's crash rule (`IdempotentJob::Door#crash?`: a SignalException, so
/// an interrupt or Sidekiq::Shutdown) on `error` or any of its causes, read by the
/// VM with no Ruby method: what decides a claim when the door's own `crash?`
/// raised. A body that may have done its effect before a signal keeps its claim
/// for its lease; any other exception releases it, as for a raising body.
fn signalled(ruby: &Ruby, error: Value) -> bool {
    let signal = ruby.exception_signal();
    any_cause(ruby, error, |e| Ok(e.is_kind_of(signal))).unwrap_or(false)
}

/// The door's crash rule (`door.crash?`) on `error` or any of its causes: the claim
/// is kept.
fn crash(ruby: &Ruby, door: Value, error: Value) -> RbResult<bool> {
    any_cause(ruby, error, |e| {
        Ok(door.funcall::<_, _, Value>("crash?", (e,))?.to_bool())
    })
}

/// Whether `test` holds for `error` or any of its causes. Each cause is read as
/// Ruby's own error printer reads it (the exception's internal `cause`, no Ruby
/// method runs: a `cause` method that raises, answers something else or makes up a
/// new exception each time cannot replace what the body raised or make the walk
/// endless); a chain that loops ends at its first repeat (Brent's cycle finding: the
/// walk stays linear however long the chain).
fn any_cause(
    ruby: &Ruby,
    error: Value,
    mut test: impl FnMut(Value) -> RbResult<bool>,
) -> RbResult<bool> {
    let id = ruby.intern("cause").as_raw();
    let cause = |exception: Value| -> Option<Value> {
        // SAFETY: `rb_attr_get` reads an instance variable; no Ruby code runs.
        let next = unsafe { Value::from_raw(rb_sys::rb_attr_get(exception.as_raw(), id)) };
        next.is_kind_of(ruby.exception_exception()).then_some(next)
    };
    // `marker` stands `power` steps behind; meeting it again means a loop.
    let (mut marker, mut current) = (error, Some(error));
    let (mut power, mut steps) = (1usize, 0usize);
    while let Some(exception) = current {
        if test(exception)? {
            return Ok(true);
        }
        current = cause(exception);
        steps += 1;
        if current.is_some_and(|next| next.as_raw() == marker.as_raw()) {
            break;
        }
        if steps == power {
            (marker, power, steps) = (current.unwrap_or(marker), power * 2, 0);
        }
    }
    Ok(false)
}

/// The body's end when it left by a jump with no exception to hand back (what it raised
/// goes through [`raised_body`]). Thread#kill (a fatal jump): the thread is going
/// away, so the claim is kept until its lease ends (a crash). `throw` (Timeout.timeout
/// without an error class on Ruby before 3.3 is one), `break` or a non-local `return`
/// out of the body: the worker goes on, so the claim is released like a raising body's
/// (a retry runs at once) and the jump goes on after the release. An exception the
/// gem's own callbacks raised (the Claim) is released and re-raised the same way (the
/// door's `crash?` raising: see [`raised_body`]).
pub(super) fn left_body(left: magnus::Error) -> Body<Value, magnus::Error> {
    let (class, message, crash) = match left.error_type() {
        ErrorType::Jump(Tag::Fatal) => (String::new(), String::new(), true),
        ErrorType::Jump(tag) => {
            let word = match tag {
                Tag::Throw => "throw",
                Tag::Break => "break",
                Tag::Return => "return",
                Tag::Next => "next",
                Tag::Retry => "retry",
                Tag::Redo => "redo",
                Tag::Raise | Tag::Fatal => "raise",
            };
            (
                format!("({word})"),
                format!("the body was left by `{word}`, with no exception"),
                false,
            )
        }
        _ => ("IdempotentJob::Error".to_string(), left.to_string(), false),
    };
    Body::Raised {
        raised: left,
        class,
        message,
        crash,
    }
}
