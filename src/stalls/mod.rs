//! The stall detector: a monitor thread that watches every batch build and
//! draw of a sampler and, when one runs past `stall_after_ms`, writes the
//! stuck thread's stack to a dump file, counts the stall with the batch and
//! names the stage (draw, BFS, packing, assembly, collate).
//!
//! How a stack is taken from another thread, and why it is safe:
//! - the builder marks its work in a [`Slot`] (atomics only: thread id,
//!   start time, stage, step) and clears it when done — a few atomic stores
//!   per stage, no lock, no allocation;
//! - the monitor (its own thread, `headwater-stalls`) sees a slot busy for
//!   longer than the threshold, points `capture::CAPTURE` at the slot's frame
//!   buffer and sends the thread a real-time signal with `tgkill`;
//! - the handler, on the stuck thread, checks that it is the target, walks
//!   its own stack with `backtrace::trace_unsynchronized` storing raw
//!   instruction pointers into the preallocated buffer (no allocation, no
//!   lock of ours, `errno` saved and restored) and sets a done flag;
//! - the monitor waits for the flag (at most `capture::CAPTURE_WAIT`, 500 ms), then
//!   symbolises the addresses on its own thread (`backtrace::resolve`, which
//!   allocates: never in the handler) and writes the file.
//!
//! The handler is installed once per process, with `SA_RESTART`, only when
//! the signal's disposition is the default (a handler someone else
//! installed is never replaced: the dump then says no stack was taken).
//! The unwinder is the one Rust's panics use; the known hazard of calling
//! it from a signal handler is a thread interrupted while it holds the
//! dynamic loader's lock (`dlopen`, or unwinding a panic): sampler threads
//! do neither while building a batch, and the monitor warms the unwinder's
//! caches up on its own thread first (not the symboliser's: its debug-info
//! read costs tens of MiB, paid by the first dump only). Only sampler threads are signalled
//! (never the Python threads), at most once per stall.
//!
//! Never: a dump that stops the run (a dump that cannot be written is
//! reported on stderr / `tracing` and counted in `stall_dump_failures`), or
//! a stall counted twice.

mod capture;

use std::path::PathBuf;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};

use crate::say::warn;
pub use capture::PYTHON_STACKS_SIGNAL;
use capture::{capture_stack, gettid, python_stacks, symbolise};
use std::time::{Duration, Instant};

/// The stage a slot is in (named in the dump).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stage {
    /// Nothing: the slot is free.
    Idle = 0,
    /// Drawing a step's seeds (the producer thread, serial).
    Draw = 1,
    /// The BFS of the batch's contexts.
    Bfs = 2,
    /// Packing's placement and cuts.
    Packing = 3,
    /// Assembling the sequences' tensors.
    Assembly = 4,
    /// Collating the batch's texts.
    Collate = 5,
}

impl Stage {
    /// The stage's name, as dumps and warnings say it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Idle => "idle",
            Stage::Draw => "draw",
            Stage::Bfs => "bfs",
            Stage::Packing => "packing",
            Stage::Assembly => "assembly",
            Stage::Collate => "collate",
        }
    }

    fn from_u8(v: u8) -> Stage {
        match v {
            1 => Stage::Draw,
            2 => Stage::Bfs,
            3 => Stage::Packing,
            4 => Stage::Assembly,
            5 => Stage::Collate,
            _ => Stage::Idle,
        }
    }
}

/// Slots: threads that can be inside a watched piece of work at once.
const SLOTS: usize = 128;
/// The automatic threshold: this many times the p99 build time…
pub const AUTO_P99_FACTOR: f64 = 10.0;
/// …but never below this (ms).
pub const AUTO_FLOOR_MS: f64 = 2000.0;
/// Build times the automatic threshold's p99 is taken over.
const RECENT: usize = 512;

/// One thread's watched work.
struct Slot {
    /// Thread id (0: free).
    tid: AtomicI32,
    /// When the work began (ns since the watch's epoch; 0: not started).
    since: AtomicU64,
    stage: AtomicU8,
    step: AtomicU64,
    /// Set by the monitor: this work stalled (1).
    flagged: AtomicU8,
}

/// What the watch was told at start.
#[derive(Debug, Clone)]
pub struct StallConfig {
    /// The threshold (ms); `None`: [`AUTO_P99_FACTOR`] × the p99 of recent
    /// builds, at least [`AUTO_FLOOR_MS`].
    pub stall_after_ms: Option<f64>,
    /// Where dumps go.
    pub dump_dir: PathBuf,
    /// Rank (in file names).
    pub rank: u32,
}

/// The shared state of one sampler's stall detector.
struct Shared {
    cfg: StallConfig,
    epoch: Instant,
    slots: Vec<Slot>,
    recent: Mutex<std::collections::VecDeque<u64>>,
    stop: AtomicBool,
    dumps: AtomicU64,
    /// Dumps that could not be written, not yet reported with a batch.
    failed: AtomicU64,
}

/// A sampler's stall detector: slots its builders mark, and the monitor
/// thread (stopped and joined on drop).
pub struct StallWatch {
    shared: Arc<Shared>,
    monitor: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for StallWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StallWatch")
            .field("cfg", &self.shared.cfg)
            .finish_non_exhaustive()
    }
}

/// A piece of watched work: marks its slot, clears it on drop.
pub struct Watched<'a> {
    shared: &'a Shared,
    slot: Option<usize>,
}

/// What became of a piece of watched work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StallOutcome {
    /// It ran past the threshold (counted once).
    pub stalled: bool,
    /// Stall dumps that could not be written since the last outcome (this
    /// work's or an earlier one's: a failure is reported once, with the next
    /// piece of work to end).
    pub dump_failures: u32,
}

impl Watched<'_> {
    /// The work moved on to `stage`.
    pub fn stage(&self, stage: Stage) {
        if let Some(i) = self.slot {
            self.shared.slots[i].stage.store(stage as u8, Release);
        }
    }

    /// End the work: free the slot and say whether it stalled.
    pub fn finish(mut self) -> StallOutcome {
        self.release()
    }

    fn release(&mut self) -> StallOutcome {
        let Some(i) = self.slot.take() else {
            return StallOutcome::default();
        };
        let s = &self.shared.slots[i];
        let since = s.since.swap(0, AcqRel);
        let took = self.shared.now_ns().saturating_sub(since);
        s.stage.store(Stage::Idle as u8, Release);
        let flagged = s.flagged.swap(0, AcqRel);
        s.tid.store(0, Release);
        if let Ok(mut r) = self.shared.recent.lock() {
            if r.len() == RECENT {
                r.pop_front();
            }
            r.push_back(took);
        }
        StallOutcome {
            stalled: flagged != 0,
            dump_failures: u32::try_from(self.shared.failed.swap(0, AcqRel)).unwrap_or(u32::MAX),
        }
    }
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The threshold now (ns).
    fn threshold_ns(&self) -> u64 {
        let ms = self.cfg.stall_after_ms.unwrap_or_else(|| {
            let p99 = self.recent.lock().map_or(0, |r| {
                let mut v: Vec<u64> = r.iter().copied().collect();
                v.sort_unstable();
                v.get((v.len() * 99) / 100).copied().unwrap_or(0)
            });
            #[allow(clippy::cast_precision_loss)]
            let p99_ms = p99 as f64 * 1e-6;
            (AUTO_P99_FACTOR * p99_ms).max(AUTO_FLOOR_MS)
        });
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ns = (ms * 1e6) as u64;
        ns
    }
}

impl StallWatch {
    /// Start the monitor for `cfg`. `None` when its thread cannot start
    /// (reported; sampling goes on unwatched).
    pub fn start(cfg: StallConfig) -> Option<StallWatch> {
        let shared = Arc::new(Shared {
            cfg,
            epoch: Instant::now(),
            slots: (0..SLOTS)
                .map(|_| Slot {
                    tid: AtomicI32::new(0),
                    since: AtomicU64::new(0),
                    stage: AtomicU8::new(0),
                    step: AtomicU64::new(0),
                    flagged: AtomicU8::new(0),
                })
                .collect(),
            recent: Mutex::new(std::collections::VecDeque::with_capacity(RECENT)),
            stop: AtomicBool::new(false),
            dumps: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let s = shared.clone();
        match std::thread::Builder::new()
            .name("headwater-stalls".into())
            .spawn(move || monitor(&s))
        {
            Ok(h) => Some(StallWatch {
                shared,
                monitor: Some(h),
            }),
            Err(e) => {
                warn(&format!("the stall detector cannot start its thread: {e}"));
                None
            }
        }
    }

    /// Mark the calling thread's work on `step` as begun, in `stage`.
    pub fn enter(&self, stage: Stage, step: u64) -> Watched<'_> {
        let tid = gettid();
        let sh = &*self.shared;
        let slot = sh
            .slots
            .iter()
            .position(|s| s.tid.compare_exchange(0, tid, AcqRel, Relaxed).is_ok());
        if let Some(i) = slot {
            let s = &sh.slots[i];
            s.step.store(step, Relaxed);
            s.flagged.store(0, Relaxed);
            s.stage.store(stage as u8, Release);
            s.since.store(sh.now_ns(), Release);
        }
        Watched { shared: sh, slot }
    }

    /// The threshold now (ms).
    #[allow(clippy::cast_precision_loss)]
    pub fn threshold_ms(&self) -> f64 {
        self.shared.threshold_ns() as f64 * 1e-6
    }

    /// Dumps written so far.
    pub fn dumps(&self) -> u64 {
        self.shared.dumps.load(Relaxed)
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Release);
        if let Some(h) = self.monitor.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

/// The monitor loop: every quarter threshold (5 ms to 250 ms), look for
/// work past the threshold.
fn monitor(sh: &Shared) {
    // Warm the unwinder up here (its caches are filled on first use, which
    // the signal handler must not do). The symboliser is not warmed: its
    // first resolve reads the binary's debug info (100+ ms and tens of MiB
    // of private memory, which `max_rss_bytes` counts), so only a process
    // that actually dumps a stack pays for it.
    let t0 = Instant::now();
    backtrace::trace(|_| false);
    tracing::debug!("stall monitor warmed up in {:?}", t0.elapsed());
    while !sh.stop.load(Acquire) {
        let threshold = sh.threshold_ns();
        let tick = Duration::from_nanos(threshold / 4)
            .clamp(Duration::from_millis(5), Duration::from_millis(250));
        std::thread::park_timeout(tick);
        let now = sh.now_ns();
        for s in &sh.slots {
            let since = s.since.load(Acquire);
            if since == 0 || s.flagged.load(Acquire) != 0 || now.saturating_sub(since) < threshold {
                continue;
            }
            let tid = s.tid.load(Acquire);
            if tid == 0 {
                continue;
            }
            // Flagged before the dump (the work may end while it is
            // written); a failed dump marks it again if it is still there.
            if s.flagged.compare_exchange(0, 1, AcqRel, Relaxed).is_err()
                || s.since.load(Acquire) != since
            {
                if s.since.load(Acquire) != since {
                    let _ = s.flagged.compare_exchange(1, 0, AcqRel, Relaxed);
                }
                continue;
            }
            if !dump(sh, s, tid, now - since, threshold) {
                sh.failed.fetch_add(1, AcqRel);
            }
        }
    }
}

fn thread_name(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

/// Write the dump of slot `s` (thread `tid`, stuck `elapsed` ns); whether
/// the file was written. Never panics, never stops the run.
#[allow(clippy::cast_precision_loss)]
fn dump(sh: &Shared, s: &Slot, tid: i32, elapsed: u64, threshold: u64) -> bool {
    let stage = Stage::from_u8(s.stage.load(Acquire));
    let step = s.step.load(Relaxed);
    let name = thread_name(tid);
    let (lines, stuck_in) = match capture_stack(tid) {
        Ok(frames) => symbolise(&frames),
        Err(why) => (vec![why], None),
    };
    let n = sh.dumps.fetch_add(1, Relaxed);
    let pid = std::process::id();
    let file = sh
        .cfg
        .dump_dir
        .join(format!("stall-rank{}-pid{pid}-{n}.txt", sh.cfg.rank));
    let stuck = stuck_in.as_deref().unwrap_or("(no headwater frame)");
    let head = format!(
        "headwater stall: thread {name} (tid {tid}) of rank {} in stage {} of step {step} for {:.0} ms (stall_after_ms {:.0})\nstuck in: {stuck}\n",
        sh.cfg.rank,
        stage.name(),
        elapsed as f64 * 1e-6,
        threshold as f64 * 1e-6,
    );
    let body = format!(
        "{head}\nstack of the stuck thread (innermost first):\n{}\n",
        lines.join("\n")
    );
    // Written whole, then renamed: a reader never sees half a dump.
    let part = file.with_extension("part");
    let written = std::fs::create_dir_all(&sh.cfg.dump_dir)
        .and_then(|()| std::fs::write(&part, body.as_bytes()))
        .and_then(|()| std::fs::rename(&part, &file));
    match written {
        Ok(()) => {
            warn(&format!(
                "stall: {} stage of step {step} on thread {name} ran {:.0} ms (> stall_after_ms {:.0}), stuck in {stuck}; stack dumped to {}",
                stage.name(),
                elapsed as f64 * 1e-6,
                threshold as f64 * 1e-6,
                file.display()
            ));
            python_stacks();
            true
        }
        Err(e) => {
            warn(&format!(
                "stall: {} stage of step {step} on thread {name} ran {:.0} ms, stuck in {stuck}; the stack dump could not be written to {}: {e}",
                stage.name(),
                elapsed as f64 * 1e-6,
                file.display()
            ));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn stuck_here_for_the_test(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    /// The tests that start a watch run one at a time: a dump's first
    /// symbolisation holds `backtrace`'s process-wide lock while it reads
    /// the test binary's debug info (about half a second for this 130 MB
    /// binary when it is not in the page cache), and another test's monitor,
    /// which takes the same lock to warm its unwinder up, would miss its
    /// own stall meanwhile.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn watch(dir: PathBuf, ms: f64) -> StallWatch {
        StallWatch::start(StallConfig {
            stall_after_ms: Some(ms),
            dump_dir: dir,
            rank: 0,
        })
        .unwrap()
    }

    /// A thread stuck past the threshold is dumped within 2× of it, the
    /// dump names the stage and the function; the work is counted once.
    /// (The threshold, 1 s, is half the automatic floor and leaves room for
    /// the first symbolisation of a debug test binary read from disk.)
    #[test]
    fn a_stuck_thread_is_dumped_naming_its_function() {
        let _one = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let w = watch(dir.path().to_path_buf(), 1000.0);
        let t0 = Instant::now();
        let g = w.enter(Stage::Bfs, 7);
        g.stage(Stage::Assembly);
        let seen = std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                // Wait for the file while the other thread is stuck (the
                // dump, not its `.part` before the rename).
                while t0.elapsed() < Duration::from_secs(5) {
                    let done = std::fs::read_dir(dir.path())
                        .unwrap()
                        .map(|e| e.unwrap().path())
                        .find(|p| p.extension().is_some_and(|x| x == "txt"));
                    if let Some(path) = done {
                        return Some((t0.elapsed(), path));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                None
            });
            stuck_here_for_the_test(2500);
            h.join().unwrap()
        });
        let out = g.finish();
        assert!(out.stalled && out.dump_failures == 0, "{out:?}");
        let (at, path) = seen.expect("no dump within 5 s");
        // The target: on disk within 2 x stall_after_ms.
        assert!(at < Duration::from_secs(2), "dumped after {at:?}");
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("stage assembly of step 7"), "{text}");
        assert!(text.contains("stuck_here_for_the_test"), "{text}");
        assert_eq!(w.dumps(), 1);
    }

    /// Work inside the threshold is never flagged; a dump directory that
    /// cannot be written is counted, not fatal.
    #[test]
    fn quick_work_is_quiet_and_unwritable_dumps_are_counted() {
        let _one = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let w = watch(dir.path().to_path_buf(), 200.0);
        for _ in 0..20 {
            let g = w.enter(Stage::Bfs, 0);
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(g.finish(), StallOutcome::default());
        }
        assert_eq!(w.dumps(), 0);
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let w = watch(file.join("below"), 30.0);
        let g = w.enter(Stage::Collate, 1);
        std::thread::sleep(Duration::from_millis(150));
        let mut out = g.finish();
        // The failure is reported with the first work to end after it.
        let t0 = Instant::now();
        while out.dump_failures == 0 && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(10));
            out.dump_failures += w.enter(Stage::Bfs, 2).finish().dump_failures;
        }
        assert!(out.stalled && out.dump_failures == 1, "{out:?}");
    }

    /// The automatic threshold is the floor until builds are slow.
    #[test]
    fn auto_threshold_has_a_floor() {
        let _one = one_at_a_time();
        let dir = tempfile::tempdir().unwrap();
        let w = StallWatch::start(StallConfig {
            stall_after_ms: None,
            dump_dir: dir.path().to_path_buf(),
            rank: 0,
        })
        .unwrap();
        assert!((w.threshold_ms() - AUTO_FLOOR_MS).abs() < 1e-9);
        w.enter(Stage::Bfs, 0).finish();
        assert!((w.threshold_ms() - AUTO_FLOOR_MS).abs() < 1e-9);
    }
}
