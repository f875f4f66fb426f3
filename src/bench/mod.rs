//! The measurement behind `headwater bench`: steady-state batch production
//! on one thread count, with per-stage times.
//!
//! Runs the producer's batch stream ([`SamplerCore::stream_batches`], as
//! many batches in flight as the producer builds) on the calling thread, without the
//! prefetch channel, so the figure is the sampler's own throughput; the
//! Python side adds handoff latency and thread scaling from several runs in
//! the same process. `recall.rs` is `headwater bench --ranker-recall`.

mod recall;

pub use recall::TaskRecall;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::config::SamplerConfig;
use crate::error::Result;
use crate::readings::stage;
use crate::sampler::{current_rss_bytes, SamplerCore, SplitTelemetry};
use crate::seeds::Split;

/// One benchmark run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRun {
    /// Worker threads.
    pub threads: usize,
    /// Whether telemetry was recorded and drained per batch.
    pub telemetry: bool,
    /// Batches timed (after the warm-up).
    pub batches: u64,
    /// Wall time of the timed batches.
    pub seconds: f64,
    /// Throughput in batches per second.
    pub batches_per_s: f64,
    /// Throughput in useful (non-padding) cells per second.
    pub cells_per_s: f64,
    /// Seeds (contexts) per second.
    pub seeds_per_s: f64,
    /// Sequence positions (`B·S`, padding included: the token budget
    /// delivered) per second.
    pub tokens_per_s: f64,
    /// Process CPU seconds (every thread) over the timed batches.
    pub cpu_seconds: f64,
    /// Sequence positions per process CPU second.
    pub tokens_per_cpu_s: f64,
    /// Whether several seeds' contexts were packed per sequence.
    pub pack: bool,
    /// `pack_factor` with `pack` (0: per task; `seeds_per_s / batches_per_s / B`
    /// is the measured mean), else 1.
    pub segments: usize,
    /// Share of contexts cut by a packing budget below `S`.
    pub contexts_cut: f64,
    /// Mean share of non-padding cells.
    pub fill: f64,
    /// Mean milliseconds per batch: BFS, assembly + permutations, text
    /// dedup + gather, total.
    pub bfs_ms: f64,
    /// Mean assembly + permutations time per batch (ms).
    pub assemble_ms: f64,
    /// Mean text dedup + gather time per batch (ms).
    pub collate_ms: f64,
    /// Mean whole-batch time (ms).
    pub total_ms: f64,
    /// Process RSS after the run (bytes).
    pub rss_bytes: u64,
    /// Databases sampled (a mixture when > 1).
    pub databases: usize,
    /// Seconds from opening the databases to the first batch made.
    pub first_batch_seconds: f64,
    /// Mean microseconds per batch spent recording it and draining the
    /// step values (0 with telemetry off).
    pub telemetry_us: f64,
    /// Values one drain returns (the packed vector's length).
    pub drained_values: usize,
    /// Share of the timed batches' probed working-set pages already in
    /// the page cache (1 when nothing was probed).
    pub working_set_resident: f64,
    /// Bytes the timed batches read from storage per byte they used (0
    /// when they used none).
    pub read_amplification: f64,
}

/// A timed window on the wall clock (Unix seconds), the same for several
/// processes: each counts the batches it finishes inside it, so their sum
/// is what they made together.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// When counting starts (after the opening and the warm-up).
    pub start: f64,
    /// When it stops.
    pub stop: f64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// How many batches a run times after its warm-up.
#[derive(Debug, Clone, Copy)]
pub enum Timed {
    /// This many batches.
    Steps(u64),
    /// The batches finished inside this wall-clock window.
    Window(Window),
    /// Batches until this many seconds have passed, the one that crosses
    /// the mark included (so a run whose batches each take longer than
    /// the span still times one): for slow storage, where a fixed count
    /// of batches could take hours.
    Seconds(f64),
}

/// Produce `warmup` then the `timed` train batches with `threads` worker
/// threads. With telemetry on, every batch is also recorded and drained, as
/// a training loop with the step hook would. A window's warm-up that ends
/// after the window starts is an error.
pub fn bench_run(
    db_paths: &[PathBuf],
    mut cfg: SamplerConfig,
    threads: usize,
    warmup: u64,
    timed: Timed,
) -> Result<BenchRun> {
    let (steps, window, seconds) = check_timed(timed)?;
    cfg.num_threads = Some(threads);
    let telemetry = cfg.telemetry;
    let t_open = Instant::now();
    let core = Arc::new(SamplerCore::open_mixture(db_paths, cfg)?);
    let mut recorder = SplitTelemetry::new(&core.schema, Vec::new());
    let mut drained = Vec::new();
    let mut state = core.split_state(Split::Train);
    core.make_batch(&mut state)?;
    let first_batch_seconds = t_open.elapsed().as_secs_f64();
    for _ in 1..warmup {
        core.make_batch(&mut state)?;
    }
    let mut tally = Tally::default();
    let mut failure = None;
    if let Some(w) = window {
        let late = unix_now() - w.start;
        if late > 0.0 {
            return Err(invalid_window(format!(
                "opening and {warmup} warm-up batches ended {late:.2} s after the window's start; start it later"
            )));
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(-late));
    }
    let t0 = Instant::now();
    let cpu0 = crate::probes::process_cpu_ns();
    // Timed to the last counted batch (the builds still in flight after it
    // are finished but not counted).
    let mut t_last = t0;
    let mut cpu_last = cpu0;
    let stop_after = window.map(|w| w.stop - w.start);
    let depth = if steps == 0 && window.is_none() && seconds.is_none() {
        0
    } else {
        core.stream_depth()
    };
    core.stream_batches(
        &mut state,
        depth,
        |_, _| None,
        |b| {
            let b = match b {
                Ok(b) => b,
                Err(e) => {
                    failure = Some(e);
                    return false;
                }
            };
            if stop_after.is_some_and(|span| t0.elapsed().as_secs_f64() >= span) {
                return false;
            }
            if telemetry {
                let t = Instant::now();
                recorder.deliver(&b.readings, 0, 0.0);
                recorder.drain.drain_values(&core.schema, &mut drained);
                tally.telemetry_ns += t.elapsed().as_nanos() as u64;
            }
            tally.add(&b);
            t_last = Instant::now();
            cpu_last = crate::probes::process_cpu_ns();
            if let Some(s) = seconds {
                return (t_last - t0).as_secs_f64() < s;
            }
            stop_after.is_some() || tally.made < steps
        },
    );
    if let Some(e) = failure {
        return Err(e);
    }
    let secs = match stop_after {
        Some(span) => span,
        None => (t_last - t0).as_secs_f64(),
    };
    tally.cpu_ns = cpu_last.saturating_sub(cpu0);
    Ok(tally.run(&core, threads, telemetry, secs, first_batch_seconds))
}

/// `timed` as (steps, window, seconds), refused before the opening and the
/// warm-up (seconds on a large database) when it cannot be timed.
fn check_timed(timed: Timed) -> Result<(u64, Option<Window>, Option<f64>)> {
    let (steps, window, seconds) = match timed {
        Timed::Steps(n) => (n, None, None),
        Timed::Window(w) => (0, Some(w), None),
        Timed::Seconds(s) => (0, None, Some(s)),
    };
    if let Some(s) = seconds {
        if !(s > 0.0 && s.is_finite()) {
            return Err(crate::error::Error::InvalidArgument {
                name: "seconds".into(),
                what: format!("{s} is not a positive number of seconds"),
            });
        }
    }
    if let Some(w) = window {
        if w.stop.partial_cmp(&w.start) != Some(std::cmp::Ordering::Greater) {
            return Err(invalid_window(format!(
                "stop {} is not after start {}",
                w.stop, w.start
            )));
        }
    }
    Ok((steps, window, seconds))
}

fn invalid_window(what: String) -> crate::error::Error {
    crate::error::Error::InvalidArgument {
        name: "window".into(),
        what,
    }
}

/// What the timed batches added up to.
#[derive(Default)]
struct Tally {
    telemetry_ns: u64,
    cpu_ns: u64,
    stage: [u64; 4],
    cells: u64,
    slots: u64,
    seeds: u64,
    cut: u64,
    made: u64,
    probed: u64,
    resident: u64,
    read_bytes: u64,
    useful_bytes: u64,
}

impl Tally {
    fn add(&mut self, b: &crate::sampler::MadeBatch) {
        for (acc, x) in self.stage.iter_mut().zip(b.readings.stage_ns) {
            *acc += x;
        }
        let seqs = &b.readings.seqs;
        self.cells += seqs.iter().map(|s| u64::from(s.cells)).sum::<u64>();
        self.slots += (b.batch_size * b.seq_len) as u64;
        self.seeds += b.seeds.len() as u64;
        self.cut += seqs.iter().map(|s| u64::from(s.contexts_cut)).sum::<u64>();
        self.made += 1;
        let r = &b.readings;
        self.probed += u64::from(r.pages_probed);
        self.resident += u64::from(r.pages_resident);
        self.read_bytes += r.read_bytes;
        self.useful_bytes += r.useful_bytes;
    }

    /// The run's figures over `secs` seconds.
    fn run(
        &self,
        core: &SamplerCore,
        threads: usize,
        telemetry: bool,
        secs: f64,
        first_batch_seconds: f64,
    ) -> BenchRun {
        let made = self.made;
        let ms = |ns: u64| ns as f64 / 1e6 / made.max(1) as f64;
        BenchRun {
            threads,
            telemetry,
            batches: made,
            seconds: secs,
            batches_per_s: made as f64 / secs,
            cells_per_s: self.cells as f64 / secs,
            seeds_per_s: self.seeds as f64 / secs,
            tokens_per_s: self.slots as f64 / secs,
            cpu_seconds: self.cpu_ns as f64 / 1e9,
            tokens_per_cpu_s: self.slots as f64 * 1e9 / self.cpu_ns.max(1) as f64,
            pack: core.cfg.pack,
            segments: core.cfg.segments_per_sequence(),
            contexts_cut: self.cut as f64 / self.seeds.max(1) as f64,
            fill: self.cells as f64 / self.slots.max(1) as f64,
            bfs_ms: ms(self.stage[stage::BFS]),
            assemble_ms: ms(self.stage[stage::ASSEMBLE]),
            collate_ms: ms(self.stage[stage::COLLATE]),
            total_ms: ms(self.stage[stage::TOTAL]),
            rss_bytes: current_rss_bytes().unwrap_or(0),
            databases: core.dbs.len(),
            first_batch_seconds,
            telemetry_us: self.telemetry_ns as f64 / 1e3 / made.max(1) as f64,
            drained_values: core.schema.drained_keys.len(),
            working_set_resident: crate::telemetry::ratio(
                self.resident as f64,
                self.probed as f64,
                1.0,
            ),
            read_amplification: crate::telemetry::ratio(
                self.read_bytes as f64,
                self.useful_bytes as f64,
                0.0,
            ),
        }
    }
}

/// Peak resident set size of this process (Linux `VmHWM`), bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    crate::sampler::status_bytes("VmHWM:")
}
