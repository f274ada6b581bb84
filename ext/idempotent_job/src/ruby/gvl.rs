//! Running core futures with the GVL released, interruptibly.
//!
//! `rb_thread_call_without_gvl2` runs the future on the calling thread (other Ruby
//! threads keep running). Its unblocking function, called by Ruby for Thread#raise,
//! Timeout, Thread#kill or shutdown, wakes a `Notify` that makes the future lose a
//! `select!`: the future is dropped, which detaches and cancels any connection it had
//! checked out (`core::store::Conn`). Once the GVL is back, pending interrupts are
//! processed under `rb_protect`, so Ruby's exception is returned as a value and
//! raised by magnus after every Rust frame has been dropped; nothing ever
//! longjmps over Rust code. Panics are caught and become `IdempotentJob::Error`.

use std::any::Any;
use std::ffi::c_void;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;

use magnus::rb_sys::{protect, AsRawValue};
use magnus::Ruby;
use tokio::runtime::Runtime;
use tokio::sync::Notify;

use super::errors::to_ruby;
use crate::core::error::Error;

struct Call<'a, Fut: Future> {
    runtime: &'a Runtime,
    future: Pin<&'a mut Fut>,
    notify: &'a Notify,
    out: Option<std::thread::Result<Option<Fut::Output>>>,
}

unsafe extern "C" fn run<Fut: Future>(data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the `Call` on `without_gvl`'s stack, alive for this call.
    let call = unsafe { &mut *(data as *mut Call<'_, Fut>) };
    let (runtime, notify) = (call.runtime, call.notify);
    let future = &mut call.future;
    call.out = Some(catch_unwind(AssertUnwindSafe(|| {
        runtime.block_on(async {
            tokio::select! {
                biased;
                _ = notify.notified() => None,
                value = future.as_mut() => Some(value),
            }
        })
    })));
    std::ptr::null_mut()
}

unsafe extern "C" fn unblock(data: *mut c_void) {
    // SAFETY: `data` is the `Notify` on `without_gvl`'s stack; `Notify` is Sync.
    // `notify_one` stores a permit, so a wake-up before the future polls is kept.
    unsafe { (*(data as *const Notify)).notify_one() };
}

fn panic_message(panic: Box<dyn Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Runs `future` on `runtime` without the GVL and returns its output.
///
/// If Ruby interrupts the thread, pending interrupts are processed with the GVL
/// back: when one raises (Thread#raise, Timeout, Thread#kill), the future is dropped
/// and Ruby's exception is returned as the error. When none raises (Thread#wakeup, a
/// trapped signal, an interrupt deferred by `handle_interrupt`), the SAME future is
/// resumed: a statement is never sent twice.
pub fn without_gvl<Fut: Future>(
    ruby: &Ruby,
    runtime: &Runtime,
    future: Fut,
) -> Result<Fut::Output, magnus::Error> {
    let mut future = std::pin::pin!(future);
    loop {
        let notify = Notify::new();
        let mut call = Call {
            runtime,
            future: future.as_mut(),
            notify: &notify,
            out: None,
        };
        // SAFETY: both pointers outlive the call; `run` and `unblock` only touch
        // what they are given; neither calls into Ruby.
        unsafe {
            rb_sys::rb_thread_call_without_gvl2(
                Some(run::<Fut>),
                &mut call as *mut Call<'_, Fut> as *mut c_void,
                Some(unblock),
                &notify as *const Notify as *mut c_void,
            );
        }
        match call.out.take() {
            Some(Ok(Some(value))) => return Ok(value),
            Some(Err(panic)) => return Err(to_ruby(ruby, Error::Panic(panic_message(panic)))),
            // Interrupted, or not started because an interrupt was already pending.
            Some(Ok(None)) | None => {
                protect(|| {
                    // SAFETY: called with the GVL held; a raise is caught by protect.
                    unsafe { rb_sys::rb_thread_check_ints() };
                    ruby.qnil().as_raw()
                })?;
            }
        }
    }
}
