//! Making one batch: pick a task, draw seeds, BFS in parallel, assemble in
//! parallel, collate text serially.
//!
//! Determinism: the stream follows `crate::seeds` — the task of a step is a
//! function of (`seed`, split, step), the seeds are the rank's slice of the
//! task's global pool at its counter, and each sequence's BFS generator is
//! derived from (`seed`, split, step, global slot) before the parallel
//! phase — so the thread count never changes a batch, and a batch is a
//! function of the split's [`StreamState`] at its step, the rank and the
//! world size (which is what makes resume, skip and replay exact).

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::batch::{
    assemble_packed_sequence, collate_text, pack_contexts, AssembleScratch, Batch, FxMap,
    SeqContext, TableCells, Target,
};
use crate::config::SamplerConfig;
use crate::error::{Error, Result};
use crate::format::{Database, GraphView};
use crate::rng::{mix64, Xoshiro256pp};
use crate::sampler::{bfs, BfsParams, BfsScratch, Subgraph};
use crate::seeds::{
    epoch_cursor, rank_slice, task_split_seeds, DrawStats, SeedPool, Split, TaskPicker,
};
use crate::telemetry::TelemetrySchema;

use super::mixture::{database_names, in_database, mixture_weights, too_many};
use super::state::StreamState;

/// Batches in the sliding window behind `mix/tv_distance` and the exhaust forecast.
pub const MIX_WINDOW: usize = 64;

/// Seeds whose contexts are built to measure a task's mean context size
/// for `pack_factor = 0`.
pub const PACK_PROBE: usize = 64;

/// How a task's target cell is found.
#[derive(Debug, Clone, Copy)]
enum TargetPlan {
    Cell { slot: usize },
    Virtual { column_idx: u32, code: i8 },
}

#[derive(Debug, Clone)]
pub(super) struct TaskPlan {
    /// The mixture database the task belongs to.
    pub(super) db: usize,
    /// The task's index in its database's metadata.
    local: usize,
    target: TargetPlan,
    seed_cells: usize,
    stype_code: u8,
    /// First categorical id of the target column, in the mixture's
    /// concatenated categorical table.
    cat_emb_start: u32,
    cat_emb_count: u32,
}

/// One database of a mixture (a single database is a mixture of one).
pub struct MixtureDatabase {
    /// The name batches, telemetry and errors use for it (unique in the
    /// mixture).
    pub name: String,
    /// The open, validated database.
    pub db: Arc<Database>,
    /// Its share of batches (normalised database weight).
    pub share: f64,
    /// Its first task's index among the mixture's tasks.
    pub first_task: usize,
    /// Its first column's id in the mixture's concatenated column table.
    pub column_offset: u32,
    /// Its first category's id in the concatenated categorical table.
    pub categorical_offset: u32,
    row_cells: Vec<u16>,
}

/// Everything immutable a sampler needs, shared by its producers.
///
/// A sampler samples a **mixture** of databases; a single database is a
/// mixture of one and takes the same path. The mixture's tasks are the
/// databases' tasks concatenated in the order the databases were given
/// (database 0's tasks first), and every per-task structure (pools, picker,
/// stream counters, `task_idx`) is indexed by that mixture task index, so
/// for one database nothing changes. The effective weight of task `t` of
/// database `d` is `w_t · p_d / (S_d / S)`, where `w_t` is its task weight,
/// `S_d` the sum of `d`'s task weights, `S` the sum over all databases and
/// `p_d` the normalised database weight: database `d` then gets share `p_d`
/// of the batches, its tasks split it in proportion to their weights, and
/// for one database the factor is exactly 1 (bit-identical picks).
pub struct SamplerCore {
    /// The databases of the mixture, in the order given.
    pub dbs: Vec<MixtureDatabase>,
    /// The validated configuration.
    pub cfg: SamplerConfig,
    tasks: Vec<TaskPlan>,
    task_names: Vec<String>,
    /// Per database: its slot among the databases with their own telemetry
    /// series (`None`: folded into the aggregates).
    reported: Vec<Option<usize>>,
    weights: Vec<f64>,
    pool: rayon::ThreadPool,
    /// The telemetry schema of this mixture and config.
    pub schema: TelemetrySchema,
    /// The concatenated embedding tables of a mixture, built on first use.
    pub(super) concatenated: super::mixture::Concatenated,
    /// Seconds [`SamplerCore::new`] took (open + preparation); 0 when the
    /// databases were opened elsewhere. `Sampler` adds the seed-pool build.
    pub startup_seconds: f64,
    /// Seeds per rank per step of each task (`seeds_per_step`).
    seeds_per_step: Vec<usize>,
    /// The `K` of the `[B, K]` tensors (`segment_slots`).
    segment_slots: usize,
}

/// One split's sampling state on one rank: the stream position
/// ([`StreamState`], the only part that matters for the stream), the global
/// pools, the task picker and scratch buffers. Owned by the split's producer.
pub struct SplitState {
    /// The split this state samples.
    pub split: Split,
    /// Where the split's stream stands (the only part that matters for it).
    pub stream: StreamState,
    /// The rank whose slice this state draws.
    pub rank: u32,
    pools: Vec<Option<SeedPool>>,
    picker: TaskPicker,
    buffers: BuildBuffers,
    /// Max rows per sequence and distinct texts of the last batch (the
    /// prediction of the next batch's size).
    last_shape: (usize, usize),
}

impl SplitState {
    /// Predicted bytes of this split's next batch: `B·S` tensors exactly,
    /// row adjacency and text embeddings as large as in the last batch.
    pub fn predicted_batch_bytes(&self, cfg: &SamplerConfig, slots: usize, dim: usize) -> u64 {
        let (r, u) = self.last_shape;
        crate::batch::batch_bytes(
            cfg.default_batch_size,
            cfg.default_sequence_length,
            slots,
            r,
            u,
            dim,
        )
    }

    /// Seeds left before the next reshuffle and pool size per task (`None`
    /// = the task has no seeds in the split). Global: the same on every rank.
    pub fn pool_sizes(&self) -> Vec<Option<(usize, usize)>> {
        self.pools
            .iter()
            .zip(&self.stream.drawn)
            .map(|(p, &d)| {
                p.as_ref().map(|p| {
                    let n = p.len() as u64;
                    let (_, cursor) = epoch_cursor(d, n);
                    ((n - cursor) as usize, n as usize)
                })
            })
            .collect()
    }

    /// Global pool size per task (0 = no seeds in the split).
    pub fn pool_lens(&self) -> Vec<u64> {
        self.pools
            .iter()
            .map(|p| p.as_ref().map_or(0, |p| p.len() as u64))
            .collect()
    }

    /// The task step `step` picks (`None`: no task can be picked).
    pub fn pick(&self, step: u64) -> Option<usize> {
        (!self.picker.is_empty()).then(|| self.picker.pick(step) as usize)
    }
}

thread_local! {
    static SCRATCH: RefCell<(BfsScratch, AssembleScratch)> = RefCell::new(Default::default());
}

/// Builds task contexts: one BFS from a seed row, with this thread's
/// scratch (the probe of `pack_factor = 0` and every batch use it).
struct ContextBuilder<'a> {
    graph: GraphView<'a>,
    row_cells: &'a [u16],
    seed_cells: usize,
    params: BfsParams,
}

impl ContextBuilder<'_> {
    /// The context of anchor `row` observed at `obs_time` under `budget`
    /// cells, its RNG keyed by `rng_seed`, into `sub`.
    fn build(&self, row: u32, obs_time: i64, rng_seed: u64, budget: usize, sub: &mut Subgraph) {
        SCRATCH.with(|sc| {
            let mut rng = Xoshiro256pp::seed_from_u64(rng_seed);
            let p = BfsParams {
                max_cells: budget,
                ..self.params
            };
            bfs(
                &self.graph,
                self.row_cells,
                row,
                self.seed_cells,
                obs_time,
                &p,
                &mut rng,
                &mut sc.borrow_mut().0,
                sub,
            );
        });
    }
}

fn derive(seed: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(mix64(seed ^ 0x6865_6164_7761_7465), |acc, &p| {
            mix64(acc ^ mix64(p.wrapping_add(0x9E37_79B9)))
        })
}

impl SamplerCore {
    /// Open `db_path` and prepare sampling with `cfg` (validated here).
    pub fn new(db_path: impl AsRef<Path>, cfg: SamplerConfig) -> Result<Self> {
        Self::open_mixture(&[db_path.as_ref().to_path_buf()], cfg)
    }

    /// Open every database of `paths` (named by their folder names, made
    /// unique with `#2`, `#3`, … when two are equal) and prepare sampling
    /// the mixture with `cfg`. An open error names the database; the
    /// databases opened before it are closed (their maps dropped) before
    /// the error is returned.
    pub fn open_mixture(paths: &[std::path::PathBuf], cfg: SamplerConfig) -> Result<Self> {
        let t0 = Instant::now();
        if paths.is_empty() {
            return Err(Error::invalid(
                "databases",
                "a mixture needs at least one database".to_string(),
            ));
        }
        let names = database_names(paths);
        let mut dbs = Vec::with_capacity(paths.len());
        for (name, path) in names.into_iter().zip(paths) {
            let db = Database::open_for(path, cfg.verify, cfg.page_cache)
                .map_err(|e| in_database(&name, e))?;
            dbs.push((name, Arc::new(db)));
        }
        let mut core = Self::with_databases(dbs, cfg)?;
        core.startup_seconds = t0.elapsed().as_secs_f64();
        Ok(core)
    }

    /// Prepare sampling an already open database with `cfg` (validated here).
    pub fn with_database(db: Arc<Database>, cfg: SamplerConfig) -> Result<Self> {
        let name = database_names(&[db.dir().to_path_buf()]).remove(0);
        Self::with_databases(vec![(name, db)], cfg)
    }

    /// Prepare sampling the mixture of the already open `dbs` (name,
    /// database) with `cfg` (validated here). Every database must share the
    /// first one's embedder (name and dimension).
    #[allow(clippy::cast_possible_truncation, clippy::too_many_lines)]
    pub fn with_databases(dbs: Vec<(String, Arc<Database>)>, cfg: SamplerConfig) -> Result<Self> {
        let single = dbs.len() == 1;
        let Some((first_name, first)) = dbs.first() else {
            return Err(Error::invalid(
                "databases",
                "a mixture needs at least one database".to_string(),
            ));
        };
        let emb = first.metadata().embedder.clone();
        for (name, db) in &dbs[1..] {
            let e = &db.metadata().embedder;
            if *e != emb {
                return Err(Error::invalid(
                    "databases",
                    format!(
                        "database `{name}` was embedded with `{}` (dimension {}) but database `{first_name}` with `{}` (dimension {}); a mixture needs one embedder",
                        e.name, e.dim, emb.name, emb.dim
                    ),
                ));
            }
        }
        let db_names: Vec<String> = dbs.iter().map(|d| d.0.clone()).collect();
        if let Some(i) = (1..db_names.len()).find(|&i| db_names[..i].contains(&db_names[i])) {
            return Err(Error::invalid(
                "databases",
                format!("two databases are named `{}`", db_names[i]),
            ));
        }
        let mut task_names = Vec::new();
        for (name, db) in &dbs {
            for k in &db.metadata().tasks {
                task_names.push(if single {
                    k.name.clone()
                } else {
                    format!("{name}/{}", k.name)
                });
            }
        }
        cfg.validate(Some(&task_names))?;
        let db_weights = cfg.database_weights_for(&db_names)?;
        let listed = cfg.telemetry_databases_for(&db_names)?;
        let task_w = cfg.weights_for(&task_names)?;
        let db_total: f64 = db_weights.iter().sum();
        let mut tasks = Vec::with_capacity(task_names.len());
        let mut mixture = Vec::with_capacity(dbs.len());
        let (mut col_off, mut cat_off) = (0u64, 0u64);
        for (d, (name, db)) in dbs.into_iter().enumerate() {
            let m = db.metadata();
            let first_task = tasks.len();
            let row_cells: Vec<u16> = m
                .tables
                .iter()
                .map(|t| t.columns.len().min(u16::MAX as usize) as u16)
                .collect();
            for (local, k) in m.tasks.iter().enumerate() {
                let col = &m.columns[k.target_column as usize];
                let table = &m.tables[k.anchor_table as usize];
                let target = match col.slot {
                    Some(slot) if col.table == k.anchor_table => TargetPlan::Cell {
                        slot: slot as usize,
                    },
                    _ => TargetPlan::Virtual {
                        column_idx: col.idx,
                        code: k.target_stype.code().unwrap_or(0) as i8,
                    },
                };
                let extra = matches!(target, TargetPlan::Virtual { .. }) as usize;
                tasks.push(TaskPlan {
                    db: d,
                    local,
                    target,
                    seed_cells: table.columns.len() + extra,
                    stype_code: k.target_stype.code().unwrap_or(0),
                    cat_emb_start: col.cat_emb_start + cat_off as u32,
                    cat_emb_count: col.cat_emb_count,
                });
            }
            let (column_offset, categorical_offset) = (
                u32::try_from(col_off).map_err(|_| too_many("columns"))?,
                u32::try_from(cat_off).map_err(|_| too_many("categories"))?,
            );
            col_off += m.columns.len() as u64;
            cat_off += m.num_categorical_embeddings;
            mixture.push(MixtureDatabase {
                name,
                share: db_weights[d] / db_total,
                first_task,
                column_offset,
                categorical_offset,
                row_cells,
                db,
            });
        }
        u32::try_from(col_off).map_err(|_| too_many("columns"))?;
        u32::try_from(cat_off).map_err(|_| too_many("categories"))?;
        if cfg.pack {
            let widest = tasks.iter().map(|t| t.seed_cells).max().unwrap_or(0);
            if cfg.pack_factor * widest > cfg.default_sequence_length {
                return Err(crate::config::bad(
                    "pack_factor",
                    format!(
                        "{} (x {widest} cells, the widest seed row of these databases, exceeds default_sequence_length {})",
                        cfg.pack_factor, cfg.default_sequence_length
                    ),
                ));
            }
        }
        let weights = mixture_weights(&task_w, &tasks, &mixture);
        let threads = cfg.num_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("headwater-worker-{i}"))
            .build()
            .map_err(|e| Error::Worker(format!("cannot build the sampler thread pool: {e}")))?;
        let (schema, reported) = mixture_schema(&cfg, listed, &task_names, &tasks, &mixture);
        let mut core = SamplerCore {
            reported,
            dbs: mixture,
            cfg,
            tasks,
            task_names,
            weights,
            pool,
            schema,
            concatenated: super::mixture::Concatenated::default(),
            startup_seconds: 0.0,
            seeds_per_step: Vec::new(),
            segment_slots: 1,
        };
        core.plan_packing();
        Ok(core)
    }

    /// Seeds per step and segment slots of every task (see
    /// [`seeds_per_step`](Self::seeds_per_step)).
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    fn plan_packing(&mut self) {
        let (b, s) = (
            self.cfg.default_batch_size,
            self.cfg.default_sequence_length,
        );
        self.seeds_per_step = (0..self.tasks.len())
            .map(|k| match (self.cfg.pack, self.cfg.pack_factor) {
                (false, _) => b,
                (true, 0) => {
                    let fit = (s / self.tasks[k].seed_cells.max(1)).clamp(1, 64);
                    let per_seq = (s as f64 / self.probe_context_cells(k)).clamp(1.0, fit as f64);
                    ((b as f64 * per_seq).round() as usize).clamp(b, b * fit)
                }
                (true, pf) => b * pf,
            })
            .collect();
        let most = self
            .seeds_per_step
            .iter()
            .map(|&n| n.div_ceil(b.max(1)))
            .max()
            .unwrap_or(1);
        self.segment_slots = if most <= 1 { 1 } else { (2 * most).min(255) };
    }

    /// The [`ContextBuilder`] of task `k` (budget `S` unless given).
    fn context_builder(&self, k: usize) -> ContextBuilder<'_> {
        let plan = &self.tasks[k];
        let mdb = &self.dbs[plan.db];
        ContextBuilder {
            graph: mdb.db.graph(),
            row_cells: &mdb.row_cells,
            seed_cells: plan.seed_cells,
            params: BfsParams {
                max_cells: self.cfg.default_sequence_length,
                max_hops: self.cfg.max_hops,
                child_width: self.cfg.bfs_child_width,
                temporal_filter: self.cfg.temporal_filter,
            },
        }
    }

    /// The mean unpacked context size (cells, BFS budget `S`) of up to
    /// [`PACK_PROBE`] seeds spread over task `k`'s seed list (all splits:
    /// only their sizes are read), each BFS with a fixed key: deterministic,
    /// the same on every rank and after a resume.
    #[allow(clippy::cast_precision_loss)]
    fn probe_context_cells(&self, k: usize) -> f64 {
        let plan = &self.tasks[k];
        let mdb = &self.dbs[plan.db];
        let Ok(task) = mdb.db.task(plan.local) else {
            return self.cfg.default_sequence_length as f64;
        };
        let anchor_table = mdb.db.metadata().tasks[plan.local].anchor_table as usize;
        let n = task.anchor_rows.len();
        let probes = n.min(PACK_PROBE);
        let builder = self.context_builder(k);
        let s = self.cfg.default_sequence_length;
        let cells: Vec<usize> = self.pool.install(|| {
            (0..probes)
                .into_par_iter()
                .filter_map(|j| {
                    let i = j * n / probes;
                    let row = task.anchor_rows[i];
                    // A corrupt anchor is reported when a batch draws it.
                    (builder.graph.table_of(row) == Some(anchor_table)).then(|| {
                        let mut sub = Subgraph::default();
                        let key = derive(self.cfg.seed, &[k as u64, i as u64, 3]);
                        builder.build(row, task.obs_times[i], key, s, &mut sub);
                        sub.cells
                    })
                })
                .collect()
        });
        if cells.is_empty() {
            return self.cfg.default_sequence_length as f64;
        }
        cells.iter().sum::<usize>() as f64 / cells.len() as f64
    }

    /// Seeds each rank draws per step of task `k` (the global cursor of the
    /// task advances by `world_size` times this): `B` unpacked,
    /// `B·pack_factor` packed, and with `pack_factor = 0` per task
    /// `B · S / c̄` rounded (at least `B`, at most what the seed rows allow
    /// and 64 per sequence), `c̄` the mean context size of a probe of the
    /// task's seeds measured when the sampler was made: as many contexts
    /// as fill the sequences on average.
    pub fn seeds_per_step(&self, k: usize) -> usize {
        self.seeds_per_step[k]
    }

    /// Segment slots per sequence, the `K` of the `[B, K]` tensors: a
    /// packed sequence holds 1 to `K` contexts, so small contexts fill the
    /// room large ones leave. Twice the most seeds per sequence on average
    /// of any task; 1 when every task draws `B` (unpacked, or
    /// `pack_factor = 1`: the unpacked layout).
    pub fn segment_slots(&self) -> usize {
        self.segment_slots
    }

    /// The mixture's task names: a single database's task names as they
    /// are, a mixture's as `<database>/<task>`.
    pub fn task_names(&self) -> &[String] {
        &self.task_names
    }

    /// The database (mixture index) of mixture task `k`.
    pub fn task_database(&self, k: usize) -> usize {
        self.tasks[k].db
    }

    /// The index of mixture task `k` in its own database's metadata (what
    /// its split hash takes, so splits do not depend on the mixture).
    pub fn task_local(&self, k: usize) -> usize {
        self.tasks[k].local
    }

    /// The view of mixture task `k` in its database.
    pub fn task_view(&self, k: usize) -> Result<crate::format::TaskView<'_>> {
        let p = &self.tasks[k];
        self.dbs[p.db].db.task(p.local)
    }

    /// The metadata of mixture task `k`.
    pub fn task_meta(&self, k: usize) -> &crate::format::TaskMeta {
        let p = &self.tasks[k];
        &self.dbs[p.db].db.metadata().tasks[p.local]
    }

    /// The embedding dimension every database of the mixture shares.
    pub fn embedding_dim(&self) -> usize {
        self.dbs[0].db.metadata().embedder.dim as usize
    }

    /// The mixture's identity: the content hash of a single database, or
    /// xxh3 of the databases' names and content hashes in order.
    pub fn content_hash(&self) -> String {
        if let [one] = &self.dbs[..] {
            return one.db.content_hash().to_string();
        }
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for d in &self.dbs {
            h.update(d.name.as_bytes());
            h.update(&[0]);
            h.update(d.db.content_hash().as_bytes());
            h.update(&[0]);
        }
        format!("mixture-{:016x}", h.digest())
    }

    /// The effective task weights (metadata order).
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Threads in the sampler's pool.
    pub fn num_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Batches a producer builds at once ([`stream_batches`](Self::stream_batches)):
    /// one per pool thread plus two queued, so a thread that finishes a batch
    /// starts the next at once instead of waiting for the producer thread to
    /// be scheduled on a busy core and plan it (two threads, TPC-H SF 0.1,
    /// B = 32, S = 1024: ×1.55 one thread's throughput with one per thread,
    /// ×1.78 with two queued). Costs two batches of memory.
    pub fn stream_depth(&self) -> usize {
        self.num_threads() + 2
    }

    /// Fresh sampling state for `split` on this rank (step 0).
    pub fn split_state(&self, split: Split) -> SplitState {
        let n = self.tasks.len();
        let stream = StreamState::new(n, self.cfg.world_size, MIX_WINDOW);
        self.split_state_at(split, stream, self.cfg.rank)
    }

    /// Sampling state for `split` on `rank`, continuing `stream`.
    pub fn split_state_at(&self, split: Split, stream: StreamState, rank: u32) -> SplitState {
        let c = &self.cfg;
        let n = self.tasks.len();
        let mut pools = Vec::with_capacity(n);
        let mut eligible = Vec::with_capacity(n);
        for k in 0..n {
            let view = self.task_view(k).expect("validated at open");
            // The split hash takes the task's index in its own database, so
            // a database's splits are the same alone or in any mixture.
            let seeds = keep_fraction(
                task_split_seeds(
                    self.tasks[k].local as u32,
                    view.anchor_rows,
                    view.splits,
                    split,
                    c.split_seed,
                    c.split_ratios,
                ),
                c.pool_fraction,
            );
            if seeds.is_empty() {
                if self.weights[k] > 0.0 && rank == c.rank {
                    tracing_warn(&format!(
                        "task `{}` has no {} seeds; it is skipped",
                        self.task_names[k],
                        split.name(),
                    ));
                }
                pools.push(None);
                eligible.push(false);
            } else {
                let s = derive(c.seed, &[split.index() as u64, k as u64, 1]);
                pools.push(Some(
                    SeedPool::new(seeds, s).with_repeat_fault(c.debug_repeat_seed_every),
                ));
                eligible.push(true);
            }
        }
        let key = derive(c.seed, &[split.index() as u64, 3]);
        let picker = TaskPicker::new(c.task_pick, &self.weights, &eligible, key);
        SplitState {
            split,
            stream,
            rank,
            pools,
            picker,
            buffers: BuildBuffers::default(),
            last_shape: (0, 0),
        }
    }

    /// The key every random choice of step `step` of `split` derives from.
    fn step_key(&self, split: Split, step: u64) -> u64 {
        derive(self.cfg.seed, &[split.index() as u64, step, 2])
    }

    /// Pick the batch's task, draw this rank's slice of its global pool into
    /// `jobs` (seed, anchor row, observation time, per-sequence RNG seed)
    /// and advance the stream. Everything random about a batch
    /// happens here, serially, which is what makes batches independent of
    /// the thread count and replayable.
    fn draw(&self, state: &mut SplitState, jobs: &mut Vec<(u32, u32, i64, u64)>) -> Result<Draws> {
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
        let k = state.picker.pick(step) as usize;
        let key = self.step_key(state.split, step);
        let task = self.task_view(k)?;
        let pool = state.pools[k]
            .as_mut()
            .expect("picker only picks tasks with seeds");
        let mut d = Draws {
            task: k,
            step,
            key,
            world_size,
            exhaust_events: 0,
            duplicates: 0,
        };
        let b = self.seeds_per_step[k];
        jobs.clear();
        let slice = rank_slice(state.stream.drawn[k], state.rank, b);
        let first_slot = state.rank as u64 * b as u64;
        for (j, p) in slice.enumerate() {
            let x = pool.at(p);
            d.exhaust_events += x.exhausted as u32;
            d.duplicates += x.duplicate as u32;
            let i = x.seed as usize;
            let row = task.anchor_rows[i];
            jobs.push((
                x.seed,
                row,
                task.obs_times[i],
                derive(key, &[first_slot + j as u64]),
            ));
        }
        state.stream.advance(k, b);
        Ok(d)
    }

    /// Advance `state` past `n` batches without building them or drawing
    /// their seeds: the same stream positions as
    /// [`make_batch`](Self::make_batch), O(1) per batch.
    pub fn skip_batches(&self, state: &mut SplitState, n: u64) -> Result<()> {
        for _ in 0..n {
            Self::check_can_draw(state)?;
            let k = state.picker.pick(state.stream.step) as usize;
            state.stream.advance(k, self.seeds_per_step[k]);
        }
        Ok(())
    }

    /// Rebuild batch `step` of `split` exactly as the producer made it (same
    /// tensors, same fingerprint), from a fresh state of the same config
    /// with this sampler's rank and world size.
    pub fn replay_batch(&self, split: Split, step: u64) -> Result<Batch> {
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
    ) -> Result<Batch> {
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

    fn check_can_draw(state: &SplitState) -> Result<()> {
        if state.picker.is_empty() {
            return Err(Error::invalid(
                "task_weights",
                format!("no task with weight > 0 has {} seeds", state.split.name()),
            ));
        }
        Ok(())
    }

    /// Make the next batch of `state`'s split.
    pub fn make_batch(&self, state: &mut SplitState) -> Result<Batch> {
        let planned = self.plan(state)?;
        let mut buffers = std::mem::take(&mut state.buffers);
        let made = self.build(planned, &mut buffers, true);
        state.buffers = buffers;
        if let Ok(b) = &made {
            state.last_shape = (b.max_rows, b.num_text);
        }
        made
    }

    /// The serial part of the next batch of `state`'s split: its draws
    /// (everything random about it) and, with telemetry, the pool and mix
    /// state after them. Advances the stream; [`build`](Self::build) makes
    /// the batch from the plan alone, on any thread.
    fn plan(&self, state: &mut SplitState) -> Result<Planned> {
        Self::check_can_draw(state)?;
        assert!(
            self.cfg.debug_panic_at_step != Some(state.stream.step),
            "debug_panic_at_step: deliberate panic at {} step {}",
            state.split.name(),
            state.stream.step
        );
        let t0 = Instant::now();
        if self.cfg.debug_batch_delay_ms > 0.0 {
            std::thread::sleep(std::time::Duration::from_secs_f64(
                self.cfg.debug_batch_delay_ms / 1e3,
            ));
        }
        let mut jobs = Vec::with_capacity(self.seeds_per_step.iter().copied().max().unwrap_or(0));
        let draws = self.draw(state, &mut jobs)?;
        let draw = self.cfg.telemetry.then(|| {
            let mut d = self.draw_stats(state, draws.step, draws.world_size);
            self.database_stats(state, draws.task, draws.step, &mut d);
            d
        });
        Ok(Planned {
            draws,
            jobs,
            draw,
            split: state.split,
            rank: state.rank,
            planning: t0.elapsed(),
        })
    }

    /// Build the planned batch with `buffers` (one set per batch in flight).
    fn build(&self, p: Planned, buffers: &mut BuildBuffers, split_up: bool) -> Result<Batch> {
        let Planned {
            draws:
                Draws {
                    task: k,
                    step,
                    key,
                    world_size,
                    exhaust_events,
                    duplicates,
                },
            jobs,
            draw,
            split,
            rank,
            planning,
        } = p;
        // Stage times count planning and building, not the time the plan
        // waited for a thread (a pipelined stream plans ahead).
        let t0 = Instant::now()
            .checked_sub(planning)
            .unwrap_or_else(Instant::now);
        let batch_span = tracing::info_span!(
            "batch",
            split = split.name(),
            step = step as i64,
            rank = rank as i64,
            task = self.task_names[k].as_str(),
            rows = tracing::field::Empty,
            cells = tracing::field::Empty,
        );
        let _batch = batch_span.enter();
        let mut batch = self.build_batch(
            k,
            &jobs,
            self.cfg.pack,
            &mut buffers.subgraphs,
            &mut buffers.text_map,
            &batch_span,
            t0,
            split_up,
        )?;
        if let Some(d) = draw {
            batch.draw = d;
        }
        batch.fingerprint =
            fingerprint([key, step, rank as u64, world_size as u64], k, &batch.seeds);
        batch.exhaust_events = exhaust_events;
        batch.duplicate_seeds = duplicates;
        batch.split = split;
        batch.step = step;
        Ok(batch)
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
        mut sink: impl FnMut(Result<Batch>) -> bool,
    ) {
        type Built = (Result<Batch>, BuildBuffers);
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

    /// BFS, assemble and collate the sequences of `jobs` (seed, anchor row,
    /// observation time, per-context RNG seed) of task `k`, `packed` into
    /// `B` sequences of up to [`segment_slots`](Self::segment_slots)
    /// contexts (`crate::batch::pack`) or one sequence per job, into a batch
    /// with its stage timings (from `t0`): the part of a batch that does not
    /// depend on how its seeds were drawn, shared by the training stream and
    /// evaluation passes. `split_up`: spread the batch's sequences over the
    /// pool (one batch at a time); otherwise the calling thread builds all
    /// of them (a pipelined stream, one batch per thread, where splitting a
    /// batch only adds work-stealing between batches).
    #[allow(clippy::too_many_arguments, clippy::too_many_lines)]
    pub(super) fn build_batch(
        &self,
        k: usize,
        jobs: &[(u32, u32, i64, u64)],
        packed: bool,
        subgraphs: &mut Vec<Subgraph>,
        text_map: &mut FxMap<u32, u32>,
        batch_span: &tracing::Span,
        t0: Instant,
        split_up: bool,
    ) -> Result<Batch> {
        let min_len = if split_up { 1 } else { usize::MAX };
        let n = jobs.len();
        let (b, slots) = if packed {
            (self.cfg.default_batch_size, self.segment_slots)
        } else {
            (n, 1)
        };
        let s = self.cfg.default_sequence_length;
        let plan = &self.tasks[k];
        let mdb = &self.dbs[plan.db];
        let db = &*mdb.db;
        let task = db.task(plan.local)?;
        if subgraphs.len() != n {
            subgraphs.resize_with(n, Subgraph::default);
        }
        let builder = self.context_builder(k);
        let graph = builder.graph;
        // Payloads are not hashed at open: a seed row is used only if it is
        // a row of the task's anchor table (O(1), never out of bounds).
        let anchor_table = db.metadata().tasks[plan.local].anchor_table as usize;
        if let Some(&(i, row, _, _)) = jobs
            .iter()
            .find(|j| graph.table_of(j.1) != Some(anchor_table))
        {
            return Err(Error::format(
                db.task_path(plan.local).unwrap_or(db.dir()),
                format!(
                    "seed {i}: anchor row {row} is not a row of the anchor table by graph.bin's row_table (a corrupt task or graph payload: run `headwater verify`)"
                ),
            ));
        }
        let bfs_span = tracing::info_span!("bfs", seeds = n as i64).entered();
        let seed_cells = plan.seed_cells;
        // Every context is built as its unpacked self (budget S).
        self.pool.install(|| {
            subgraphs
                .par_iter_mut()
                .zip(jobs.par_iter())
                .with_min_len(min_len)
                .for_each(|(sub, job)| builder.build(job.1, job.2, job.3, s, sub));
        });
        // With `pack`: place them (crate::batch::pack), cut the ones over
        // their budgets to a prefix, and lay them out sequence after
        // sequence, each sequence's contexts in draw order
        // (`start[q]..start[q + 1]`).
        let mut seq_seeds: Vec<u32> = jobs.iter().map(|j| j.0).collect();
        let mut start: Vec<usize> = (0..=b).collect();
        if slots > 1 {
            let sizes: Vec<usize> = subgraphs.iter().map(|g| g.cells).collect();
            let plan = pack_contexts(&sizes, b, slots, s, seed_cells);
            for ((sub, job), (&budget, &size)) in subgraphs
                .iter_mut()
                .zip(jobs)
                .zip(plan.budget.iter().zip(&sizes))
            {
                if budget < size {
                    sub.keep_prefix(budget, builder.row_cells, seed_cells, graph.row_time, job.2);
                }
            }
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| (plan.bin[i], i));
            let mut taken: Vec<Subgraph> = order
                .iter()
                .map(|&i| std::mem::take(&mut subgraphs[i]))
                .collect();
            std::mem::swap(subgraphs, &mut taken);
            seq_seeds = order.iter().map(|&i| jobs[i].0).collect();
            start.fill(0);
            for &q in &plan.bin {
                start[q + 1] += 1;
            }
            for q in 0..b {
                start[q + 1] += start[q];
            }
        }
        drop(bfs_span);
        let t_bfs = Instant::now();
        let asm_span = tracing::info_span!("assemble", max_rows = tracing::field::Empty).entered();
        let r = start
            .windows(2)
            .map(|w| {
                subgraphs[w[0]..w[1]]
                    .iter()
                    .map(|g| g.rows.len())
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        let m = db.metadata();
        let mut batch = Batch::unfilled(b, s, r, slots, m.embedder.dim as usize);
        batch.task_idx = k as u32;
        batch.db_idx = plan.db as u32;
        batch.target_stype = plan.stype_code;
        batch.cat_emb_start = plan.cat_emb_start;
        batch.cat_emb_count = plan.cat_emb_count;
        batch.seeds.extend(jobs.iter().map(|j| j.0));
        let tables: Vec<TableCells<'_>> = (0..m.tables.len())
            .map(|t| {
                let v = db.table(t)?;
                let codes = v
                    .columns
                    .iter()
                    .map(|c| m.columns[c.column_idx as usize].stype.code().unwrap_or(0) as i8)
                    .collect();
                Ok(TableCells {
                    row_offset: v.row_offset,
                    columns: v.columns,
                    codes,
                })
            })
            .collect::<Result<_>>()?;
        let target = match plan.target {
            TargetPlan::Cell { slot } => Target::Cell { slot },
            TargetPlan::Virtual { column_idx, code } => Target::Virtual {
                column_idx,
                code,
                values: task.targets,
                validity: task.target_validity,
            },
        };
        let ctx = SeqContext {
            graph,
            tables: &tables,
            ts_mean: m.timestamp_stats.mean_us,
            ts_std: m.timestamp_stats.std_us,
            target,
            num_categorical: u32::try_from(m.num_categorical_embeddings).unwrap_or(u32::MAX),
            num_text: u32::try_from(m.num_text_embeddings).unwrap_or(u32::MAX),
            column_offset: mdb.column_offset,
            categorical_offset: mdb.categorical_offset,
        };
        let subgraphs = &*subgraphs;
        let stats = self.pool.install(|| {
            batch.fill_sequences(min_len, |i, o, seg| {
                let range = start[i]..start[i + 1];
                let (subs, seeds) = (&subgraphs[range.clone()], &seq_seeds[range]);
                SCRATCH.with(|sc| {
                    assemble_packed_sequence(&ctx, subs, seeds, r, o, seg, &mut sc.borrow_mut().1)
                })
            })
        });
        batch.seq_stats = stats;
        asm_span.record("max_rows", r as i64);
        drop(asm_span);
        let t_asm = Instant::now();
        let collate_span =
            tracing::info_span!("collate", unique_texts = tracing::field::Empty).entered();
        let dim = m.embedder.dim as usize;
        collate_text(&mut batch, db.text_embeddings()?, dim, text_map);
        collate_span.record("unique_texts", batch.num_text as i64);
        drop(collate_span);
        let t_end = Instant::now();
        batch_span.record(
            "rows",
            batch.seq_stats.iter().map(|q| q.rows as i64).sum::<i64>(),
        );
        batch_span.record(
            "cells",
            batch.seq_stats.iter().map(|q| q.cells as i64).sum::<i64>(),
        );
        batch.stage_ns = [
            (t_bfs - t0).as_nanos() as u64,
            (t_asm - t_bfs).as_nanos() as u64,
            (t_end - t_asm).as_nanos() as u64,
            (t_end - t0).as_nanos() as u64,
        ];
        Ok(batch)
    }
}

impl SamplerCore {
    /// Pool and mix measurements after step `step` drew task `k`'s seeds
    /// (the stream has advanced past it). Pool figures are global (the same
    /// on every rank).
    #[allow(clippy::cast_precision_loss)]
    fn draw_stats(&self, state: &SplitState, step: u64, world_size: u32) -> DrawStats {
        let st = &state.stream;

        let mut t = DrawStats {
            remaining_min: f64::INFINITY,
            remaining_max: f64::NEG_INFINITY,
            remaining_fraction_min: f64::INFINITY,
            remaining_fraction_max: f64::NEG_INFINITY,
            steps_since_pick_max: f64::NEG_INFINITY,
            steps_to_exhaust_min: f64::INFINITY,
            tv_distance: st.mix.tv_distance(&self.weights),
            ..DrawStats::default()
        };
        for (j, pool) in state.pools.iter().enumerate() {
            if self.weights[j] <= 0.0 {
                continue;
            }
            let since = match st.last_picked[j] {
                Some(s) => step - s,
                None => step + 1,
            };
            t.steps_since_pick_max = t.steps_since_pick_max.max(since as f64);
            let Some(pool) = pool else { continue };
            let n = pool.len() as u64;
            let (_, cursor) = epoch_cursor(st.drawn[j], n);
            let (rem, len) = ((n - cursor) as f64, n as f64);
            t.remaining_min = t.remaining_min.min(rem);
            t.remaining_max = t.remaining_max.max(rem);
            t.remaining_fraction_min = t.remaining_fraction_min.min(rem / len);
            t.remaining_fraction_max = t.remaining_fraction_max.max(rem / len);
            let b = (world_size as usize * self.seeds_per_step[j]) as f64;
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
    fn database_stats(&self, state: &SplitState, k: usize, step: u64, t: &mut DrawStats) {
        let st = &state.stream;
        let nd = self.dbs.len();
        let mut last: Vec<Option<u64>> = vec![None; nd];
        let mut frac = vec![f64::INFINITY; nd];
        let mut counts = vec![0u64; nd];
        for (j, pool) in state.pools.iter().enumerate() {
            let d = self.tasks[j].db;
            counts[d] += st.mix.count(j);
            last[d] = last[d].max(st.last_picked[j]);
            if self.weights[j] <= 0.0 {
                continue;
            }
            if let Some(pool) = pool {
                let n = pool.len() as u64;
                let (_, cursor) = epoch_cursor(st.drawn[j], n);
                frac[d] = frac[d].min((n - cursor) as f64 / n as f64);
            }
        }
        let n = st.mix.len() as f64;
        t.database_tv_distance = if n > 0.0 {
            0.5 * self
                .dbs
                .iter()
                .zip(&counts)
                .map(|(d, &c)| (c as f64 / n - d.share).abs())
                .sum::<f64>()
        } else {
            0.0
        };
        let since = |d: usize| match last[d] {
            Some(s) => (step - s) as f64,
            None => (step + 1) as f64,
        };
        t.database_steps_since_pick_max = f64::NEG_INFINITY;
        t.database_remaining_fraction_min = f64::INFINITY;
        for (d, db) in self.dbs.iter().enumerate() {
            if db.share <= 0.0 {
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
        t.databases.clear();
        for &d in &self.schema.database_ids {
            t.databases.push(crate::seeds::DatabaseDraw {
                steps_since_pick: since(d),
                remaining_fraction_min: frac[d],
            });
        }
    }
}

/// The telemetry schema of a mixture and each database's reported slot: a
/// single database reports all its tasks and no per-database rows; a
/// mixture reports the `listed` databases (`telemetry_databases`, mixture
/// indices in the order listed) when there is a list, else the
/// `telemetry_top_databases` databases with the largest shares (ties by
/// order), and their tasks.
fn mixture_schema(
    cfg: &SamplerConfig,
    listed: Option<Vec<usize>>,
    task_names: &[String],
    tasks: &[TaskPlan],
    dbs: &[MixtureDatabase],
) -> (TelemetrySchema, Vec<Option<usize>>) {
    let (h, s) = (cfg.max_hops, cfg.default_sequence_length);
    if dbs.len() == 1 {
        return (TelemetrySchema::new(task_names, h, s), vec![Some(0)]);
    }
    let order = listed.unwrap_or_else(|| {
        let mut order: Vec<usize> = (0..dbs.len()).collect();
        order.sort_by(|&a, &b| dbs[b].share.total_cmp(&dbs[a].share).then(a.cmp(&b)));
        order.truncate(cfg.telemetry_top_databases);
        order
    });
    let mut reported = vec![None; dbs.len()];
    for (slot, &d) in order.iter().enumerate() {
        reported[d] = Some(slot);
    }
    let report_tasks: Vec<(usize, String)> = tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| reported[t.db].is_some())
        .map(|(k, _)| (k, task_names[k].clone()))
        .collect();
    let report_dbs: Vec<(usize, String)> =
        order.iter().map(|&d| (d, dbs[d].name.clone())).collect();
    (
        TelemetrySchema::for_mixture(&report_tasks, &report_dbs, h, s),
        reported,
    )
}

/// Hash of the step's identity (its key, step, rank and world size), the
/// task and the drawn seeds.
#[allow(clippy::cast_possible_truncation)]
fn fingerprint(identity: [u64; 4], task: usize, seeds: &[u32]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for w in identity {
        h.update(&w.to_le_bytes());
    }
    h.update(&(task as u32).to_le_bytes());
    h.update(bytemuck::cast_slice(seeds));
    h.digest()
}

/// An evenly spaced `fraction` of `seeds` (at least one when any), in order.
fn keep_fraction(seeds: Vec<u32>, fraction: f64) -> Vec<u32> {
    if fraction >= 1.0 || seeds.is_empty() {
        return seeds;
    }
    let n = seeds.len();
    let k = ((n as f64 * fraction).ceil() as usize).clamp(1, n);
    (0..k).map(|j| seeds[j * n / k]).collect()
}

/// Buffers one batch in flight builds with (recycled across batches).
#[derive(Default)]
struct BuildBuffers {
    subgraphs: Vec<Subgraph>,
    text_map: FxMap<u32, u32>,
}

/// A batch drawn but not built: see [`SamplerCore::plan`].
struct Planned {
    draws: Draws,
    jobs: Vec<(u32, u32, i64, u64)>,
    draw: Option<DrawStats>,
    split: Split,
    rank: u32,
    /// Time spent planning (the draws and any `debug_batch_delay_ms`).
    planning: std::time::Duration,
}

/// The error for a panic while making a `split` batch.
pub(super) fn panicked(split: Split, p: &(dyn std::any::Any + Send)) -> Error {
    let msg = if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    };
    Error::Worker(format!("{} producer panicked: {msg}", split.name()))
}

/// The random choices of one batch.
struct Draws {
    task: usize,
    step: u64,
    key: u64,
    world_size: u32,
    exhaust_events: u32,
    duplicates: u32,
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
    type Item = Result<Batch>;
    fn next(&mut self) -> Option<Result<Batch>> {
        Some(self.core.make_batch(&mut self.state))
    }
}

/// A `tracing` warning; also on stderr when no subscriber is installed, so a
/// user without tracing set up still sees it.
fn tracing_warn(msg: &str) {
    tracing::warn!("{msg}");
    if !tracing::dispatcher::has_been_set() {
        eprintln!("headwater: warning: {msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::keep_fraction;

    #[test]
    fn keep_fraction_is_an_even_subset_of_at_least_one() {
        let seeds: Vec<u32> = (0..100).collect();
        assert_eq!(keep_fraction(seeds.clone(), 1.0), seeds);
        let tenth = keep_fraction(seeds.clone(), 0.1);
        assert_eq!(tenth, (0..10).map(|j| j * 10).collect::<Vec<u32>>());
        assert_eq!(keep_fraction(seeds.clone(), 1e-9), vec![0]);
        assert_eq!(keep_fraction(vec![], 0.5), Vec::<u32>::new());
        let third = keep_fraction(seeds, 0.333);
        assert_eq!(third.len(), 34);
        assert!(third.windows(2).all(|w| w[0] < w[1]), "ordered, no repeats");
    }
}
