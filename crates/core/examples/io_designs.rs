//! Prototype measurement of three ways to drive a statement's I/O, in one run,
//! interleaved (issue 14): `cargo run --release --example io_designs -- URL [ROUNDS]`.
//!
//! * `spawned`: today's design. One multi-thread runtime with one worker; each
//!   connection's `Connection` future is a task on that worker; the calling thread
//!   blocks in `Runtime::block_on` on the client's future. Every statement crosses
//!   threads twice (caller → connection task → caller).
//! * `shared_ct`: one current-thread runtime; connections spawned on it; the caller's
//!   `block_on` drives the runtime when it holds its core (other callers wait for it).
//! * `per_conn`: every connection owns a current-thread runtime; the caller polls the
//!   connection together with its statement inside that runtime's `block_on`, on its
//!   own thread (what the synchronous `postgres` crate does). No hand-off at all.
//!
//! Prints µs per round trip (median of rounds) for 1 thread and for 10 threads.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Instant;

use tokio::runtime::{Builder, Runtime};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

type Driver = Pin<Box<dyn Future<Output = Result<(), tokio_postgres::Error>> + Send>>;

const SQL: &str = "SELECT $1::int4 + 1";
const CALLS: usize = 2000;

trait Design: Sync {
    fn name(&self) -> &'static str;
    /// One statement on connection `i`.
    fn call(&self, i: usize, v: i32) -> i32;
}

/// A runtime with the connections spawned on it as tasks: `spawned` (multi-thread,
/// one worker) and `shared_ct` (current-thread).
struct Spawned {
    name: &'static str,
    rt: Runtime,
    clients: Vec<Client>,
}

impl Spawned {
    /// Ten connections, each spawned as a task on `rt`.
    fn connect(name: &'static str, rt: Runtime, config: &tokio_postgres::Config) -> Self {
        let clients = (0..10)
            .map(|_| {
                rt.block_on(async {
                    let (c, conn) = config.connect(NoTls).await.unwrap();
                    tokio::spawn(conn);
                    c
                })
            })
            .collect();
        Spawned { name, rt, clients }
    }
}

impl Design for Spawned {
    fn name(&self) -> &'static str {
        self.name
    }
    fn call(&self, i: usize, v: i32) -> i32 {
        let c = &self.clients[i];
        self.rt.block_on(async {
            let rows = c.query_typed(SQL, &[(&v, Type::INT4)]).await.unwrap();
            rows[0].get(0)
        })
    }
}

struct Own {
    rt: Runtime,
    client: Client,
    driver: Driver,
}

struct PerConn {
    conns: Vec<Mutex<Own>>,
}

impl Design for PerConn {
    fn name(&self) -> &'static str {
        "per-connection, caller drives"
    }
    fn call(&self, i: usize, v: i32) -> i32 {
        let mut own = self.conns[i].lock().unwrap();
        let Own { rt, client, driver } = &mut *own;
        let work = async {
            let rows = client.query_typed(SQL, &[(&v, Type::INT4)]).await.unwrap();
            rows[0].get::<_, i32>(0)
        };
        let mut work = std::pin::pin!(work);
        rt.block_on(std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = driver.as_mut().poll(cx) {
                panic!("connection ended: {r:?}");
            }
            work.as_mut().poll(cx)
        }))
    }
}

/// Like `per_conn`, but the connection is a task on the connection's own
/// current-thread runtime: it runs only inside the caller's `block_on`, on the
/// caller's thread, and waking it is a local queue push, not an eventfd write.
struct PerConnTask {
    conns: Vec<Mutex<(Runtime, Client)>>,
}

impl Design for PerConnTask {
    fn name(&self) -> &'static str {
        "per-connection task, caller drives"
    }
    fn call(&self, i: usize, v: i32) -> i32 {
        let own = self.conns[i].lock().unwrap();
        let (rt, client) = &*own;
        rt.block_on(async {
            let rows = client.query_typed(SQL, &[(&v, Type::INT4)]).await.unwrap();
            rows[0].get::<_, i32>(0)
        })
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: io_designs URL [ROUNDS]");
    let rounds: usize = args.next().map(|r| r.parse().unwrap()).unwrap_or(5);
    let config: tokio_postgres::Config = url.parse().unwrap();

    let rt = Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let spawned = Spawned::connect("spawned (today)", rt, &config);
    let rt = Builder::new_current_thread().enable_all().build().unwrap();
    let shared = Spawned::connect("current-thread shared", rt, &config);

    let conns = (0..10)
        .map(|_| {
            let rt = Builder::new_current_thread().enable_all().build().unwrap();
            let (client, conn) = rt.block_on(config.connect(NoTls)).unwrap();
            let driver: Driver = Box::pin(conn);
            Mutex::new(Own { rt, client, driver })
        })
        .collect();
    let per_conn = PerConn { conns };

    let conns = (0..10)
        .map(|_| {
            let rt = Builder::new_current_thread().enable_all().build().unwrap();
            let client = rt.block_on(async {
                let (client, conn) = config.connect(NoTls).await.unwrap();
                tokio::spawn(conn);
                client
            });
            Mutex::new((rt, client))
        })
        .collect();
    let per_conn_task = PerConnTask { conns };

    let designs: [&dyn Design; 4] = [&spawned, &shared, &per_conn, &per_conn_task];
    let mut one: Vec<Vec<f64>> = vec![vec![]; 4];
    let mut ten: Vec<Vec<f64>> = vec![vec![]; 4];
    for _ in 0..rounds {
        for (d, design) in designs.iter().enumerate() {
            let started = Instant::now();
            for n in 0..CALLS {
                assert_eq!(design.call(0, n as i32), n as i32 + 1);
            }
            one[d].push(started.elapsed().as_secs_f64() * 1e6 / CALLS as f64);

            let started = Instant::now();
            let design = Arc::new(*design);
            std::thread::scope(|s| {
                for t in 0..10 {
                    let design = design.clone();
                    s.spawn(move || {
                        for n in 0..CALLS / 5 {
                            design.call(t, n as i32);
                        }
                    });
                }
            });
            // wall time per statement over all threads
            ten[d].push(started.elapsed().as_secs_f64() * 1e6 / (CALLS * 2) as f64);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!("design                          1 thread µs/stmt   10 threads µs/stmt (wall)");
    for (d, design) in designs.iter().enumerate() {
        println!(
            "{:<32}{:>10.1}{:>22.1}",
            design.name(),
            median(&mut one[d]),
            median(&mut ten[d])
        );
    }
}
