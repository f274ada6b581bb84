//! Running core calls with the GVL released, interruptibly.
//!
//! `rb_thread_call_without_gvl2` runs the call on the calling thread (other Ruby
//! threads keep running); the call drives its own statement's I/O there (see
//! `core::store`). Its unblocking function, called by Ruby for Thread#raise, Timeout,
//! Thread#kill, Thread#wakeup, a signal or shutdown, wakes the call's
//! [`Interrupt`]. The woken call takes the GVL back for a moment
//! (`rb_thread_call_with_gvl`) and processes pending interrupts under `rb_protect`:
//! when one raises, the exception is kept, the call gives up (its connection is
//! discarded and its statement cancelled) and the exception is returned as a value,
//! raised by magnus after every Rust frame has been dropped; when none raises, the
//! SAME future is resumed, so a statement is never sent twice. Nothing ever longjmps
//! over Rust code. Panics are caught and become `IdempotentJob::Error`.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use magnus::rb_sys::protect;
use magnus::Ruby;
use tokio::sync::Notify;

use super::errors::to_ruby;
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::Error;

struct Call<'a, F, T> {
    op: Option<F>,
    interrupt: &'a Interrupt<'a>,
    out: Option<std::thread::Result<T>>,
}

unsafe extern "C" fn run<F: FnOnce(&Interrupt<'_>) -> T, T>(data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the `Call` on `without_gvl`'s stack, alive for this call.
    let call = unsafe { &mut *(data as *mut Call<'_, F, T>) };
    if let Some(op) = call.op.take() {
        let interrupt = call.interrupt;
        call.out = Some(catch_unwind(AssertUnwindSafe(|| op(interrupt))));
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn unblock(data: *mut c_void) {
    // SAFETY: `data` is the `Notify` of the `Interrupt` on `without_gvl`'s stack;
    // `Notify` is Sync. `notify_one` stores a permit, so a wake-up before the call
    // blocks is kept.
    unsafe { (*(data as *const Notify)).notify_one() };
}

/// Processes pending interrupts; `data` is a `Option<magnus::Error>` slot that
/// receives the exception one of them raised. Runs with the GVL.
unsafe extern "C" fn check_ints(data: *mut c_void) -> *mut c_void {
    // SAFETY: `data` is the slot on `without_gvl`'s stack.
    let slot = unsafe { &mut *(data as *mut Option<magnus::Error>) };
    let checked = protect(|| {
        // SAFETY: called with the GVL held; a raise is caught by protect.
        unsafe { rb_sys::rb_thread_check_ints() };
        rb_sys::Qnil as rb_sys::VALUE
    });
    if let Err(e) = checked {
        *slot = Some(e);
    }
    std::ptr::null_mut()
}

fn pending_exception(slot: &mut Option<magnus::Error>, with_gvl: bool) {
    let data = slot as *mut Option<magnus::Error> as *mut c_void;
    // SAFETY: `check_ints` only touches `slot`, alive for this call; with_gvl is
    // true only on a thread that released the GVL through `without_gvl`.
    unsafe {
        if with_gvl {
            rb_sys::rb_thread_call_with_gvl(Some(check_ints), data);
        } else {
            check_ints(data);
        }
    }
}

fn panic_message(panic: Box<dyn Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Runs `op` on the calling thread without the GVL and returns its output.
///
/// `op` receives the [`Interrupt`] that Ruby's unblocking function wakes. If Ruby
/// interrupts the thread and a pending interrupt raises (Thread#raise, Timeout,
/// Thread#kill), `op` gives up (`Error::Interrupted`) and Ruby's exception is returned
/// as the error. When none raises (Thread#wakeup, a trapped signal, an interrupt
/// deferred by `handle_interrupt`), `op` carries on with the same future.
pub fn without_gvl<T, F: FnOnce(&Interrupt<'_>) -> T>(
    ruby: &Ruby,
    op: F,
) -> Result<T, magnus::Error> {
    let raised: RefCell<Option<magnus::Error>> = RefCell::new(None);
    let on_wake = || {
        let mut slot = None;
        pending_exception(&mut slot, true);
        let gives_up = slot.is_some();
        if gives_up {
            *raised.borrow_mut() = slot;
        }
        gives_up
    };
    let interrupt = Interrupt::new(&on_wake);
    let mut call = Call {
        op: Some(op),
        interrupt: &interrupt,
        out: None,
    };
    loop {
        // SAFETY: both pointers outlive the call; `run` and `unblock` only touch
        // what they are given; `run` calls into Ruby only through
        // `rb_thread_call_with_gvl`.
        unsafe {
            rb_sys::rb_thread_call_without_gvl2(
                Some(run::<F, T>),
                &mut call as *mut Call<'_, F, T> as *mut c_void,
                Some(unblock),
                interrupt.notifier() as *const Notify as *mut c_void,
            );
        }
        if let Some(exception) = raised.borrow_mut().take() {
            return Err(exception);
        }
        match call.out.take() {
            Some(Ok(value)) => return Ok(value),
            Some(Err(panic)) => return Err(to_ruby(ruby, Error::Panic(panic_message(panic)))),
            // Not started: an interrupt was already pending.
            None => {
                let mut slot = None;
                pending_exception(&mut slot, false);
                if let Some(exception) = slot {
                    return Err(exception);
                }
            }
        }
    }
}
