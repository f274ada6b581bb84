//! What starting and stopping one claim's heartbeat costs, as a delivery pays it:
//! `cargo run --release --example heartbeat_cost -- URL [PAIRS]`. Nothing connects
//! (no renewal falls due within the run). Prints the caller's wall time inside
//! `start` + `stop` and the process's CPU time (every thread: the runtime's worker
//! included) per pair, median of 5 rounds, for 1 caller thread and for 10, back to
//! back and with a 300 µs "body" between start and stop (the runtime's worker parks
//! meanwhile, as it does between real deliveries).

use std::time::Instant;

use idempotent_job_core::config::Config;
use idempotent_job_core::store::Store;

/// The process's user + system CPU time in seconds (Linux: /proc/self/stat).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: heartbeat_cost URL [PAIRS]");
    let pairs: usize = args.next().map_or(20_000, |n| n.parse().expect("PAIRS"));
    let store = Store::new(Config::new(url)).unwrap();
    let pool = store.pool().unwrap();
    for (threads, body_us) in [(1usize, 0u64), (10, 0), (1, 300), (10, 300)] {
        let pairs = if body_us > 0 { pairs / 10 } else { pairs };
        let mut wall = Vec::new();
        let mut cpu = Vec::new();
        for _ in 0..5 {
            let c0 = cpu_seconds();
            let spent = std::sync::Mutex::new(0.0);
            std::thread::scope(|s| {
                for t in 0..threads {
                    let (pool, spent) = (pool.clone(), &spent);
                    s.spawn(move || {
                        let mut mine = 0.0;
                        for k in 0..pairs / threads {
                            let w0 = Instant::now();
                            let beat = pool.heartbeat(
                                "HeartbeatCost".into(),
                                format!("{t}-{k}"),
                                uuid::Uuid::new_v4(),
                                300.0,
                                3600.0,
                            );
                            let w1 = Instant::now();
                            if body_us > 0 {
                                std::thread::sleep(std::time::Duration::from_micros(body_us));
                            }
                            let w2 = Instant::now();
                            beat.stop();
                            mine += (w1 - w0 + w2.elapsed()).as_secs_f64();
                        }
                        *spent.lock().unwrap() += mine;
                    });
                }
            });
            wall.push(spent.into_inner().unwrap() * 1e6 / pairs as f64);
            cpu.push((cpu_seconds() - c0) * 1e6 / pairs as f64);
        }
        wall.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        println!(
            "{threads:>2} thread(s), body {body_us:>3} µs: {:.2} µs in start+stop (caller), \
             {:.2} µs CPU (all threads) per pair",
            wall[2], cpu[2]
        );
    }
}
