//! The single-node ceiling (docs/scaling.md): operations per second one PostgreSQL
//! takes from this core — first deliveries (the claim and the completion: two durable
//! commits) and duplicates of completed operations (one read) — from 1 to 64 threads,
//! each on its own pooled connection, for a few seconds per step.
//!
//! `cargo run --release -p idempotent_job_core --example ceiling -- $DATABASE_URL [seconds]`
//! (optionally `distributed` as a third argument: the distributed profile).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotent_job_core::config::{Config, DEFAULT_MAX_RESULT_BYTES};
use idempotent_job_core::conn::Interrupt;
use idempotent_job_core::protocol::{
    DeliveryRequest, Direct, DoorWords, JobOptions, Notes, Protocol, Step,
};
use idempotent_job_core::{migrate, store::Store};

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .expect("usage: ceiling DATABASE_URL [seconds] [distributed]");
    let seconds: f64 = args.next().map_or(3.0, |s| s.parse().expect("seconds"));
    let distributed = args.next().as_deref() == Some("distributed");
    let mut config = Config::new(url);
    config.pool_size = 64;
    if distributed {
        config.compatibility = "distributed".into();
    }
    let store = Arc::new(Store::new(config).unwrap());
    let pool = store.pool().unwrap();
    migrate::migrate(&pool, &Interrupt::none()).unwrap();
    let protocol = Arc::new(
        Protocol::new(
            "CeilingJob",
            JobOptions {
                heartbeat: false,
                ..JobOptions::default()
            },
            DoorWords::default(),
        )
        .unwrap(),
    );
    let run = uuid::Uuid::new_v4().simple().to_string();
    println!("threads  first deliveries/s  duplicates/s   (PostgreSQL on this machine, {seconds} s per step)");
    for threads in [1, 4, 16, 32, 64] {
        let firsts = measure(&store, &protocol, &run, threads, seconds, false);
        let duplicates = measure(&store, &protocol, &run, threads, seconds, true);
        println!("{threads:>7}  {firsts:>18.0}  {duplicates:>12.0}");
    }
}

/// Deliveries per second from `threads` threads for `seconds`: fresh operations, or
/// (`repeat`) the same completed operation of each thread again and again.
fn measure(
    store: &Arc<Store>,
    protocol: &Arc<Protocol>,
    run: &str,
    threads: usize,
    seconds: f64,
    repeat: bool,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, protocol, done) = (store.clone(), protocol.clone(), done.clone());
            let prefix = format!("{run}-{threads}-{t}");
            std::thread::spawn(move || {
                let pool = store.pool().unwrap();
                let i = Interrupt::none();
                let mut n = 0u64;
                while Instant::now() < until {
                    let key = if repeat {
                        format!("{prefix}-0")
                    } else {
                        format!("{prefix}-{n}")
                    };
                    let delivery = DeliveryRequest {
                        job_type: "CeilingJob".into(),
                        operation_key: key,
                        ..DeliveryRequest::default()
                    };
                    let mut notes = Notes::new();
                    let mut channel = Direct::new(pool.clone(), false);
                    match protocol
                        .begin(&mut channel, &i, &delivery, &mut notes)
                        .unwrap()
                    {
                        Step::Run(claim) => {
                            protocol
                                .complete(
                                    &mut channel,
                                    &i,
                                    claim,
                                    None,
                                    DEFAULT_MAX_RESULT_BYTES,
                                    &mut notes,
                                )
                                .unwrap();
                        }
                        Step::Skip(_) => {}
                        other => panic!("unexpected {other:?}"),
                    }
                    n += 1;
                }
                // The first repeat of each thread was its first delivery.
                done.fetch_add(n.saturating_sub(repeat as u64), Ordering::Relaxed);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / seconds
}
