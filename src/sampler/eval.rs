//! Evaluation passes: finite, ordered walks over every seed of the val or
//! test split, task by task, independent of the training stream.
//!
//! **The eval shard rule.** For task `k` and split `s`, the pass list is the
//! task's seeds whose split is `s` (the stored split of a task that keeps
//! one, e.g. RelBench's label files, else the hash split), in task order (the order of
//! `tasks/<k>.bin`), cut to its first `max_seeds` when a cap is given. Rank
//! `r` of `world_size` takes the entries at list positions `i` with
//! `i % world_size == r`, in order. The union over ranks is the list, each
//! seed exactly once. (This rule is the eval pass's own: the training
//! stream's sharding may change without changing it.)
//!
//! **Batches.** Each rank walks its entries in runs of `default_batch_size`.
//! Every rank yields the same number of batches per task,
//! `ceil(ceil(n / world_size) / B)` for a list of `n`, so collectives over a
//! pass line up; sequences past a rank's entries repeat a seed of the list
//! (its last entry, or the list's first when it has none) and are marked
//! `seq_valid = 0`: they must not be scored.
//!
//! **Independence.** A pass reads only the immutable [`SamplerCore`]; each
//! sequence's BFS generator is derived from (`seed`, split, task, list
//! position), never from a split's stream state, so a pass never advances
//! or perturbs training, gives the same batches on every call, and may run
//! on the consumer's thread while the producers prefetch.
//!
//! **Telemetry.** A pass opened by [`Sampler::eval_pass`](super::Sampler::eval_pass)
//! records each batch it yields in the split's recorders (the drain and the
//! exporters, labelled `split="val"` / `"test"`), like a delivered stream
//! batch: every table row is measured the same way, with these pass
//! readings of the rows a stream reads from its pools and channel:
//! `pool/remaining_*` = this rank's seeds of the batch's task not yet
//! yielded (`_fraction` over this rank's share of the task), `pool/
//! steps_to_exhaust_min` = the task's batches still to come, `pool/
//! steps_since_pick_max`, `mix/tv_distance`, exhaust events and duplicate
//! seeds 0 (a pass draws each seed once, in order), `queue/depth_min` 0 and
//! `queue/wait_seconds` the time the batch took to build (the consumer
//! builds it: there is no prefetch). `tasks/<task>` counts the batch's
//! seeds including its padded sequences (the batch size, as for a stream
//! batch); `seq_valid` says which sequences count for scoring. A val pass
//! and the val stream feed the same `val` recorders.

use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::maker::{BuildBuffers, MadeBatch};
use crate::readings::DrawReadings;
use crate::rng::mix64;
use crate::seeds::{task_split_seeds, Split};

use super::{telemetry_index, SamplerCore, Telemetry};

/// Tag that separates evaluation generators from the training stream's.
const EVAL_TAG: u64 = 0x6576_616c;

/// One task's share of a pass on this rank.
#[derive(Debug, Clone)]
pub struct EvalTask {
    /// Task index (metadata order).
    pub task: usize,
    /// Length of the task's (capped) pass list over all ranks.
    pub list_len: usize,
    /// This rank's entries: (list position, seed index into the task).
    pub entries: Vec<(u64, u32)>,
    /// The seed padded sequences repeat.
    pub pad: (u64, u32),
    /// Batches every rank yields for this task.
    pub batches: usize,
}

/// The ordered pass list of `task` in `split` (seed indices into the task),
/// capped at `max_seeds`.
pub fn eval_list(
    core: &SamplerCore,
    task: usize,
    split: Split,
    max_seeds: Option<usize>,
) -> Result<Vec<u32>> {
    let view = core.task_view(task)?;
    let local = core.task_local(task) as u32;
    let c = &core.cfg;
    let cap = max_seeds.unwrap_or(usize::MAX);
    let mut list = task_split_seeds(
        local,
        view.anchor_rows,
        view.splits,
        split,
        c.split_seed,
        c.split_ratios,
    );
    list.truncate(cap);
    Ok(list)
}

/// This rank's share of task `task`'s pass (see the module doc for the rule).
pub fn eval_task(
    core: &SamplerCore,
    task: usize,
    split: Split,
    max_seeds: Option<usize>,
) -> Result<EvalTask> {
    let list = eval_list(core, task, split, max_seeds)?;
    let (rank, world) = (core.cfg.rank as usize, core.cfg.world_size as usize);
    let entries: Vec<(u64, u32)> = list
        .iter()
        .enumerate()
        .filter(|(i, _)| i % world == rank)
        .map(|(i, &s)| (i as u64, s))
        .collect();
    let per_rank = list.len().div_ceil(world);
    let b = core.cfg.default_batch_size;
    let pad = entries
        .last()
        .copied()
        .or_else(|| list.first().map(|&s| (0, s)))
        .unwrap_or((0, 0));
    Ok(EvalTask {
        task,
        list_len: list.len(),
        entries,
        pad,
        batches: per_rank.div_ceil(b),
    })
}

/// A finite, ordered evaluation pass over one split on this rank: an
/// iterator of batches, task after task (metadata order), `seq_valid`
/// marking the real sequences.
pub struct EvalPass {
    core: Arc<SamplerCore>,
    split: Split,
    tasks: Vec<EvalTask>,
    at: (usize, usize),
    index: u64,
    buffers: BuildBuffers,
    jobs: Vec<(u32, u32, i64, u64)>,
    /// The sampler's recorders, when the pass records its batches.
    telemetry: Option<Telemetry>,
}

impl EvalPass {
    /// A pass over `split` (val or test) of `task` (every task when `None`,
    /// but those of a database dropped mid-run), each task's list capped at
    /// `max_seeds`.
    pub fn new(
        core: Arc<SamplerCore>,
        split: Split,
        task: Option<usize>,
        max_seeds: Option<usize>,
    ) -> Result<Self> {
        if split == Split::Train {
            return Err(Error::invalid(
                "split",
                "\"train\": an evaluation pass runs over \"val\" or \"test\"",
            ));
        }
        if max_seeds == Some(0) {
            return Err(Error::invalid(
                "max_seeds",
                "0: expected at least 1 (or None for the whole split)",
            ));
        }
        let n = core.task_names().len();
        let picked: Vec<usize> = match task {
            Some(k) if k >= n => {
                return Err(Error::invalid(
                    "task",
                    format!("{k}: expected a task index in 0..{n}"),
                ))
            }
            Some(k) => {
                if let Some(why) = core.task_dropped(k) {
                    return Err(Error::invalid(
                        "task",
                        format!("{k} ({}): {why}", core.task_names()[k]),
                    ));
                }
                vec![k]
            }
            // A database dropped mid-run is not evaluated (its blocks fail).
            None => (0..n).filter(|&k| core.task_dropped(k).is_none()).collect(),
        };
        let tasks = picked
            .into_iter()
            .map(|k| eval_task(&core, k, split, max_seeds))
            .collect::<Result<Vec<_>>>()?;
        Ok(EvalPass {
            core,
            split,
            tasks,
            at: (0, 0),
            index: 0,
            buffers: BuildBuffers::default(),
            jobs: Vec::new(),
            telemetry: None,
        })
    }

    /// Record every batch this pass yields in `telemetry`'s recorders of
    /// the pass's split (see the module doc).
    #[must_use]
    pub fn recorded_in(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = Some(telemetry);
        self
    }

    /// The sampling core the pass reads.
    pub fn core(&self) -> &Arc<SamplerCore> {
        &self.core
    }

    /// Each task's share of the pass, in pass order.
    pub fn tasks(&self) -> &[EvalTask] {
        &self.tasks
    }

    /// Batches the whole pass yields (the same on every rank).
    pub fn len(&self) -> usize {
        self.tasks.iter().map(|t| t.batches).sum()
    }

    /// A pass with no batch (every list empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn make(&mut self, ti: usize, bi: usize) -> Result<MadeBatch> {
        let t0 = Instant::now();
        let core = &*self.core;
        let t = &self.tasks[ti];
        let b = core.cfg.default_batch_size;
        let view = core.task_view(t.task)?;
        let name = core.task_names()[t.task].as_str();
        let span = tracing::info_span!(
            "batch",
            split = self.split.name(),
            pass = "eval",
            step = self.index as i64,
            rank = core.cfg.rank as i64,
            task = name,
            rows = tracing::field::Empty,
            cells = tracing::field::Empty,
        );
        let _enter = span.enter();
        let key = mix64(core.cfg.seed ^ EVAL_TAG) ^ mix64(self.split.index() as u64);
        let mut valid = vec![0u8; b];
        self.jobs.clear();
        for (j, v) in valid.iter_mut().enumerate() {
            let (pos, seed) = match t.entries.get(bi * b + j) {
                Some(&e) => {
                    *v = 1;
                    e
                }
                None => t.pad,
            };
            let i = seed as usize;
            let rs = mix64(key ^ mix64((t.task as u64) << 40 ^ pos));
            self.jobs
                .push((seed, view.anchor_rows[i], view.obs_times[i], rs));
        }
        let mut made = core.build_batch(
            (t.task, core.cfg.default_sequence_length),
            self.split,
            &self.jobs,
            false,
            &mut self.buffers,
            &span,
            t0,
            true,
            None,
        )?;
        made.readings.draw = pass_draw(t, bi, b);
        let batch = &mut made.batch;
        batch.seq_valid = valid;
        batch.split = self.split;
        batch.step = self.index;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&key.to_le_bytes());
        h.update(&(t.task as u32).to_le_bytes());
        h.update(bytemuck::cast_slice(&batch.seeds));
        h.update(&batch.seq_valid);
        batch.fingerprint = h.digest();
        Ok(made)
    }
}

impl Iterator for EvalPass {
    type Item = Result<MadeBatch>;

    fn next(&mut self) -> Option<Result<MadeBatch>> {
        while self.at.0 < self.tasks.len() && self.at.1 >= self.tasks[self.at.0].batches {
            self.at = (self.at.0 + 1, 0);
        }
        let (ti, bi) = self.at;
        if ti >= self.tasks.len() {
            return None;
        }
        self.at.1 += 1;
        let t0 = Instant::now();
        let out = self.make(ti, bi);
        self.index += 1;
        if let (Ok(b), Some(tel)) = (&out, &self.telemetry) {
            tel[telemetry_index(self.split)]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .deliver(&b.readings, 0, t0.elapsed().as_secs_f64());
        }
        Some(out)
    }
}

/// The pool readings of batch `bi` of task share `t` (batch size `b`):
/// this rank's seeds of the task still to come after it, and its batches.
#[allow(clippy::cast_precision_loss)]
fn pass_draw(t: &EvalTask, bi: usize, b: usize) -> DrawReadings {
    let left = t.entries.len().saturating_sub((bi + 1) * b) as f64;
    let share = t.entries.len() as f64;
    let fraction = if share > 0.0 { left / share } else { 0.0 };
    DrawReadings {
        remaining_min: left,
        remaining_max: left,
        remaining_fraction_min: fraction,
        remaining_fraction_max: fraction,
        steps_since_pick_max: 0.0,
        steps_to_exhaust_min: t.batches.saturating_sub(bi + 1) as f64,
        tv_distance: 0.0,
        // A pass does not follow the database mix: its seeds are never
        // counted as `databases/other_seeds`, its database readings are 0.
        database_reported: true,
        ..DrawReadings::default()
    }
}
