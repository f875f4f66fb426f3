//! Sampler state: where each split's stream stands, and its saved form.
//!
//! [`StreamState`] is everything a split's batch stream depends on besides
//! the snapshot and the config (see the scheme in `crate::seeds`): the next
//! step, one global position counter per task, the world-size history, and
//! the telemetry that must continue across a resume (last pick per task, the
//! mix window, the resume count). It holds nothing rank-specific, so every
//! rank of a run holds the same value, and nothing proportional to the
//! number of seeds: epoch orders are recomputed from (seed, epoch).
//!
//! The producer owns a working copy that runs ahead of the consumer; the
//! pipeline keeps a **delivered** copy that advances only when a batch is
//! handed to the consumer (by the task and step the batch carries), so a
//! state taken at any moment counts prefetched batches as not consumed.
//!
//! [`SamplerState`] is the saved form (`state_dict()`): versioned JSON with
//! a format tag, the snapshot content hash, the stream-relevant config
//! ([`StreamConfig`], and its hash), the task names, and per split the step,
//! world-size history, resume count, per task (pool size, epoch, cursor,
//! last pick) and the mix window. Restoring refuses, naming the field, a
//! state of another format or version, another snapshot, other tasks, a
//! different stream config value, or pool sizes that do not match; harmless
//! settings (rank, world size, threads, prefetch, telemetry, ports, RSS cap)
//! may differ. The `debug_*` fault knobs are not part of the state (a run
//! with an injected fault is not one to resume). A different world size is
//! a reshard: the history gains a span and the cursors continue.
//!
//! Stream keys ([`StreamConfig`]): `split_ratios`, `split_seed` (which seeds
//! are in a pool), `seed` (orders, picks, BFS generators), `task_weights`
//! (effective, per task) and `task_pick` (the pick of every step),
//! `default_batch_size` (positions per rank per step), `pool_fraction` (the
//! pool itself), `seed_windows` (the order of each epoch), `hot_set_bytes`
//! and `hot_set_steps` (with hot sets, the task of every step), and
//! `default_sequence_length`, `bfs_child_width`, `max_hops`,
//! `temporal_filter`: these four change no seed, only each batch's contents, `pack` and `pack_factor` (seeds per rank per step and
//! the layout; `pack_factor` counts only with `pack`), `sequence_lengths`
//! and `tokens_per_batch` (each step's `S` and `B`; absent from the JSON
//! while unset), the in-context recipe (`examples`, and with it
//! `local_context_sizes`, `bfs_widths`, `prefer_latest`, `num_walks`,
//! `walk_length`, `example_ranker`, with `expected` its `expected_prune`)
//! and `mask_prob_max`, and are refused
//! because the promise is bit-identical continuation. `context_deadline_ms`
//! is not a stream key: it changes a batch only when a build runs out of
//! time, which no promise covers. `config_hash` is xxh3 of their canonical
//! JSON: equal on all ranks of a consistent run.
//!
//! Files: this one holds [`StreamState`] and [`StreamConfig`]; `saved.rs`
//! the saved form, its JSON and its refusals. The sampler core's capture
//! and restore (`SamplerCore::capture`, `restore`) are the maker's
//! (`crate::maker`, `resume.rs`): this room knows nothing of the maker that
//! advances a stream.

use serde::{Deserialize, Serialize};

use crate::config::{ExampleRanker, SamplerConfig, TaskMixing, TaskPick};
use crate::seeds::MixWindow;

mod saved;

pub use saved::{
    DatabaseRecord, PoolRecord, SamplerState, SplitRecord, STATE_FORMAT, STATE_VERSION,
};

/// Where one split's stream stands.
#[derive(Debug, Clone)]
pub struct StreamState {
    /// The next step to make (producer) or deliver (delivered copy).
    pub step: u64,
    /// Per task: global pool positions consumed so far (all ranks).
    pub drawn: Vec<u64>,
    /// Per task: the last step that picked it.
    pub last_picked: Vec<Option<u64>>,
    /// The recent picks behind `mix/tv_distance` and the exhaust forecast.
    pub mix: MixWindow,
    /// `(first step, world size)` spans, the first at step 0, steps
    /// increasing: which world size consumed each step (for replay).
    pub world_sizes: Vec<(u64, u32)>,
    /// Times this stream was restored from a saved state.
    pub resumes: u64,
}

impl StreamState {
    /// Step 0 of a stream over `num_tasks` tasks at `world_size` ranks, with
    /// a mix window of `window` picks.
    pub fn new(num_tasks: usize, world_size: u32, window: usize) -> Self {
        StreamState {
            step: 0,
            drawn: vec![0; num_tasks],
            last_picked: vec![None; num_tasks],
            mix: MixWindow::new(num_tasks, window),
            world_sizes: vec![(0, world_size)],
            resumes: 0,
        }
    }

    /// The world size that consumes (or consumed) `step`.
    pub fn world_size_at(&self, step: u64) -> u32 {
        let i = self.world_sizes.partition_point(|&(from, _)| from <= step);
        self.world_sizes[i.saturating_sub(1)].1
    }

    /// Record that `step` (the current one) picked `task` and consumed
    /// `world size · batch_size` of its pool.
    pub fn advance(&mut self, task: usize, batch_size: usize) {
        let w = self.world_size_at(self.step) as u64;
        self.drawn[task] += w * batch_size as u64;
        self.last_picked[task] = Some(self.step);
        self.mix.push(task as u32);
        self.step += 1;
    }

    /// Record that `step` (the current one) drew its sequences' own tasks
    /// (`task_mixing = "sequence"`): `counts` holds (task, global pool
    /// positions consumed over every rank). The mix window records one
    /// pick per sequence.
    pub fn advance_counts(&mut self, counts: &[(u32, u64)]) {
        for &(k, n) in counts {
            let k = k as usize;
            self.drawn[k] += n;
            self.last_picked[k] = Some(self.step);
            for _ in 0..n {
                self.mix.push(k as u32);
            }
        }
        self.step += 1;
    }

    /// Record the step a batch made: its sequences' own tasks (`drawn`,
    /// as in [`Self::advance_counts`]) or, when empty, one task `task`
    /// with `batch_size()` positions per rank (as in [`Self::advance`]).
    pub fn advance_batch(
        &mut self,
        task: usize,
        drawn: &[(u32, u64)],
        batch_size: impl FnOnce() -> usize,
    ) {
        if drawn.is_empty() {
            self.advance(task, batch_size());
        } else {
            self.advance_counts(drawn);
        }
    }

    /// Continue with `world_size` ranks from the current step on.
    pub fn reshard(&mut self, world_size: u32) {
        if self.world_size_at(self.step) == world_size {
            return;
        }
        match self.world_sizes.last_mut() {
            Some(last) if last.0 == self.step => last.1 = world_size,
            _ => self.world_sizes.push((self.step, world_size)),
        }
    }
}

/// The config keys the stream depends on: a state is only restored under
/// the same values. `task_weights` is the effective list (uniform when
/// unset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Which seeds are in each split.
    pub split_ratios: [f64; 3],
    /// Seed of the split hash.
    pub split_seed: u64,
    /// Seed of the orders, picks and BFS generators.
    pub seed: u64,
    /// Effective weight per task (mixture order; for a mixture these
    /// already carry the database shares).
    pub task_weights: Vec<f64>,
    /// Effective share of batches per database (mixture order; `[1.0]`
    /// for one database).
    pub database_weights: Vec<f64>,
    /// How each step's task is chosen.
    pub task_pick: TaskPick,
    /// Positions per rank per step (B).
    pub default_batch_size: usize,
    /// Cells per sequence (S).
    pub default_sequence_length: usize,
    /// BFS children per row per hop.
    pub bfs_child_width: usize,
    /// BFS depth.
    pub max_hops: usize,
    /// Children filtered by observation time.
    pub temporal_filter: bool,
    /// Share of each global pool kept.
    pub pool_fraction: f64,
    /// Windows each pool is read in (absent at 1, as in states saved
    /// before windows existed, so those keep their hash).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub seed_windows: usize,
    /// Hot sets' bytes and cycle (`hot_set_bytes`, `hot_set_steps`), both
    /// absent when off (so states saved before hot sets keep their hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_set_bytes: Option<u64>,
    /// See `hot_set_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_set_steps: Option<u64>,
    /// Several seeds' contexts per sequence (absent in states saved before
    /// packing existed: false).
    #[serde(default)]
    pub pack: bool,
    /// Segments per sequence in effect: `pack_factor` with `pack`, else 1
    /// (so an unpacked stream does not depend on the ignored value).
    #[serde(default = "one")]
    pub pack_factor: usize,
    /// The `S` each step draws from (empty: fixed `S`; absent from the
    /// JSON then, so a fixed-length state and its hash are unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequence_lengths: Vec<usize>,
    /// Cells per rank per step with `sequence_lengths` (`B = tokens / S`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_batch: Option<usize>,
    /// In-context contexts (absent when off, as in states saved before they
    /// existed, so those keep their hash).
    #[serde(default, skip_serializing_if = "is_false")]
    pub examples: bool,
    /// The in-context recipe: these keys are present only with `examples`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_context_sizes: Option<Vec<usize>>,
    /// Per-sequence choices of the BFS child width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfs_widths: Option<Vec<usize>>,
    /// Per-sequence choices of recency-first ranking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_latest: Option<Vec<bool>>,
    /// Walks per context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_walks: Option<usize>,
    /// Rows per walk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk_length: Option<usize>,
    /// The ranker of tier-1 examples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub example_ranker: Option<ExampleRanker>,
    /// The `expected` ranker's pruning (present only with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_prune: Option<f64>,
    /// Highest masking probability (absent at 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mask_prob_max: f64,
    /// One task per step or per sequence (absent in states saved before
    /// mixing existed: per step).
    #[serde(default)]
    pub task_mixing: TaskMixing,
}

fn one() -> usize {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_one(n: &usize) -> bool {
    *n == 1
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_false(b: &bool) -> bool {
    !*b
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl StreamConfig {
    /// The stream keys of `cfg`, with `weights` its effective task weights
    /// (metadata order).
    pub fn of(cfg: &SamplerConfig, weights: &[f64], database_shares: &[f64]) -> Self {
        StreamConfig {
            split_ratios: cfg.split_ratios,
            split_seed: cfg.split_seed,
            seed: cfg.seed,
            task_weights: weights.to_vec(),
            database_weights: database_shares.to_vec(),
            task_pick: cfg.task_pick,
            default_batch_size: cfg.default_batch_size,
            default_sequence_length: cfg.default_sequence_length,
            bfs_child_width: cfg.bfs_child_width,
            max_hops: cfg.max_hops,
            temporal_filter: cfg.temporal_filter,
            pool_fraction: cfg.pool_fraction,
            seed_windows: cfg.seed_windows,
            hot_set_bytes: cfg.hot_set_bytes,
            hot_set_steps: cfg.hot_set_bytes.map(|_| cfg.hot_set_steps),
            pack: cfg.pack,
            pack_factor: cfg.segments_per_sequence(),
            sequence_lengths: cfg.sequence_lengths.clone(),
            tokens_per_batch: cfg.tokens_per_batch,
            examples: cfg.examples,
            local_context_sizes: cfg.examples.then(|| cfg.local_context_sizes.clone()),
            bfs_widths: cfg.examples.then(|| cfg.bfs_widths.clone()),
            prefer_latest: cfg.examples.then(|| cfg.prefer_latest.clone()),
            num_walks: cfg.examples.then_some(cfg.num_walks),
            walk_length: cfg.examples.then_some(cfg.walk_length),
            example_ranker: cfg.examples.then_some(cfg.example_ranker),
            expected_prune: (cfg.examples && cfg.example_ranker == ExampleRanker::Expected)
                .then_some(cfg.expected_prune),
            mask_prob_max: cfg.mask_prob_max,
            task_mixing: cfg.task_mixing,
        }
    }

    /// The sampler config keys of the stream, named as in
    /// [`crate::config::FIELDS`] (read off this struct's fields, so the list
    /// is defined here once). Every rank must use the same values: the ranks
    /// read one global stream, so a per-rank value would make them disagree
    /// about the pools, the orders or the picks.
    pub fn keys() -> Vec<String> {
        // Set the keys left out of the JSON while unset, so they are listed.
        let all = SamplerConfig {
            sequence_lengths: vec![1],
            tokens_per_batch: Some(1),
            examples: true,
            example_ranker: ExampleRanker::Expected,
            mask_prob_max: 0.5,
            seed_windows: 2,
            hot_set_bytes: Some(1 << 30),
            ..SamplerConfig::default()
        };
        let v = serde_json::to_value(Self::of(&all, &[], &[])).expect("serialisable");
        v.as_object().expect("object").keys().cloned().collect()
    }

    /// xxh3 of the canonical JSON, as 16 hex digits: equal on every rank of
    /// a run whose ranks share the stream (compare it across ranks).
    pub fn hash(&self) -> String {
        let s = serde_json::to_string(self).expect("serialisable");
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(s.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keys_are_config_keys() {
        let keys = StreamConfig::keys();
        assert_eq!(keys.len(), 29, "{keys:?}");
        for k in &keys {
            assert!(
                crate::config::FIELDS.iter().any(|f| f.name == k),
                "stream key {k} is not a sampler config key"
            );
        }
        for harmless in [
            "rank",
            "world_size",
            "num_threads",
            "num_prefetch",
            "debug_batch_delay_ms",
        ] {
            assert!(
                !keys.iter().any(|k| k == harmless),
                "{harmless} is not a stream key"
            );
        }
    }

    #[test]
    fn world_size_history_and_advance() {
        let mut s = StreamState::new(2, 4, 8);
        s.advance(0, 3); // step 0 at world size 4
        s.advance(1, 3);
        s.reshard(4); // same size: no new span
        assert_eq!(s.world_sizes, vec![(0, 4)]);
        s.reshard(2);
        s.reshard(3); // resharded twice before any step: one span
        assert_eq!(s.world_sizes, vec![(0, 4), (2, 3)]);
        s.advance(0, 3);
        assert_eq!(s.drawn, vec![12 + 9, 12]);
        assert_eq!(
            (s.world_size_at(1), s.world_size_at(2), s.world_size_at(99)),
            (4, 3, 3)
        );
        assert_eq!(s.last_picked, vec![Some(2), Some(1)]);
        assert_eq!(s.mix.picks().collect::<Vec<_>>(), vec![0, 1, 0]);
    }
}
