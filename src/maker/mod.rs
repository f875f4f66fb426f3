//! Making batches, in three rooms: the **plan** (`plan.rs`: the sampler
//! core — its databases, each task's plan, weights, the packing plan, fixed
//! when the sampler is made), the **draw** (`draw.rs`: a step's serial random
//! choices, the split state they advance and the pool readings after them)
//! and the **build** (`build.rs`: BFS, packing, assembly and text collation
//! of a drawn step, on any thread). This file drives them: one batch
//! ([`SamplerCore::make_batch`]), a pipelined stream
//! ([`SamplerCore::stream_batches`]) and replay. Below it: the databases it
//! is made from, opened and checked (`crate::databases`), the stream state
//! its draws advance (`crate::stream`; its capture and restore from a core
//! are `resume.rs`) and the fault injection of the diagnostic configs
//! (`crate::faults`).
//!
//! Determinism: the stream follows `crate::seeds` — the task of a step is a
//! function of (`seed`, split, step), the seeds are the rank's slice of the
//! task's global pool at its counter, and each sequence's BFS generator is
//! derived from (`seed`, split, step, global slot) before the parallel
//! phase — so the thread count never changes a batch, and a batch is a
//! function of the split's [`StreamState`] at its step, the rank and the
//! world size (which is what makes resume, skip and replay exact).
//!
//! What a batch's producer measured travels beside it
//! ([`MadeBatch::readings`]), never inside the `Batch`.

mod assembly;
mod build;
mod draw;
mod drop_set;
mod drops;
mod examples;
mod hot;
mod masking;
mod mixing;
mod open;
mod packing;
mod plan;
mod pools;
mod reads;
mod resume;
mod shape;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

pub use draw::SplitState;
pub use drop_set::DropSet;
pub use plan::{MixtureDatabase, SamplerCore, MIX_WINDOW};

pub(crate) use draw::BuildBuffers;

use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::readings::BatchReadings;
use crate::rng::mix64;
use crate::seeds::Split;
use crate::stream::StreamState;

/// A made batch: its tensors and what its producer measured making it.
#[derive(Debug, Clone)]
pub struct MadeBatch {
    /// The batch tensors (what the consumer trains on).
    pub batch: Batch,
    /// The draw, BFS, assembly and stage readings (what telemetry reads).
    pub readings: BatchReadings,
}

impl std::ops::Deref for MadeBatch {
    type Target = Batch;

    fn deref(&self) -> &Batch {
        &self.batch
    }
}

impl SamplerCore {
    /// Rebuild batch `step` of `split` exactly as the producer made it (same
    /// tensors, same fingerprint), from a fresh state of the same config
    /// with this sampler's rank and world size.
    pub fn replay_batch(&self, split: Split, step: u64) -> Result<MadeBatch> {
        self.replay_batch_on(split, step, self.cfg.rank, &[(0, self.cfg.world_size)])
    }

    /// Rebuild batch `step` of `split` as rank `rank` made it in a run whose
    /// world sizes were `world_sizes` (`(first step, world size)` spans, as
    /// a [`StreamState`] records them; they may span resumes and reshards).
    pub fn replay_batch_on(
        &self,
        split: Split,
        step: u64,
        rank: u32,
        world_sizes: &[(u64, u32)],
    ) -> Result<MadeBatch> {
        let spans_ok = world_sizes.first().is_some_and(|s| s.0 == 0)
            && world_sizes.windows(2).all(|w| w[0].0 < w[1].0)
            && world_sizes.iter().all(|s| s.1 > 0);
        if !spans_ok {
            return Err(Error::invalid(
                "world_sizes",
                format!("{world_sizes:?} is not a history of (first step, world size > 0) spans from step 0"),
            ));
        }
        let mut stream = StreamState::new(self.tasks.len(), 1, MIX_WINDOW);
        stream.world_sizes = world_sizes.to_vec();
        let mut state = self.split_state_at(split, stream, rank);
        self.skip_batches(&mut state, step)?;
        self.make_batch(&mut state)
    }

    /// Make the next batch of `state`'s split.
    pub fn make_batch(&self, state: &mut SplitState) -> Result<MadeBatch> {
        let planned = self.plan(state)?;
        let mut buffers = std::mem::take(&mut state.buffers);
        let made = self.build(planned, &mut buffers, true);
        state.buffers = buffers;
        if let Ok(b) = &made {
            state.last_shape = (b.max_rows, b.num_text);
        }
        made
    }

    /// Make `state`'s batches in stream order, up to `depth` of them built
    /// at once on the pool (none with `depth` 0), and hand each to `sink`
    /// until it returns false or after the first error. `check` runs before each batch is planned
    /// (the producer's memory cap); an error from it is handed on in order.
    ///
    /// Only planning (the draws, O(B)) is serial: with `depth` ≥ the pool's
    /// threads, the serial parts of one batch (allocation, text collation)
    /// overlap the parallel parts of the next, which is what lets a batch
    /// stream scale with threads. Batches are the ones
    /// [`make_batch`](Self::make_batch) would make: a batch is a function
    /// of its plan. A panic while building is handed on as an error.
    pub fn stream_batches(
        &self,
        state: &mut SplitState,
        depth: usize,
        mut check: impl FnMut(&SplitState, usize) -> Option<Error>,
        mut sink: impl FnMut(Result<MadeBatch>) -> bool,
    ) {
        type Built = (Result<MadeBatch>, BuildBuffers);
        if depth == 0 {
            return;
        }
        let split = state.split;
        // With a batch per thread in flight, each is built whole by one
        // thread; with fewer, batches are also split over the pool.
        let split_up = depth < self.num_threads();
        self.pool.in_place_scope(|scope| {
            let mut inflight: std::collections::VecDeque<
                std::result::Result<crossbeam_channel::Receiver<Built>, Error>,
            > = std::collections::VecDeque::with_capacity(depth);
            let mut spare = vec![std::mem::take(&mut state.buffers)];
            let mut planning = true;
            loop {
                while planning && inflight.len() < depth {
                    let planned = match check(state, inflight.len()) {
                        Some(e) => Err(e),
                        None => catch_unwind(AssertUnwindSafe(|| self.plan(state)))
                            .unwrap_or_else(|p| Err(panicked(split, &*p))),
                    };
                    match planned {
                        Ok(p) => {
                            let (tx, rx) = crossbeam_channel::bounded::<Built>(1);
                            let mut buffers = spare.pop().unwrap_or_default();
                            scope.spawn(move |_| {
                                let made = catch_unwind(AssertUnwindSafe(|| {
                                    self.build(p, &mut buffers, split_up)
                                }))
                                .unwrap_or_else(|p| Err(panicked(split, &*p)));
                                let _ = tx.send((made, buffers));
                            });
                            inflight.push_back(Ok(rx));
                        }
                        Err(e) => {
                            inflight.push_back(Err(e));
                            planning = false;
                        }
                    }
                }
                let Some(next) = inflight.pop_front() else {
                    break;
                };
                let made = match next {
                    Err(e) => Err(e),
                    Ok(rx) => match rx.recv() {
                        Ok((made, buffers)) => {
                            spare.push(buffers);
                            made
                        }
                        Err(_) => Err(Error::Worker(format!(
                            "{} batch builder vanished",
                            split.name()
                        ))),
                    },
                };
                if let Ok(b) = &made {
                    state.last_shape = (b.max_rows, b.num_text);
                }
                let failed = made.is_err();
                if !sink(made) || failed {
                    break;
                }
            }
            state.buffers = spare.pop().unwrap_or_default();
        });
    }
}

/// The error for a panic while making a `split` batch.
pub(crate) fn panicked(split: Split, p: &(dyn std::any::Any + Send)) -> Error {
    let msg = if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    };
    Error::Worker(format!("{} producer panicked: {msg}", split.name()))
}

/// A synchronous batch source (no threads besides the pool): for benchmarks
/// and Rust trainers that want to drive sampling themselves.
pub struct BatchMaker {
    /// The shared sampling core.
    pub core: Arc<SamplerCore>,
    /// This maker's split state.
    pub state: SplitState,
}

impl BatchMaker {
    /// A maker of `split` batches from a fresh state.
    pub fn new(core: Arc<SamplerCore>, split: Split) -> Self {
        let state = core.split_state(split);
        BatchMaker { core, state }
    }
}

impl Iterator for BatchMaker {
    type Item = Result<MadeBatch>;
    fn next(&mut self) -> Option<Result<MadeBatch>> {
        Some(self.core.make_batch(&mut self.state))
    }
}

pub(super) fn derive(seed: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(mix64(seed ^ 0x6865_6164_7761_7465), |acc, &p| {
            mix64(acc ^ mix64(p.wrapping_add(0x9E37_79B9)))
        })
}
