//! What one step of the `walks` example ranker costs on a real database:
//! `--walks` walks of `--length` rows from each of `--seeds` rows of a
//! table (evenly spaced, each observed at its own time), timed on the
//! thread's CPU clock (a loaded machine's waits do not count).
//!
//! ```text
//! cargo run --release --example walk_rate -- DB TABLE [--seeds N] [--walks W] [--length L]
//! ```

use std::time::Instant;

use headwater::format::Database;
use headwater::rng::Xoshiro256pp;
use headwater::sampler::walks::{WalkCounts, WalkGraph, WalkParams};

fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("an integer"))
    };
    let db = Database::open(&args[1]).expect("opens");
    let m = db.metadata();
    let t = m
        .tables
        .iter()
        .position(|x| x.name == args[2])
        .expect("a table of the database");
    let g = db.graph();
    let t0 = Instant::now();
    let wg = WalkGraph::new(&g).expect("fits");
    let built = t0.elapsed().as_secs_f64();
    let (lo, hi) = g.table_rows[t];
    let (seeds, walks, length) = (
        opt("--seeds", 64),
        opt("--walks", 10_000),
        opt("--length", 20),
    );
    let mut w = WalkCounts::default();
    let mut rng = Xoshiro256pp::seed_from_u64(1);
    let (c0, w0) = (thread_cpu_s(), Instant::now());
    let mut steps = 0u64;
    for i in 0..seeds {
        let seed = lo + ((u64::from(hi - lo) * i as u64) / seeds as u64) as u32;
        let time = g
            .time_of(seed)
            .filter(|&x| x != i64::MIN)
            .unwrap_or(i64::MAX);
        let p = WalkParams {
            num_walks: walks,
            walk_length: length,
            cutoff: time,
            bound: time,
            table: (lo, hi),
        };
        steps += w.walk(&wg, seed, &p, &mut rng, None).expect("no deadline");
    }
    let (cpu, wall) = (thread_cpu_s() - c0, w0.elapsed().as_secs_f64());
    println!(
        "{} seeds of {}: {steps} steps, {:.1} ns/step CPU ({:.1} wall), {:.1} contexts per CPU-s; graph {:.0} MiB built in {built:.2} s",
        seeds,
        args[2],
        cpu * 1e9 / steps as f64,
        wall * 1e9 / steps as f64,
        seeds as f64 / cpu,
        wg.heap_bytes() as f64 / 1_048_576.0,
    );
}
