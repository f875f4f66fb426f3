//! Drawing a step: everything random about a batch, serially on the
//! producer — the task of the step, this rank's slice of the task's global
//! pool, each context's generator key — and the pool and mix readings right
//! after the draw (`crate::readings::DrawReadings`). A split's state (its
//! stream position, pools, picker and the buffers its batches are built
//! with) lives here, beside the draws that advance it.
//!
//! Determinism: a step's draws are a function of the split's
//! [`StreamState`] at that step, the rank and the world size; nothing here
//! depends on the thread count, which is what makes resume, skip and replay
//! exact.

use std::sync::Arc;
use std::time::Instant;

use super::plan::SamplerCore;
use super::pools::SeedLists;
use super::{derive, MIX_WINDOW};
use crate::batch::FxMap;
use crate::config::SamplerConfig;
use crate::context::Subgraph;
use crate::error::{Error, Result};
use crate::readings::{DatabaseDraw, DrawReadings};
use crate::say::warn;
use crate::seeds::{epoch_cursor, rank_slice, SeedPool, Split, TaskPicker};

use crate::stream::StreamState;

/// One split's sampling state on one rank: the stream position
/// ([`StreamState`], the only part that matters for the stream), the global
/// pools, the task picker and scratch buffers. Owned by the split's producer.
/// A pool is made at its task's first draw, from the sampler's seed list
/// (`pools.rs`), so a state is made without reading any seed.
pub struct SplitState {
    /// The split this state samples.
    pub split: Split,
    /// Where the split's stream stands (the only part that matters for it).
    pub stream: StreamState,
    /// The rank whose slice this state draws.
    pub rank: u32,
    /// Per task: its pool, once drawn from (`None` before, and always for
    /// a task without seeds in the split).
    pub(super) pools: Vec<Option<SeedPool>>,
    /// Per task: whether it has seeds in the split.
    pub(super) has_seeds: Vec<bool>,
    /// The sampler's seed lists (shared).
    pub(super) lists: Arc<SeedLists>,
    pub(super) picker: TaskPicker,
    /// The core's drop set when this state was made: the picker's weights
    /// and the shares the readings compare against (`drops.rs`).
    pub(super) drops: super::DropSet,
    /// Databases dropped (at open and in place) when this state was made.
    pub(super) dropped: usize,
    pub(super) buffers: BuildBuffers,
    /// Max rows per sequence and distinct texts of the last batch (the
    /// prediction of the next batch's size).
    pub(super) last_shape: (usize, usize),
}

impl SplitState {
    /// Predicted bytes of this split's next batch: `B·S` tensors exactly,
    /// row adjacency and text embeddings as large as in the last batch.
    pub fn predicted_batch_bytes(&self, cfg: &SamplerConfig, slots: usize, dim: usize) -> u64 {
        let (r, u) = self.last_shape;
        // A train step: its shortest S, the most sequences (the val stream
        // keeps the fixed shape).
        let shortest = cfg.sequence_lengths.iter().min().copied();
        let (b, s) = match (self.split, cfg.tokens_per_batch, shortest) {
            (Split::Train, Some(_), Some(s)) => (cfg.sequences_at(s), s),
            _ => (cfg.default_batch_size, cfg.default_sequence_length),
        };
        crate::batch::batch_bytes(b, s, (slots, cfg.mask_slots_at(s)), r, u, dim)
    }

    /// Seeds left before the next reshuffle and pool size per task (`None`
    /// = the task has no seeds in the split). Global: the same on every
    /// rank. A pool not yet drawn from is counted, not made.
    pub fn pool_sizes(&self) -> Vec<Option<(usize, usize)>> {
        (0..self.pools.len())
            .map(|k| {
                self.has_seeds[k].then(|| {
                    let n = self.pool_len(k);
                    let (_, cursor) = epoch_cursor(self.stream.drawn[k], n);
                    ((n - cursor) as usize, n as usize)
                })
            })
            .collect()
    }

    /// Global pool size per task (0 = no seeds in the split).
    pub fn pool_lens(&self) -> Vec<u64> {
        (0..self.pools.len()).map(|k| self.pool_len(k)).collect()
    }

    /// Global pool size of task `k` (0 = no seeds in the split).
    pub(super) fn pool_len(&self, k: usize) -> u64 {
        match &self.pools[k] {
            Some(p) => p.len() as u64,
            None if self.has_seeds[k] => self.lists.len(k, self.split),
            None => 0,
        }
    }

    /// Task `k`'s pool (it must have seeds), made from its seed list at
    /// the first draw; `cfg` keys its order.
    pub(super) fn pool(&mut self, k: usize, cfg: &SamplerConfig) -> Result<&mut SeedPool> {
        let pool = &mut self.pools[k];
        if pool.is_none() {
            let seeds = self.lists.list(k, self.split)?;
            let key = derive(cfg.seed, &[self.split.index() as u64, k as u64, 1]);
            *pool = Some(
                SeedPool::shared(seeds, key)
                    .with_repeat_fault(cfg.debug_repeat_seed_every)
                    .with_windows(cfg.seed_windows as u64),
            );
        }
        Ok(pool.as_mut().expect("made above"))
    }

    /// The generation of the core's drop set this state was made under
    /// (its picker's weights).
    pub fn drop_generation(&self) -> u64 {
        self.drops.generation
    }

    /// The task step `step` picks (`None`: no task can be picked).
    pub fn pick(&self, step: u64) -> Option<usize> {
        (!self.picker.is_empty()).then(|| self.picker.pick(step) as usize)
    }
}

impl SamplerCore {
    /// Fresh sampling state for `split` on this rank (step 0).
    pub fn split_state(&self, split: Split) -> SplitState {
        let n = self.tasks.len();
        let stream = StreamState::new(n, self.cfg.world_size, MIX_WINDOW);
        self.split_state_at(split, stream, self.cfg.rank)
    }

    /// Global pool size per task in `split` (0 = no seeds in it), as a
    /// fresh state of it counts them, without making a state.
    pub fn pool_lens(&self, split: Split) -> Vec<u64> {
        (0..self.tasks.len())
            .map(|k| {
                if self.seed_lists.any(k, split) {
                    self.seed_lists.len(k, split)
                } else {
                    0
                }
            })
            .collect()
    }

    /// Sampling state for `split` on `rank`, continuing `stream`, with the
    /// weights of the drop set now.
    pub fn split_state_at(&self, split: Split, stream: StreamState, rank: u32) -> SplitState {
        let c = &self.cfg;
        let n = self.tasks.len();
        let drops = self.drop_set();
        let dropped = self.dropped.len() + drops.gone.len();
        let mut has_seeds = Vec::with_capacity(n);
        for k in 0..n {
            // The split hash takes the task's index in its own database, so
            // a database's splits are the same alone or in any mixture.
            let any = self.seed_lists.any(k, split);
            if !any && drops.weights[k] > 0.0 && rank == c.rank {
                warn(&format!(
                    "task `{}` has no {} seeds; it is skipped",
                    self.task_names[k],
                    split.name(),
                ));
            }
            has_seeds.push(any);
        }
        let key = derive(c.seed, &[split.index() as u64, 3]);
        let picker = self.hot_picker(
            TaskPicker::new(c.task_pick, &drops.weights, &has_seeds, key),
            split,
        );
        SplitState {
            split,
            stream,
            rank,
            pools: (0..n).map(|_| None).collect(),
            has_seeds,
            lists: self.seed_lists.clone(),
            picker,
            drops,
            dropped,
            buffers: BuildBuffers::default(),
            last_shape: (0, 0),
        }
    }

    /// The key every random choice of step `step` of `split` derives from.
    pub(super) fn step_key(&self, split: Split, step: u64) -> u64 {
        derive(self.cfg.seed, &[split.index() as u64, step, 2])
    }

    /// Pick the batch's task, draw this rank's slice of its global pool into
    /// `jobs` (seed, anchor row, observation time, per-sequence RNG seed)
    /// and advance the stream. Everything random about a batch
    /// happens here, serially, which is what makes batches independent of
    /// the thread count and replayable.
    pub(super) fn draw(
        &self,
        state: &mut SplitState,
        jobs: &mut Vec<(u32, u32, i64, u64)>,
    ) -> Result<Draws> {
        Self::check_can_draw(state)?;
        let step = state.stream.step;
        let world_size = state.stream.world_size_at(step);
        if state.rank >= world_size {
            return Err(Error::invalid(
                "rank",
                format!(
                    "{} is not a rank of the world size {world_size} of step {step}",
                    state.rank
                ),
            ));
        }
        if self.mixes_sequences() {
            return self.draw_mixed(state, jobs, world_size);
        }
        let k = state.picker.pick(step) as usize;
        let hot_set_rotations = self.hot_step(state, step);
        let key = self.step_key(state.split, step);
        let task = self.task_lazy(k)?;
        let (seq_len, b) = self.step_shape(state.split, k, step);
        let mut d = Draws {
            task: k,
            seq_len,
            step,
            key,
            world_size,
            exhaust_events: 0,
            window_rotations: 0,
            hot_set_rotations,
            duplicates: 0,
            groups: Vec::new(),
            drawn: Vec::new(),
        };
        jobs.clear();
        let slice = rank_slice(state.stream.drawn[k], state.rank, b);
        let first_slot = state.rank as u64 * b as u64;
        let pool = state.pool(k, &self.cfg)?;
        for (j, p) in slice.enumerate() {
            let x = pool.at(p);
            d.exhaust_events += x.exhausted as u32;
            d.window_rotations += x.window_opened as u32;
            d.duplicates += x.duplicate as u32;
            let i = x.seed as usize;
            // What the batch reads of this seed's task entries, checked.
            task.check_seed(i);
            let row = task.anchor_rows[i];
            jobs.push((
                x.seed,
                row,
                task.obs_times[i],
                derive(key, &[first_slot + j as u64]),
            ));
        }
        // A seed entry read from a corrupt block fails the draw, naming it.
        self.dbs[self.tasks[k].db].db.integrity().check()?;
        state.stream.advance(k, b);
        Ok(d)
    }

    /// Advance `state` past `n` batches without building them or drawing
    /// their seeds: the same stream positions as
    /// [`make_batch`](Self::make_batch), O(1) per batch.
    pub fn skip_batches(&self, state: &mut SplitState, n: u64) -> Result<()> {
        for _ in 0..n {
            Self::check_can_draw(state)?;
            if self.mixes_sequences() {
                self.skip_mixed(state);
                continue;
            }
            let k = state.picker.pick(state.stream.step) as usize;
            let (_, b) = self.step_shape(state.split, k, state.stream.step);
            state.stream.advance(k, b);
        }
        Ok(())
    }

    pub(super) fn check_can_draw(state: &SplitState) -> Result<()> {
        if state.picker.is_empty() {
            return Err(Error::invalid(
                "task_weights",
                format!("no task with weight > 0 has {} seeds", state.split.name()),
            ));
        }
        Ok(())
    }

    /// The serial part of the next batch of `state`'s split: its draws
    /// (everything random about it) and, with telemetry, the pool and mix
    /// state after them. Advances the stream; [`build`](Self::build) makes
    /// the batch from the plan alone, on any thread.
    pub(super) fn plan(&self, state: &mut SplitState) -> Result<Planned> {
        Self::check_can_draw(state)?;
        assert!(
            self.cfg.debug_panic_at_step != Some(state.stream.step),
            "debug_panic_at_step: deliberate panic at {} step {}",
            state.split.name(),
            state.stream.step
        );
        if self.cfg.debug_drop_page_cache_every > 0
            && state.stream.step % self.cfg.debug_drop_page_cache_every == 0
        {
            // Before the batch's clock starts: the drop is the injection's
            // cost, not the sampler's (the faults it causes are).
            for mdb in &self.dbs {
                crate::faults::drop_page_cache(mdb.db.dir());
            }
        }
        let t0 = Instant::now();
        if self.cfg.debug_batch_delay_ms > 0.0 {
            std::thread::sleep(std::time::Duration::from_secs_f64(
                self.cfg.debug_batch_delay_ms / 1e3,
            ));
        }
        // Watched after the deliberate delay: a slow sampler is not a stuck one.
        let watched = self.watch(crate::stalls::Stage::Draw, state.stream.step);
        let mut jobs = Vec::with_capacity(self.seeds_per_step.iter().copied().max().unwrap_or(0));
        let draws = self.draw(state, &mut jobs)?;
        // The small page cache's drops are the injection's cost, not the
        // sampler's (the faults they cause are).
        let injected = self.small_cache_read(&draws);
        let draw = self.cfg.telemetry.then(|| {
            // The mix a hot-set schedule expects over the window, once for both.
            let hot = self.hot_mix(state, draws.step, draws.world_size);
            let mut d = self.draw_readings(state, draws.step, draws.world_size, hot.as_deref());
            self.database_stats(state, draws.task, draws.step, hot.as_deref(), &mut d);
            d
        });
        Ok(Planned {
            draws,
            jobs,
            draw,
            split: state.split,
            rank: state.rank,
            planning: t0.elapsed().saturating_sub(injected),
            stall: watched
                .map(crate::stalls::Watched::finish)
                .unwrap_or_default(),
        })
    }
}

impl SamplerCore {
    /// With `debug_page_cache_bytes`: the databases the batch of `draws`
    /// reads become the small page cache's most recent, and the ones it
    /// no longer holds are dropped. Returns the time the drops took.
    fn small_cache_read(&self, draws: &Draws) -> std::time::Duration {
        let Some(cache) = &self.small_cache else {
            return std::time::Duration::ZERO;
        };
        let t0 = Instant::now();
        let used: Vec<usize> = if draws.groups.is_empty() {
            vec![self.tasks[draws.task].db]
        } else {
            draws.groups.iter().map(|g| self.tasks[g.0].db).collect()
        };
        let bytes: Vec<u64> = self.dbs.iter().map(|m| m.db.bytes_on_disk()).collect();
        for i in cache.read(&used, &bytes) {
            crate::faults::drop_page_cache(self.dbs[i].db.dir());
        }
        t0.elapsed()
    }

    /// Steps up to `step` since database `d` was last picked at `last`
    /// (`None`: never, so since step 0): with hot sets, only the steps of
    /// its group's spans count, so a database waiting for its span is not
    /// read as starved.
    fn scheduled_since(state: &SplitState, d: usize, last: Option<u64>, step: u64) -> u64 {
        let from = last.map_or(0, |s| s + 1);
        match state.picker.hot_sets() {
            Some(h) => h.steps_on(h.group_of(d), from, step + 1),
            None => step + 1 - from,
        }
    }

    /// Pool and mix measurements after step `step` drew task `k`'s seeds
    /// (the stream has advanced past it). Pool figures are global (the same
    /// on every rank); `hot`: the mix a hot-set schedule expects (`hot.rs`).
    #[allow(clippy::cast_precision_loss)]
    fn draw_readings(
        &self,
        state: &SplitState,
        step: u64,
        world_size: u32,
        hot: Option<&[f64]>,
    ) -> DrawReadings {
        let st = &state.stream;

        let mut t = DrawReadings {
            remaining_min: f64::INFINITY,
            remaining_max: f64::NEG_INFINITY,
            remaining_fraction_min: f64::INFINITY,
            remaining_fraction_max: f64::NEG_INFINITY,
            steps_since_pick_max: f64::NEG_INFINITY,
            steps_to_exhaust_min: f64::INFINITY,
            tv_distance: st.mix.tv_distance(hot.unwrap_or(&state.drops.weights)),
            ..DrawReadings::default()
        };
        for j in 0..state.pools.len() {
            if state.drops.weights[j] <= 0.0 {
                continue;
            }
            let since = Self::scheduled_since(state, self.tasks[j].db, st.last_picked[j], step);
            t.steps_since_pick_max = t.steps_since_pick_max.max(since as f64);
            if !state.has_seeds[j] {
                continue;
            }
            let n = state.pool_len(j);
            let (_, cursor) = epoch_cursor(st.drawn[j], n);
            let (rem, len) = ((n - cursor) as f64, n as f64);
            t.remaining_min = t.remaining_min.min(rem);
            t.remaining_max = t.remaining_max.max(rem);
            t.remaining_fraction_min = t.remaining_fraction_min.min(rem / len);
            t.remaining_fraction_max = t.remaining_fraction_max.max(rem / len);
            let b = (world_size as usize * self.step_shape(state.split, j, step).1) as f64;
            let rate = st.mix.count(j) as f64 / st.mix.len().max(1) as f64 * b;
            if rate > 0.0 {
                t.steps_to_exhaust_min = t.steps_to_exhaust_min.min(rem / rate);
            }
        }
        t
    }
}

impl SamplerCore {
    /// The per-database part of the draw stats after step `step` drew
    /// mixture task `k` (see the `databases/…` rows of the metric table):
    /// O(tasks + databases) per batch, on the producer.
    #[allow(clippy::cast_precision_loss)]
    fn database_stats(
        &self,
        state: &SplitState,
        k: usize,
        step: u64,
        hot: Option<&[f64]>,
        t: &mut DrawReadings,
    ) {
        let st = &state.stream;
        let nd = self.dbs.len();
        let shares = &state.drops.shares;
        let mut last: Vec<Option<u64>> = vec![None; nd];
        let mut frac = vec![f64::INFINITY; nd];
        let mut counts = vec![0u64; nd];
        for j in 0..state.pools.len() {
            let d = self.tasks[j].db;
            counts[d] += st.mix.count(j);
            last[d] = last[d].max(st.last_picked[j]);
            if state.drops.weights[j] <= 0.0 {
                continue;
            }
            if state.has_seeds[j] {
                let n = state.pool_len(j);
                let (_, cursor) = epoch_cursor(st.drawn[j], n);
                frac[d] = frac[d].min((n - cursor) as f64 / n as f64);
            }
        }
        let n = st.mix.len() as f64;
        // With hot sets a span follows its group: its databases' expected shares.
        let hot = hot.map(|mix| {
            let mut s = vec![0.0; nd];
            for (j, w) in mix.iter().enumerate() {
                s[self.tasks[j].db] += w;
            }
            s
        });
        t.database_tv_distance = if n > 0.0 {
            0.5 * (0..nd)
                .zip(&counts)
                .map(|(d, &c)| (c as f64 / n - hot.as_ref().map_or(shares[d], |s| s[d])).abs())
                .sum::<f64>()
        } else {
            0.0
        };
        let since = |d: usize| Self::scheduled_since(state, d, last[d], step) as f64;
        t.database_steps_since_pick_max = f64::NEG_INFINITY;
        t.database_remaining_fraction_min = f64::INFINITY;
        for (d, &share) in shares.iter().enumerate() {
            if share <= 0.0 {
                continue;
            }
            if since(d) > t.database_steps_since_pick_max {
                t.database_steps_since_pick_max = since(d);
                t.database_steps_since_pick_worst = d as f64;
            }
            if frac[d] < t.database_remaining_fraction_min {
                t.database_remaining_fraction_min = frac[d];
                t.database_remaining_fraction_worst = d as f64;
            }
        }
        t.database_reported = self.reported[self.tasks[k].db].is_some();
        t.dropped_databases = state.dropped as f64;
        t.databases.clear();
        for &d in &self.schema.database_ids {
            t.databases.push(DatabaseDraw {
                steps_since_pick: since(d),
                remaining_fraction_min: frac[d],
            });
        }
    }
}

/// Buffers one batch in flight builds with (recycled across batches).
#[derive(Default)]
pub(crate) struct BuildBuffers {
    pub(crate) subgraphs: Vec<Subgraph>,
    pub(crate) text_map: FxMap<u32, u32>,
    /// Keyed by (database, text id): a batch of several databases.
    pub(crate) text_map_mixed: FxMap<u64, u32>,
}

/// A batch drawn but not built: see [`SamplerCore::plan`].
pub(super) struct Planned {
    pub(super) draws: Draws,
    pub(super) jobs: Vec<(u32, u32, i64, u64)>,
    pub(super) draw: Option<DrawReadings>,
    pub(super) split: Split,
    pub(super) rank: u32,
    /// Time spent planning (the draws and any `debug_batch_delay_ms`).
    pub(super) planning: std::time::Duration,
    /// Whether the draw stalled (`crate::stalls`).
    pub(super) stall: crate::stalls::StallOutcome,
}

/// The random choices of one batch.
pub(super) struct Draws {
    pub(super) task: usize,
    /// The step's sequence length `S` (`shape.rs`).
    pub(super) seq_len: usize,
    pub(super) step: u64,
    pub(super) key: u64,
    pub(super) world_size: u32,
    pub(super) exhaust_events: u32,
    pub(super) window_rotations: u32,
    /// 1 when the step starts a hot set's span (`hot.rs`).
    pub(super) hot_set_rotations: u32,
    pub(super) duplicates: u32,
    /// With `task_mixing = "sequence"`: the jobs of each task (else empty:
    /// every job is of `task`).
    pub(super) groups: Vec<super::plan::TaskGroup>,
    /// With `task_mixing = "sequence"`: (task, global positions consumed).
    pub(super) drawn: Vec<(u32, u64)>,
}
