//! What one step of the `walks` example ranker costs on a real database:
//! `--walks` walks of `--length` rows from each of `--seeds` rows of a
//! table (evenly spaced, each observed at its own time), timed on the
//! thread's CPU clock (a loaded machine's waits do not count).
//!
//! ```text
//! cargo run --release --example walk_rate -- DB TABLE [--seeds N] [--walks W] [--length L]
//!     [--mapped [--rounds R]]
//! ```
//!
//! With `--mapped`, also over the database's walk-graph file (`walks/`,
//! written by a sampler opened with `examples`): a first pass over a
//! fresh map (each block hashed at its first read), then `R` rounds
//! alternating the graph in memory, that map (the blocks its reads
//! touched now checked, the others not) and a map whose every block was
//! checked first, with the median of each.

use std::time::Instant;

use headwater::format::Database;
use headwater::ranking::walks::{WalkCounts, WalkGraph, WalkParams};
use headwater::rng::Xoshiro256pp;

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
    if args.iter().any(|a| a == "--mapped") {
        let run = |wg: &WalkGraph| rate(&g, wg, (lo, hi), (seeds, walks, length)).0;
        let key = WalkGraph::file_key(db.content_hash());
        let path = WalkGraph::path(db.dir(), key);
        let t0 = Instant::now();
        let lazy = WalkGraph::open(&path, key).expect("the walk graph's file");
        println!(
            "mapped, opened in {:.2} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
        let checked = WalkGraph::open(&path, key).expect("the walk graph's file");
        checked.check_all().expect("intact");
        println!("mapped, first pass: {:.1} ns/step CPU", run(&lazy));
        let mut ns = [vec![], vec![], vec![]];
        for _ in 0..opt("--rounds", 5) {
            for (k, wg) in [&wg, &lazy, &checked].into_iter().enumerate() {
                ns[k].push(run(wg));
            }
        }
        for (k, name) in [
            "in memory",
            "mapped, read blocks checked",
            "mapped, all checked",
        ]
        .iter()
        .enumerate()
        {
            ns[k].sort_by(f64::total_cmp);
            println!(
                "{name}: median {:.1} ns/step CPU of {:.1?}",
                ns[k][ns[k].len() / 2],
                ns[k]
            );
        }
        return;
    }
    let (c0, w0) = (thread_cpu_s(), Instant::now());
    let (_, steps) = rate(&g, &wg, (lo, hi), (seeds, walks, length));
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

/// The walks of `seeds` rows of the table `(lo, hi)` over `wg`: CPU
/// nanoseconds per step, and steps.
fn rate(
    g: &headwater::format::GraphView<'_>,
    wg: &WalkGraph,
    (lo, hi): (u32, u32),
    (seeds, walks, length): (usize, usize, usize),
) -> (f64, u64) {
    let mut w = WalkCounts::default();
    let mut rng = Xoshiro256pp::seed_from_u64(1);
    let c0 = thread_cpu_s();
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
        steps += w.walk(wg, seed, &p, &mut rng, None).expect("no deadline");
    }
    ((thread_cpu_s() - c0) * 1e9 / steps as f64, steps)
}
