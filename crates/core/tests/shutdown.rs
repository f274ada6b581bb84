//! A store dropped (a Ruby GC, a Python object freed) while its background runtime
//! still works for it: the runtime must not be stopped under that work. Here the
//! repeat bookkeeping's writer is connecting (to a listener of the test's that
//! accepts and never answers, as a server on a hung network) when the store goes;
//! stopping the runtime then made the writer's thread panic at its next use of the
//! runtime's timer ("A Tokio 1.x context was found, but it is being shutdown").
//!
//! One test in its own binary: it installs a process-wide panic hook.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use idempotent_job_core::bookkeeping::Repeat;
use idempotent_job_core::config::Config;
use idempotent_job_core::store::Store;

/// Panics seen on the background runtime's threads (named `idempotent_job`).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[test]
fn a_dropped_store_stops_its_runtime_only_after_its_background_writer() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some("idempotent_job") {
            let mut panics = PANICS.lock().unwrap_or_else(|p| p.into_inner());
            panics.push(info.to_string());
        }
        default(info);
    }));

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut config = Config::new(format!("postgres://postgres@127.0.0.1:{port}/none"));
    config.deadline = 1.0;
    config.pool_size = 1;
    let store = Store::new(config).unwrap();
    let bookkeeper = store.pool().unwrap().bookkeeper().clone();
    bookkeeper.record(Repeat {
        job_type: "ShutdownJob".into(),
        operation_key: "k".into(),
        at: Utc::now(),
        job_class: None,
        decision: "completed",
        facts: None,
        count: true,
        returning: false,
        mismatch: false,
        replayed: false,
        xid: None,
    });

    // The writer's connection reached the "server": its batch is being written.
    let (socket, _) = listener.accept().unwrap();
    drop(store);
    // Every connection from now on fails at once: the writer retries until its deadline.
    drop(socket);
    drop(listener);

    // The runtime's work for the store holds the bookkeeper (the writer's task, its
    // batch's thread, the closing thread): once only this test does, all of it ended.
    let given_up = Instant::now() + Duration::from_secs(120);
    while Arc::strong_count(&bookkeeper) > 1 {
        assert!(
            Instant::now() < given_up,
            "the dropped store's runtime never ended"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let panics = PANICS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        panics.is_empty(),
        "the background runtime's threads panicked: {panics:?}"
    );
    assert_eq!(
        bookkeeper.pending("ShutdownJob", "k"),
        1,
        "nothing was written"
    );
}
