//! The [`Sampler`]: producer threads, bounded channels, delivery, shutdown.
//! Making a batch is the maker's ([`crate::maker`]); this room hands them
//! over.
//!
//! Telemetry: one set of recorders per split of [`TELEMETRY_SPLITS`]
//! (train, val, test), fed by the batches handed to the consumer: the
//! streams' and the evaluation passes' ([`Sampler::eval_pass`]).
//!
//! One producer thread per split (train, val) fills a bounded channel of
//! `num_prefetch` batches. It draws each batch's seeds serially and builds
//! up to one batch per pool thread at once on the sampler's rayon pool
//! (which also parallelises the seeds of each batch), delivering them in
//! stream order ([`SamplerCore::stream_batches`]). The consumer blocks on the channel; `shutdown()` wakes every
//! blocked producer and consumer, joins the producers and drops queued
//! batches. A producer error or panic is delivered to the consumer as an
//! error, never a hang. With `max_rss_bytes`, a producer checks, before it
//! builds each batch, that the process's private memory (`RssAnon`, see
//! [`rss`]) plus the predicted size of that batch and of those it is still
//! building stays under the cap, and
//! otherwise stops with an error that says what holds the memory.
//!
//! Delivery: each split keeps a **delivered** [`StreamState`] that advances
//! only when a batch is handed to the consumer (a batch whose step is not the
//! next delivered step is stale — made before a restart — and is dropped).
//! `state_dict()` reads the delivered copies, so prefetched batches are not
//! consumed. Restoring a state, `load_state()` and `skip()` restart a
//! split's producer from a new stream position.
//!
//! **Threads.** Every method takes `&self` and may be called from any number
//! of threads. Each split has a delivery [`Gate`]: a consumer holds it from
//! taking a batch off the channel, through the step check and the advance
//! of the delivered state, to recording the batch in telemetry; so every
//! batch is delivered exactly once, in step order, to whichever caller gets
//! it (each caller sees increasing steps), and the split's telemetry sees
//! the batches in step order. A restart (`skip`, `load_state`) holds the
//! gate too, so it never lands between a consumer's receive and its
//! advance. `state()` takes only the delivered copies' locks: taken while
//! another thread delivers, it holds that split's state either before or
//! after the batch being handed over, never a state that disagrees with
//! what callers received. Waiting for the gate is bounded by the caller's
//! timeout and woken by `shutdown()`, like waiting for a batch; a producer
//! failure fails every caller alike and never a later delivery out of
//! order.

mod eval;
mod gate;
mod mixture;
mod producer;
mod report;
mod reporting;
mod rss;

pub use crate::databases::ReadPlan;
pub use crate::maker::{
    BatchMaker, MadeBatch, MixtureDatabase, SamplerCore, SplitState, MIX_WINDOW,
};
pub use crate::stream::{DatabaseRecord, SamplerState, StreamState};
pub use eval::{eval_list, eval_task, EvalPass, EvalTask};
pub use gate::{Gate, Turn};
pub use report::SplitTelemetry;
pub use rss::{current_private_bytes, current_rss_bytes, status_bytes};

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};

use crate::config::SamplerConfig;
use crate::error::{Error, Result};
use crate::seeds::Split;
use crate::telemetry::export::otel;
use crate::telemetry::export::prometheus::{self, PromSplit};
use crate::telemetry::Recorder;
use producer::{spawn_producer, Producer};

/// The splits that have a producer.
pub const PRODUCED: [Split; 2] = [Split::Train, Split::Val];

/// The splits that have telemetry (a drain recorder and exporters each):
/// the produced streams' delivered batches and the evaluation passes'
/// batches of the same split are recorded together (a val pass feeds
/// `val`, a test pass `test`).
pub const TELEMETRY_SPLITS: [Split; 3] = [Split::Train, Split::Val, Split::Test];

/// Per split of [`TELEMETRY_SPLITS`], its recorders; shared with the
/// evaluation passes the sampler opens.
pub type Telemetry = Arc<[Mutex<SplitTelemetry>]>;

/// The position of `split` in [`TELEMETRY_SPLITS`].
pub fn telemetry_index(split: Split) -> usize {
    TELEMETRY_SPLITS
        .iter()
        .position(|&s| s == split)
        .expect("every split has telemetry")
}

/// One produced split: its delivery gate, its producer (replaced on a
/// restart), the delivered stream state and the global pool sizes (counted
/// at the first saved state, not at open: see `maker/pools.rs`).
struct Lane {
    split: Split,
    gate: Gate,
    producer: Mutex<Producer>,
    delivered: Mutex<StreamState>,
    pool_lens: std::sync::OnceLock<Vec<u64>>,
}

/// One caller's request for the next batch of a split
/// ([`Sampler::ask`]): when it asked and how many batches were queued then.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    split: Split,
    t0: Instant,
    depth: usize,
}

/// A running sampler: the Rust API (`next_batch`, `iter`) behind the Python
/// `headwater.Sampler`.
pub struct Sampler {
    core: Arc<SamplerCore>,
    lanes: Vec<Lane>,
    stop: Mutex<Option<Sender<()>>>,
    stop_rx: Receiver<()>,
    closed: AtomicBool,
    /// The first producer failure: (was it a resource limit?, message).
    failure: Mutex<Option<(bool, String)>>,
    pid: u32,
    /// Per split of [`TELEMETRY_SPLITS`]: the drain recorder and the exporters.
    telemetry: Telemetry,
}

impl Sampler {
    /// Open `db_path` and start the producers.
    pub fn new(db_path: impl AsRef<Path>, cfg: SamplerConfig) -> Result<Sampler> {
        Sampler::with_state(db_path, cfg, None)
    }

    /// Open `db_path` and start the producers where `state` (a saved
    /// [`SamplerState`]) left off; `None` starts at step 0.
    pub fn with_state(
        db_path: impl AsRef<Path>,
        cfg: SamplerConfig,
        state: Option<&SamplerState>,
    ) -> Result<Sampler> {
        let core = Arc::new(SamplerCore::new(db_path, cfg)?);
        Sampler::start_at(core, state)
    }

    /// Open the mixture of the databases at `paths` (one path: a single
    /// database) and start the producers, at `state` when given.
    pub fn open_mixture(
        paths: &[std::path::PathBuf],
        cfg: SamplerConfig,
        state: Option<&SamplerState>,
    ) -> Result<Sampler> {
        let dropped = state.map_or(&[][..], |s| &s.dropped_databases[..]);
        // Dropped mid-run: still among the state's databases (kept in place).
        let in_place: Vec<String> = state.map_or_else(Vec::new, |s| {
            s.databases
                .iter()
                .map(|d| d.name.clone())
                .filter(|n| dropped.contains(n))
                .collect()
        });
        let core = Arc::new(SamplerCore::open_mixture_dropping(
            paths, cfg, dropped, &in_place,
        )?);
        Sampler::start_at(core, state)
    }

    /// Start producers for an already built core.
    pub fn start(core: Arc<SamplerCore>) -> Result<Sampler> {
        Sampler::start_at(core, None)
    }

    /// Each produced split's state, fresh or restored from `saved`.
    fn initial_states(core: &SamplerCore, saved: Option<&SamplerState>) -> Result<Vec<SplitState>> {
        let mut states: Vec<SplitState> = PRODUCED.iter().map(|&s| core.split_state(s)).collect();
        if let Some(saved) = saved {
            let restored = core.restore(saved, &states)?;
            for (state, stream) in states.iter_mut().zip(restored) {
                state.stream = stream;
            }
        }
        Ok(states)
    }

    /// Start producers for `core`, at `saved` when given.
    pub fn start_at(core: Arc<SamplerCore>, saved: Option<&SamplerState>) -> Result<Sampler> {
        let t0 = Instant::now();
        let states = Sampler::initial_states(&core, saved)?;
        // Open + core preparation + the splits' seed pools.
        let startup_seconds = core.startup_seconds + t0.elapsed().as_secs_f64();
        let since_open = Duration::from_secs_f64(core.startup_seconds);
        let opened = t0.checked_sub(since_open).unwrap_or(t0);
        let prom_addr = core.cfg.prometheus_addr().filter(|_| core.cfg.telemetry);
        if let Some(addr) = prom_addr {
            prometheus::install(addr, &core.schema)?;
        }
        let otlp = otel::resolve_endpoint(core.cfg.otlp_endpoint.as_deref());
        if let Some(ep) = &otlp {
            otel::install(ep, core.cfg.rank)?;
        }
        let telemetry: Telemetry = TELEMETRY_SPLITS
            .iter()
            .map(|s| {
                let mut exporters: Vec<Box<dyn Recorder>> = Vec::new();
                if prom_addr.is_some() {
                    exporters.push(Box::new(PromSplit::register(
                        &core.schema,
                        core.cfg.rank,
                        s.name(),
                    )));
                }
                if let (true, Some(_)) = (core.cfg.telemetry, &otlp) {
                    exporters.extend(
                        otel::OtlpSplit::new(s.name()).map(|o| Box::new(o) as Box<dyn Recorder>),
                    );
                }
                let mut t = SplitTelemetry::new(&core.schema, exporters);
                t.set_startup_seconds(startup_seconds);
                Mutex::new(t)
            })
            .collect();
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let mut lanes = Vec::new();
        for state in states {
            let delivered = Mutex::new(state.stream.clone());
            lanes.push(Lane {
                split: state.split,
                pool_lens: std::sync::OnceLock::new(),
                gate: Gate::new(),
                producer: Mutex::new(spawn_producer(&core, state, &stop_rx, Some(opened))?),
                delivered,
            });
        }
        if saved.is_some() {
            for t in telemetry.iter() {
                t.lock().unwrap().note_resume();
            }
        }
        Ok(Sampler {
            telemetry,
            core,
            lanes,
            stop: Mutex::new(Some(stop_tx)),
            stop_rx,
            closed: AtomicBool::new(false),
            failure: Mutex::new(None),
            pid: std::process::id(),
        })
    }

    /// The shared sampling core (database, config, schema).
    pub fn core(&self) -> &Arc<SamplerCore> {
        &self.core
    }

    fn lane(&self, split: Split) -> Result<&Lane> {
        PRODUCED
            .iter()
            .position(|&s| s == split)
            .map(|i| &self.lanes[i])
            .ok_or_else(|| {
                Error::invalid(
                    "split",
                    format!("{} has no producer (train and val do)", split.name()),
                )
            })
    }

    /// Batches waiting in `split`'s channel.
    pub fn queue_depth(&self, split: Split) -> Result<usize> {
        Ok(self.lane(split)?.producer.lock().unwrap().rx.len())
    }

    /// The sampler state as of delivery (every produced split).
    pub fn state(&self) -> SamplerState {
        let streams: Vec<StreamState> = self
            .lanes
            .iter()
            .map(|l| l.delivered.lock().unwrap().clone())
            .collect();
        let parts: Vec<(Split, &StreamState, &[u64])> = PRODUCED
            .iter()
            .zip(&streams)
            .zip(&self.lanes)
            .map(|((&s, st), l)| {
                let lens = l.pool_lens.get_or_init(|| self.core.pool_lens(l.split));
                (s, st, lens.as_slice())
            })
            .collect();
        self.core.capture(&parts)
    }

    /// Continue every split from `saved` (checked as at construction):
    /// queued batches are dropped and the producers restarted. Holds every
    /// split's gate (in lane order) while it restarts them.
    pub fn load_state(&self, saved: &SamplerState) -> Result<()> {
        self.check_open()?;
        let states = Sampler::initial_states(&self.core, Some(saved))?;
        let mut turns = Vec::with_capacity(self.lanes.len());
        for lane in &self.lanes {
            turns.push(self.enter_blocking(lane)?);
        }
        for ((lane, state), turn) in self.lanes.iter().zip(states).zip(&turns) {
            self.restart(lane, state, turn)?;
        }
        for t in self.telemetry.iter() {
            t.lock().unwrap().note_resume();
        }
        Ok(())
    }

    /// Whether `saved` can be restored here ([`load_state`](Self::load_state)
    /// would accept it): the same checks, nothing restored or logged.
    pub fn check_state(&self, saved: &SamplerState) -> Result<()> {
        let fresh: Vec<SplitState> = PRODUCED.iter().map(|&s| self.core.split_state(s)).collect();
        self.core.restored_streams(saved, &fresh).map(|_| ())
    }

    /// Advance `split`'s stream by `n` batches past the last delivered one
    /// without building them (queued batches are dropped, the producer
    /// restarts after them). Exactly reproducible: the batches after a skip
    /// are those an unskipped stream delivers `n` steps later. Holds the
    /// split's gate, so "the last delivered one" is not a moving target.
    pub fn skip(&self, split: Split, n: u64) -> Result<()> {
        self.check_open()?;
        let lane = self.lane(split)?;
        let turn = self.enter_blocking(lane)?;
        let stream = lane.delivered.lock().unwrap().clone();
        let mut state = self.core.split_state_at(split, stream, self.core.cfg.rank);
        self.core.skip_batches(&mut state, n)?;
        self.restart(lane, state, &turn)
    }

    /// Restart `lane`'s producer at its delivered state under the drop set
    /// now (a database was dropped mid-run: the batches after it are made
    /// with its weight shared out). The caller holds the gate (`_turn`).
    fn remake(&self, lane: &Lane, split: Split, turn: &Turn<'_>) -> Result<()> {
        let stream = lane.delivered.lock().unwrap().clone();
        let state = self.core.split_state_at(split, stream, self.core.cfg.rank);
        self.restart(lane, state, turn)
    }

    /// `lane`'s gate, waiting as long as it takes (a consumer holds it for
    /// at most one batch or its own timeout); `Shutdown` if the sampler
    /// shuts down meanwhile.
    fn enter_blocking<'a>(&self, lane: &'a Lane) -> Result<Turn<'a>> {
        lane.gate
            .enter(None, Some(&self.stop_rx))?
            .ok_or(Error::Shutdown)
    }

    /// Rebuild batch `step` of `split` as rank `rank` (default: this rank)
    /// delivered it, under the world sizes this stream has had (across
    /// resumes and reshards).
    pub fn replay_batch(&self, split: Split, step: u64, rank: Option<u32>) -> Result<MadeBatch> {
        let spans = self
            .lane(split)?
            .delivered
            .lock()
            .unwrap()
            .world_sizes
            .clone();
        let rank = rank.unwrap_or(self.core.cfg.rank);
        self.core.replay_batch_on(split, step, rank, &spans)
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    /// Stop `lane`'s producer, drop its queue, and start a new one at
    /// `state`; the delivered copy becomes `state`'s stream. The caller
    /// holds the lane's gate (`_turn`).
    fn restart(&self, lane: &Lane, state: SplitState, _turn: &Turn<'_>) -> Result<()> {
        let mut p = lane.producer.lock().unwrap();
        drop(p.halt.take());
        while p.rx.try_recv().is_ok() {}
        if let Some(h) = p.handle.take() {
            let _ = h.join();
        }
        *lane.delivered.lock().unwrap() = state.stream.clone();
        *p = spawn_producer(&self.core, state, &self.stop_rx, None)?;
        Ok(())
    }

    /// Ask for the next batch of `split`: notes when and how many batches
    /// were queued (both recorded with the batch in telemetry). Pass it to
    /// every [`next_batch_timeout`](Self::next_batch_timeout) retry.
    pub fn ask(&self, split: Split) -> Result<Ask> {
        Ok(Ask {
            split,
            t0: Instant::now(),
            depth: self.queue_depth(split)?,
        })
    }

    /// The next batch of `ask`'s split, waiting at most `timeout` (`None` =
    /// forever) for the split's gate and then for the batch; the delivered
    /// state advances and the batch is recorded in the split's telemetry
    /// before the gate is left (see the module doc on threads). `Ok(None)`
    /// means the wait timed out (callers check signals and retry with the
    /// same `ask`).
    pub fn next_batch_timeout(
        &self,
        ask: &Ask,
        timeout: Option<Duration>,
    ) -> Result<Option<MadeBatch>> {
        if std::process::id() != self.pid {
            return Err(Error::Worker(format!(
                "this sampler was created in process {} and cannot be used in forked process {}; create a new Sampler after fork",
                self.pid,
                std::process::id()
            )));
        }
        self.check_open()?;
        let split = ask.split;
        let lane = self.lane(split)?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let Some(turn) = lane.gate.enter(deadline, Some(&self.stop_rx))? else {
            return Ok(None);
        };
        // Checked inside the gate: a failure another caller met first is
        // this caller's too.
        if let Some((resource, msg)) = self.failure.lock().unwrap().clone() {
            return Err(if resource {
                Error::Resource(msg)
            } else {
                Error::Worker(msg)
            });
        }
        loop {
            let (rx, made_under) = {
                let p = lane.producer.lock().unwrap();
                (p.rx.clone(), p.generation)
            };
            // A database was dropped since this producer's state was made.
            let outdated = || made_under != self.core.drop_generation();
            let got = if let Some(d) = deadline {
                select! {
                    recv(rx) -> m => Some(m),
                    recv(self.stop_rx) -> _ => None,
                    default(d.saturating_duration_since(Instant::now())) => return Ok(None),
                }
            } else {
                select! {
                    recv(rx) -> m => Some(m),
                    recv(self.stop_rx) -> _ => None,
                }
            };
            self.check_open()?;
            let restarted = || !lane.producer.lock().unwrap().rx.same_channel(&rx);
            match got {
                Some(Ok(Ok(_))) if outdated() => self.remake(lane, split, &turn)?,
                Some(Ok(Err(e))) if self.core.drop_corrupt(&e) | outdated() => {
                    self.remake(lane, split, &turn)?;
                }
                Some(Ok(Ok(b))) => {
                    if !Sampler::advance(lane, split, &b, &self.core)? {
                        continue; // made before a restart: not part of the stream now
                    }
                    self.record(split, &b, ask.depth, ask.t0.elapsed().as_secs_f64());
                    return Ok(Some(b));
                }
                Some(Err(_)) if restarted() => {} // the split was restarted: wait on the new producer
                other => return self.failed(split, other),
            }
        }
    }

    /// Advance `lane`'s delivered state past `b` (the caller holds the
    /// gate): `false` for a stale batch (made before a restart).
    fn advance(lane: &Lane, split: Split, b: &MadeBatch, core: &SamplerCore) -> Result<bool> {
        let mut d = lane.delivered.lock().unwrap();
        if b.step < d.step {
            return Ok(false);
        }
        if b.step > d.step {
            return Err(Error::Worker(format!(
                "the {} producer made step {} while step {} was due",
                split.name(),
                b.step,
                d.step
            )));
        }
        let task = b.task_idx as usize;
        d.advance_batch(task, &b.drawn, || core.step_shape(split, task, b.step).1);
        Ok(true)
    }

    /// The error for a producer failure, a closed channel or a shutdown.
    fn failed(
        &self,
        split: Split,
        got: Option<std::result::Result<Result<MadeBatch>, crossbeam_channel::RecvError>>,
    ) -> Result<Option<MadeBatch>> {
        match got {
            None => Err(Error::Shutdown),
            Some(Ok(Ok(b))) => Ok(Some(b)),
            Some(Ok(Err(e))) => {
                let first = match &e {
                    Error::Resource(m) => Some((true, m.clone())),
                    Error::Worker(m) => Some((false, m.clone())),
                    Error::Shutdown => None,
                    other => Some((false, other.to_string())),
                };
                if let Some(f) = first {
                    self.failure.lock().unwrap().get_or_insert(f);
                }
                Err(e)
            }
            Some(Err(_)) => Err(Error::Worker(format!(
                "the {} producer exited",
                split.name()
            ))),
        }
    }

    /// The next batch of `split`, blocking until one is ready; records it
    /// in the split's telemetry.
    pub fn next_batch(&self, split: Split) -> Result<MadeBatch> {
        let ask = self.ask(split)?;
        loop {
            if let Some(b) = self.next_batch_timeout(&ask, None)? {
                return Ok(b);
            }
        }
    }

    /// A finite evaluation pass over `split` (see [`EvalPass::new`]) whose
    /// batches are recorded in `split`'s telemetry as the consumer takes
    /// them (when telemetry is on).
    pub fn eval_pass(
        &self,
        split: Split,
        task: Option<usize>,
        max_seeds: Option<usize>,
    ) -> Result<EvalPass> {
        self.check_open()?;
        let pass = EvalPass::new(self.core.clone(), split, task, max_seeds)?;
        Ok(if self.core.cfg.telemetry {
            pass.recorded_in(self.telemetry.clone())
        } else {
            pass
        })
    }

    /// Whether `shutdown()` was called.
    pub fn is_shut_down(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Stop producers, wake blocked consumers, drain channels, join threads.
    /// Idempotent.
    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        if std::process::id() != self.pid {
            // A forked child has none of the parent's threads: nothing to
            // stop or join (joining would fail); the maps stay valid.
            return;
        }
        drop(self.stop.lock().unwrap().take());
        for lane in &self.lanes {
            let mut p = lane.producer.lock().unwrap();
            while p.rx.try_recv().is_ok() {}
            if let Some(h) = p.handle.take() {
                let _ = h.join();
            }
            while p.rx.try_recv().is_ok() {}
        }
        if let Some(hog) = &self.core.hog {
            hog.stop();
        }
        otel::flush();
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.shutdown();
    }
}
