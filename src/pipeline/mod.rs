//! Producer threads, bounded channels, shutdown.
//!
//! One producer thread per split (train, val) fills a bounded channel of
//! `num_prefetch` batches; the sampler's rayon pool parallelises the seeds of
//! each batch. The consumer blocks on the channel; `shutdown()` wakes every
//! blocked producer and consumer, joins the producers and drops queued
//! batches. A producer error or panic is delivered to the consumer as an
//! error, never a hang. With `max_rss_bytes`, a producer checks, before it
//! builds each batch, that the process's private memory (`RssAnon`, see
//! [`rss`]) plus the predicted size of that batch stays under the cap, and
//! otherwise stops with an error that says what holds the memory.

mod maker;
mod report;
mod rss;

pub use maker::{BatchMaker, SamplerCore, SplitState};
pub use report::{fill_report, SplitTelemetry};
pub use rss::{current_private_bytes, current_rss_bytes};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};

use crate::batch::Batch;
use crate::config::SamplerConfig;
use crate::error::{Error, Result};
use crate::seeds::Split;
use crate::telemetry::export::otel;
use crate::telemetry::export::prometheus::{self, PromSplit};
use crate::telemetry::Recorder;

/// The splits that have a producer.
pub const PRODUCED: [Split; 2] = [Split::Train, Split::Val];

struct Producer {
    rx: Receiver<Result<Batch>>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

/// A running sampler: the Rust API (`next_batch`, `iter`) behind the Python
/// `headwater.Sampler`.
pub struct Sampler {
    core: Arc<SamplerCore>,
    producers: Vec<Producer>,
    stop: Mutex<Option<Sender<()>>>,
    stop_rx: Receiver<()>,
    closed: AtomicBool,
    /// The first producer failure: (was it a resource limit?, message).
    failure: Mutex<Option<(bool, String)>>,
    pid: u32,
    /// Per produced split: the drain recorder and the exporters.
    telemetry: Vec<Mutex<SplitTelemetry>>,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// The error to stop with when building the next batch would take the
/// process's private memory past `cap` (`None`: it fits, or memory cannot
/// be read). The batch size is predicted from this split's last batch.
fn over_cap(
    core: &SamplerCore,
    state: &SplitState,
    tx: &Sender<Result<Batch>>,
    cap: u64,
) -> Option<Error> {
    let private = current_private_bytes()?;
    let next = state.predicted_batch_bytes(&core.cfg, core.db.metadata().embedder.dim as usize);
    if private.saturating_add(next) <= cap {
        return None;
    }
    let queued = tx.len() as u64;
    let slots = core.cfg.num_prefetch as u64 * PRODUCED.len() as u64;
    Some(Error::Resource(format!(
        "private memory (RssAnon) {private} bytes + the next {} batch (~{next} bytes) would exceed max_rss_bytes {cap}. \
         Prefetch queues: {queued} batches waiting in this split's queue (~{} bytes); at most {slots} batches \
         ({} per split × {} splits, ~{} bytes) can be queued; the rest ({} bytes) is the process \
         (interpreter, model, consumers' batches, sampler scratch). The mapped database is not counted. \
         Lower num_prefetch, default_batch_size or default_sequence_length, or raise max_rss_bytes",
        state.split.name(),
        queued * next,
        core.cfg.num_prefetch,
        PRODUCED.len(),
        slots * next,
        private.saturating_sub(queued * next),
    )))
}

fn produce(
    core: Arc<SamplerCore>,
    mut state: SplitState,
    tx: Sender<Result<Batch>>,
    stop: Receiver<()>,
) {
    loop {
        let msg = match core
            .cfg
            .max_rss_bytes
            .and_then(|cap| over_cap(&core, &state, &tx, cap))
        {
            Some(e) => Err(e),
            None => match catch_unwind(AssertUnwindSafe(|| core.make_batch(&mut state))) {
                Ok(r) => r,
                Err(p) => Err(Error::Worker(format!(
                    "{} producer panicked: {}",
                    state.split.name(),
                    panic_message(p)
                ))),
            },
        };
        let fatal = msg.is_err();
        select! {
            send(tx, msg) -> sent => if sent.is_err() { return },
            recv(stop) -> _ => return,
        }
        if fatal {
            return;
        }
    }
}

impl Sampler {
    /// Open `db_path` and start the producers.
    pub fn new(db_path: impl AsRef<Path>, cfg: SamplerConfig) -> Result<Sampler> {
        let core = Arc::new(SamplerCore::new(db_path, cfg)?);
        Sampler::start(core)
    }

    /// Start producers for an already built core.
    pub fn start(core: Arc<SamplerCore>) -> Result<Sampler> {
        let prom_addr = core.cfg.prometheus_addr().filter(|_| core.cfg.telemetry);
        if let Some(addr) = prom_addr {
            prometheus::install(addr, &core.schema)?;
        }
        let otlp = otel::resolve_endpoint(core.cfg.otlp_endpoint.as_deref());
        if let Some(ep) = &otlp {
            otel::install(ep, core.cfg.rank)?;
        }
        let telemetry = PRODUCED
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
                t.set_startup_seconds(core.startup_seconds);
                Mutex::new(t)
            })
            .collect();
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let mut producers = Vec::new();
        for split in PRODUCED {
            let cap = core.cfg.num_prefetch;
            let (tx, rx) = bounded(cap);
            let state = core.split_state(split);
            let (c, s) = (core.clone(), stop_rx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("headwater-{}", split.name()))
                .spawn(move || produce(c, state, tx, s))
                .map_err(|e| {
                    Error::Worker(format!(
                        "cannot start the {} producer thread: {e}",
                        split.name()
                    ))
                })?;
            producers.push(Producer {
                rx,
                handle: Mutex::new(Some(handle)),
            });
        }
        Ok(Sampler {
            telemetry,
            core,
            producers,
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

    fn producer(&self, split: Split) -> Result<&Producer> {
        PRODUCED
            .iter()
            .position(|&s| s == split)
            .map(|i| &self.producers[i])
            .ok_or_else(|| {
                Error::invalid(
                    "split",
                    format!("{} has no producer (train and val do)", split.name()),
                )
            })
    }

    /// Batches waiting in `split`'s channel.
    pub fn queue_depth(&self, split: Split) -> Result<usize> {
        Ok(self.producer(split)?.rx.len())
    }

    /// The next batch of `split`, waiting at most `timeout` (`None` = forever).
    /// `Ok(None)` means the wait timed out (callers check signals and retry).
    pub fn next_batch_timeout(
        &self,
        split: Split,
        timeout: Option<Duration>,
    ) -> Result<Option<Batch>> {
        if std::process::id() != self.pid {
            return Err(Error::Worker(format!(
                "this sampler was created in process {} and cannot be used in forked process {}; create a new Sampler after fork",
                self.pid,
                std::process::id()
            )));
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
        if let Some((resource, msg)) = self.failure.lock().unwrap().clone() {
            return Err(if resource {
                Error::Resource(msg)
            } else {
                Error::Worker(msg)
            });
        }
        let p = self.producer(split)?;
        let got = if let Some(t) = timeout {
            select! {
                recv(p.rx) -> m => Some(m),
                recv(self.stop_rx) -> _ => None,
                default(t) => return Ok(None),
            }
        } else {
            select! {
                recv(p.rx) -> m => Some(m),
                recv(self.stop_rx) -> _ => None,
            }
        };
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Shutdown);
        }
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
    pub fn next_batch(&self, split: Split) -> Result<Batch> {
        let t0 = Instant::now();
        let depth = self.queue_depth(split)?;
        loop {
            if let Some(b) = self.next_batch_timeout(split, None)? {
                self.deliver(split, &b, depth, t0.elapsed().as_secs_f64());
                return Ok(b);
            }
        }
    }

    /// Record a batch handed to the consumer: `depth` batches were waiting
    /// when it asked and it blocked `wait_seconds`.
    pub fn deliver(&self, split: Split, b: &Batch, depth: usize, wait_seconds: f64) {
        if !self.core.cfg.telemetry {
            return;
        }
        if let Some(i) = PRODUCED.iter().position(|&s| s == split) {
            self.telemetry[i]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .deliver(b, depth, wait_seconds);
        }
    }

    /// The step metrics of `split` since the last drain, one value per
    /// `schema.drained_keys` (empty if no batch was delivered since),
    /// clearing the accumulated counters.
    pub fn drain_step_values(&self, split: Split) -> Result<Vec<f64>> {
        let i = PRODUCED.iter().position(|&s| s == split).ok_or_else(|| {
            Error::invalid(
                "split",
                format!("{} has no producer (train and val do)", split.name()),
            )
        })?;
        let mut out = Vec::new();
        self.telemetry[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain
            .drain_values(&self.core.schema, &mut out);
        Ok(out)
    }

    /// [`drain_step_values`](Self::drain_step_values) paired with the keys.
    pub fn drain_step_metrics(&self, split: Split) -> Result<Vec<(String, f64)>> {
        let v = self.drain_step_values(split)?;
        Ok(self
            .core
            .schema
            .drained_keys
            .iter()
            .cloned()
            .zip(v)
            .collect())
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
        for p in &self.producers {
            while p.rx.try_recv().is_ok() {}
            if let Some(h) = p.handle.lock().unwrap().take() {
                let _ = h.join();
            }
            while p.rx.try_recv().is_ok() {}
        }
        otel::flush();
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.shutdown();
    }
}
