//! Running core calls with the GIL released, interruptibly.
//!
//! [`detached`] releases the GIL (`Python::detach`) for the whole call, which drives
//! its own statement's I/O on the calling thread (see `idempotent_job_core::store`).
//! No Python object crosses into the detached closure: only owned Rust values.
//!
//! **Interrupts.** CPython runs signal handlers (SIGINT's KeyboardInterrupt, Celery's
//! soft time limit, which raises `SoftTimeLimitExceeded` from a SIGUSR1 handler) on the
//! main thread only, between bytecodes; a thread blocked in native code never gets
//! there, and CPython has no unblocking function to call. So while the main thread is
//! blocked here, a ticker thread wakes the call's [`Interrupt`] every [`TICK`]; the
//! woken call takes the GIL for a moment and runs `Python::check_signals`. When a
//! handler raises, the call gives up (its connection is discarded and its statement
//! cancelled by the core) and the handler's exception is raised once every Rust frame
//! has been dropped; otherwise the SAME future is resumed, so a statement is never sent
//! twice. Other threads are never woken: Python delivers no signal to them.
//!
//! **Fork.** The ticker remembers the process that started it. A forked child (Celery's
//! prefork pool) finds a different pid and starts its own ticker (the parent's thread
//! does not exist in the child); the parent's state is leaked, never touched.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use tokio::sync::Notify;

use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::error::Error;

/// How often a blocked main-thread call looks for a pending Python signal.
const TICK: Duration = Duration::from_millis(50);

/// The process's ticker: the `Notify` of the main thread's blocked call (its address,
/// 0 when none), woken every [`TICK`] under the lock.
struct Ticker {
    pid: u32,
    waiting: Mutex<usize>,
}

static TICKER: AtomicPtr<Ticker> = AtomicPtr::new(std::ptr::null_mut());

/// This process's ticker, started on first use (and again in a forked child).
fn ticker() -> &'static Ticker {
    let pid = std::process::id();
    let current = TICKER.load(Ordering::Acquire);
    // SAFETY: a published ticker is leaked, never freed.
    if let Some(t) = unsafe { current.as_ref() } {
        if t.pid == pid {
            return t;
        }
    }
    let fresh: &'static Ticker = Box::leak(Box::new(Ticker {
        pid,
        waiting: Mutex::new(0),
    }));
    let ptr = fresh as *const Ticker as *mut Ticker;
    if let Err(other) = TICKER.compare_exchange(current, ptr, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: as above.
        if let Some(t) = unsafe { other.as_ref() } {
            if t.pid == pid {
                return t;
            }
        }
    }
    std::thread::Builder::new()
        .name("idempotent_job-signals".into())
        .spawn(move || loop {
            std::thread::sleep(TICK);
            if std::process::id() != fresh.pid {
                return;
            }
            let waiting = fresh.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if *waiting != 0 {
                // SAFETY: the address is that of a live `Notify`: [`Registered`] clears
                // it under this lock before the `Notify` is dropped.
                unsafe { (*(*waiting as *const Notify)).notify_one() };
            }
        })
        .ok();
    fresh
}

/// The main thread's blocked call, registered with the ticker until dropped.
struct Registered(&'static Ticker);

impl Registered {
    fn new(notify: &Notify) -> Registered {
        let t = ticker();
        *t.waiting.lock().unwrap_or_else(|p| p.into_inner()) = notify as *const Notify as usize;
        Registered(t)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        *self.0.waiting.lock().unwrap_or_else(|p| p.into_inner()) = 0;
    }
}

/// Whether the calling thread is Python's main thread (the only one that runs signal
/// handlers).
fn on_main_thread(py: Python<'_>) -> bool {
    let Ok(threading) = py.import("threading") else {
        return false;
    };
    let (Ok(main), Ok(current)) = (
        threading.call_method0("main_thread"),
        threading.call_method0("current_thread"),
    ) else {
        return false;
    };
    main.is(&current)
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Runs `op` on the calling thread with the GIL released and returns its output.
///
/// `op` receives the [`Interrupt`] that the ticker wakes (on the main thread; on any
/// other thread nothing wakes it). When a Python signal handler raises meanwhile
/// (KeyboardInterrupt, Celery's `SoftTimeLimitExceeded`), `op` gives up
/// ([`Error::Interrupted`]) and that exception is returned as the error. A panic
/// becomes `IdempotentJobError`.
pub fn detached<T: Send>(
    py: Python<'_>,
    op: impl FnOnce(&Interrupt<'_>) -> idempotent_job_core::error::Result<T> + Send,
) -> PyResult<T> {
    let main = on_main_thread(py);
    let raised: Mutex<Option<PyErr>> = Mutex::new(None);
    let out = py.detach(|| {
        let on_wake = || {
            let pending = Python::attach(|py| py.check_signals());
            match pending {
                Ok(()) => false,
                Err(e) => {
                    *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    true
                }
            }
        };
        let interrupt = Interrupt::new(&on_wake);
        let _registered = main.then(|| Registered::new(interrupt.notifier()));
        catch_unwind(AssertUnwindSafe(|| op(&interrupt)))
    });
    if let Some(e) = raised.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    match out {
        Ok(result) => result.map_err(crate::errors::to_py),
        Err(panic) => Err(crate::errors::to_py(Error::Panic(panic_message(panic)))),
    }
}
