//! The plan of a sampler: its databases (a mixture; one database is a
//! mixture of one), each task's plan (target cell, seed row width, target
//! type and categorical window), the effective task weights, the packing
//! plan (seeds per step, segment slots; made by `packing.rs`) and the
//! telemetry schema — fixed when the sampler is made, shared read-only by
//! every producer.
//!
//! Never: random choices per step (those are `draw.rs`), building contexts
//! (`build.rs`). The mixture-wide views (concatenated embedding tables,
//! merged metadata) are `sampler/mixture.rs`, which reads this plan.

use crate::stalls::{StallConfig, StallWatch};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use half::f16;

use crate::config::SamplerConfig;
use crate::databases::{
    check_mixture, database_names, plan_reads, warn_stats_split, DroppedDatabase, ReadPlan,
};
use crate::error::{Error, Result};
use crate::format::Database;
use crate::telemetry::TelemetrySchema;

/// Batches in the sliding window behind `mix/tv_distance` and the exhaust forecast.
pub const MIX_WINDOW: usize = 64;

/// A task and the range of a step's jobs (sequences) drawn for it.
pub(super) type TaskGroup = (usize, std::ops::Range<usize>);

/// How a task's target cell is found.
#[derive(Debug, Clone, Copy)]
pub(super) enum TargetPlan {
    Cell { slot: usize },
    Virtual { column_idx: u32, code: i8 },
}

#[derive(Debug, Clone)]
pub(crate) struct TaskPlan {
    /// The mixture database the task belongs to.
    pub(crate) db: usize,
    /// The task's index in its database's metadata.
    pub(crate) local: usize,
    pub(super) target: TargetPlan,
    pub(super) seed_cells: usize,
    pub(super) stype_code: u8,
    /// First categorical id of the target column, in the mixture's
    /// concatenated categorical table.
    pub(super) cat_emb_start: u32,
    pub(super) cat_emb_count: u32,
    /// The task's kind (`crate::readings::TASK_KINDS` index).
    pub(super) kind: usize,
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
    pub(super) row_cells: Vec<u16>,
    /// Mean stored bytes of one of its cells (`reads::cell_bytes`).
    pub(super) cell_bytes: f64,
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
    pub(crate) tasks: Vec<TaskPlan>,
    pub(super) task_names: Vec<String>,
    /// Per database: its slot among the databases with their own telemetry
    /// series (`None`: folded into the aggregates).
    pub(super) reported: Vec<Option<usize>>,
    pub(super) weights: Vec<f64>,
    pub(super) pool: rayon::ThreadPool,
    /// The telemetry schema of this mixture and config.
    pub schema: TelemetrySchema,
    /// The concatenated embedding tables of a mixture, built on first use.
    pub(crate) concatenated: Concatenated,
    /// Seconds [`SamplerCore::new`] took (open + preparation); 0 when the
    /// databases were opened elsewhere. `Sampler` adds the seed-pool build.
    pub startup_seconds: f64,
    /// How the databases are read under the memory budget.
    pub reads: ReadPlan,
    /// Seeds per rank per step of each task (`seeds_per_step`).
    pub(super) seeds_per_step: Vec<usize>,
    /// The `K` of the `[B, K]` tensors (`segment_slots`).
    pub(super) segment_slots: usize,
    /// The stall detector (`None`: its thread could not start).
    pub(super) stalls: Option<StallWatch>,
    /// With `examples`: each database's walk graph (else empty).
    pub(super) walk_graphs: Vec<crate::ranking::walks::WalkGraph>,
    /// With `expected_store`: each database's stored rankings.
    pub(super) rank_stores: Vec<crate::ranking::rank_store::RankStore>,
    /// With `examples`: whether each task is a forecast task with items
    /// (a query task with a label window), and its items by anchor row,
    /// indexed at the first batch that needs them (`examples.rs`).
    pub(super) task_items: Vec<Option<OnceLock<crate::context::ItemIndex>>>,
    /// With `examples`: each task's example candidates' split codes (by
    /// row of its anchor table for a cell task, by item for a forecast
    /// task; `crate::context::splits`), made at the first batch that
    /// needs them (`examples.rs`): opening reads no seed.
    pub(super) example_splits: Vec<OnceLock<Vec<u8>>>,
    /// Every (task, split)'s seed list, made on first use (`pools.rs`).
    pub(crate) seed_lists: Arc<super::pools::SeedLists>,
    /// The busy thread of `debug_cpu_hog` (stopped at shutdown).
    pub(crate) hog: Option<crate::faults::Hog>,
    /// Named and reported as a mixture (more than one database given).
    pub as_mixture: bool,
    /// Databases of the mixture dropped at open (`on_bad_database`), not
    /// among `dbs`; those dropped in place are `drops`'.
    pub dropped: Vec<DroppedDatabase>,
    /// The databases dropped in place and the weights they leave (`drops.rs`).
    pub(crate) drops: super::drop_set::Drops,
    /// Bytes the hot sets' read-ahead asked for, not yet reported (`hot.rs`).
    pub(super) prefetched: Arc<std::sync::atomic::AtomicU64>,
    /// The page cache of `debug_page_cache_bytes` (`None`: off).
    pub(super) small_cache: Option<crate::faults::SmallCache>,
}

impl SamplerCore {
    /// Open `db_path` and prepare sampling with `cfg` (validated here).
    pub fn new(db_path: impl AsRef<Path>, cfg: SamplerConfig) -> Result<Self> {
        Self::open_mixture(&[db_path.as_ref().to_path_buf()], cfg)
    }

    /// Prepare sampling an already open database with `cfg` (validated here).
    pub fn with_database(db: Arc<Database>, cfg: SamplerConfig) -> Result<Self> {
        let name = database_names(&[db.dir().to_path_buf()]).remove(0);
        Self::with_databases(vec![(name, db)], cfg)
    }

    /// Prepare sampling the mixture of the already open `dbs` (name,
    /// database) with `cfg` (validated here). Every database must share the
    /// first one's embedder (name and dimension).
    pub fn with_databases(dbs: Vec<(String, Arc<Database>)>, cfg: SamplerConfig) -> Result<Self> {
        let mixture = dbs.len() > 1;
        Self::prepare(dbs, cfg, mixture)
    }

    /// [`with_databases`](Self::with_databases); `mixture`: named and
    /// reported as a mixture even with one database (a mixture whose other
    /// databases were dropped keeps its task names).
    pub(super) fn prepare(
        dbs: Vec<(String, Arc<Database>)>,
        cfg: SamplerConfig,
        as_mixture: bool,
    ) -> Result<Self> {
        check_mixture(&dbs)?;
        let db_names: Vec<String> = dbs.iter().map(|d| d.0.clone()).collect();
        let task_names = mixture_task_names(&dbs, as_mixture);
        cfg.validate(Some(&task_names))?;
        let reads = plan_reads(&dbs, &cfg, batches_in_flight(&cfg))?;
        warn_stats_split(&dbs, &cfg);
        let db_weights = cfg.database_weights_for(&db_names)?;
        let listed = cfg.telemetry_databases_for(&db_names)?;
        let task_w = cfg.weights_for(&task_names)?;
        let (tasks, mixture) = plan_tasks(dbs, &db_weights)?;
        let seed_lists = seed_lists(&mixture, &tasks, &cfg);
        check_pack_fits(&cfg, &tasks)?;
        let weights = mixture_weights(&task_w, &tasks, &mixture);
        let threads = cfg.num_threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
        });
        let pin = cfg.debug_pin_cpu;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("headwater-worker-{i}"))
            .start_handler(move |_| {
                if let Some(cpu) = pin {
                    crate::faults::pin_to(cpu);
                }
            })
            .build()
            .map_err(|e| Error::Worker(format!("cannot build the sampler thread pool: {e}")))?;
        let (schema, reported) =
            mixture_schema(&cfg, listed, &task_names, &tasks, &mixture, as_mixture);
        let stalls = StallWatch::start(StallConfig {
            stall_after_ms: cfg.stall_after_ms,
            dump_dir: cfg
                .stall_dump_dir
                .as_ref()
                .map_or_else(std::env::temp_dir, std::path::PathBuf::from),
            rank: cfg.rank,
        });
        let hog = match (cfg.debug_cpu_hog, cfg.debug_pin_cpu) {
            (true, Some(cpu)) => crate::faults::Hog::start(cpu),
            _ => None,
        };
        let mut core = SamplerCore {
            hog,
            small_cache: cfg
                .debug_page_cache_bytes
                .map(crate::faults::SmallCache::new),
            stalls,
            reported,
            dbs: mixture,
            as_mixture,
            cfg,
            tasks,
            task_names,
            weights,
            pool,
            schema,
            concatenated: Concatenated::default(),
            startup_seconds: 0.0,
            reads,
            seeds_per_step: Vec::new(),
            segment_slots: 1,
            walk_graphs: Vec::new(),
            rank_stores: Vec::new(),
            task_items: Vec::new(),
            example_splits: Vec::new(),
            seed_lists,
            dropped: Vec::new(),
            drops: super::drop_set::Drops::default(),
            prefetched: Arc::default(),
        };
        core.finish_plan()?;
        Ok(core)
    }

    /// The plan's parts made from the core itself: the packing plan, the
    /// examples' (which may zero a task's weight) and, from the weights
    /// then, the drop set of a core that dropped nothing in place.
    fn finish_plan(&mut self) -> Result<()> {
        self.plan_packing();
        self.plan_examples()?;
        let shares: Vec<f64> = self.dbs.iter().map(|d| d.share).collect();
        self.drops = super::drop_set::Drops::none(&self.weights, &shares);
        Ok(())
    }

    /// Seeds each rank draws per step of task `k` (the global cursor of the
    /// task advances by `world_size` times this): `B` unpacked,
    /// `B·pack_factor` packed, and with `pack_factor = 0` per task the
    /// count [`auto_count`] finds for a probe of the task's seeds measured
    /// when the sampler was made (at least `B`, at most what the seed rows
    /// allow and 64 per sequence): from `B · S / c̄` (`c̄` the probe's mean
    /// context size) up, the fewest whose placement leaves at most
    /// [`PADDING_GOAL`](crate::batch::PADDING_GOAL) padding.
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

    /// The view of mixture task `k` in its database, checked whole (for a
    /// reader of whole sections: an evaluation pass's list).
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
        if let ([one], false) = (&self.dbs[..], self.as_mixture) {
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

    /// The effective task weights at open (metadata order); those after
    /// a mid-run drop are [`drop_set`](Self::drop_set)'s.
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
}

/// Each task's plan and each database's place in the mixture (its share
/// from `db_weights`, its first task, column and category offsets).
#[allow(clippy::cast_possible_truncation)]
fn plan_tasks(
    dbs: Vec<(String, Arc<Database>)>,
    db_weights: &[f64],
) -> Result<(Vec<TaskPlan>, Vec<MixtureDatabase>)> {
    let db_total: f64 = db_weights.iter().sum();
    let mut tasks = Vec::new();
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
            tasks.push(TaskPlan::new(m, d, local, k, cat_off as u32));
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
            cell_bytes: super::reads::cell_bytes(m),
            db,
        });
    }
    u32::try_from(col_off).map_err(|_| too_many("columns"))?;
    u32::try_from(cat_off).map_err(|_| too_many("categories"))?;
    Ok((tasks, mixture))
}

impl TaskPlan {
    /// The plan of task `local` (`k`) of database `d` (metadata `m`), whose
    /// categories start at `cat_off` in the mixture's concatenated table.
    fn new(
        m: &crate::format::Metadata,
        d: usize,
        local: usize,
        k: &crate::format::TaskMeta,
        cat_off: u32,
    ) -> TaskPlan {
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
        TaskPlan {
            db: d,
            local,
            target,
            seed_cells: table.columns.len() + extra,
            stype_code: k.target_stype.code().unwrap_or(0),
            cat_emb_start: col.cat_emb_start + cat_off,
            cat_emb_count: col.cat_emb_count,
            kind: crate::readings::task_kind_index(&k.kind),
        }
    }
}

/// The seed lists of the mixture's tasks, none made yet (`pools.rs`).
fn seed_lists(
    dbs: &[MixtureDatabase],
    tasks: &[TaskPlan],
    cfg: &SamplerConfig,
) -> Arc<super::pools::SeedLists> {
    Arc::new(super::pools::SeedLists::new(
        dbs.iter().map(|d| d.db.clone()).collect(),
        tasks.iter().map(|t| (t.db, t.local)).collect(),
        cfg,
    ))
}

/// With `pack`, `pack_factor` seed rows of the widest task must fit `S`.
fn check_pack_fits(cfg: &SamplerConfig, tasks: &[TaskPlan]) -> Result<()> {
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
    Ok(())
}

/// The telemetry schema of a mixture and each database's reported slot: a
/// single database reports all its tasks and no per-database rows; a
/// mixture reports the `listed` databases (`telemetry_databases`, mixture
/// indices in the order listed) when there is a list, else the
/// `telemetry_top_databases` databases with the largest shares (ties by
/// order), and their tasks.
pub(super) fn mixture_schema(
    cfg: &SamplerConfig,
    listed: Option<Vec<usize>>,
    task_names: &[String],
    tasks: &[TaskPlan],
    dbs: &[MixtureDatabase],
    as_mixture: bool,
) -> (TelemetrySchema, Vec<Option<usize>>) {
    let (h, s) = (cfg.max_hops, cfg.max_sequence_length());
    if !as_mixture {
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

/// The mixture's concatenated embedding tables, built on first request
/// by `sampler/mixture.rs`.
#[derive(Default)]
pub struct Concatenated {
    /// Column-name embeddings, `[Σ columns, D]`.
    pub(crate) columns: OnceLock<Vec<f16>>,
    /// Category embeddings, `[Σ categories, D]`.
    pub(crate) categories: OnceLock<Vec<f16>>,
}

/// Unique names for the databases at `paths`: each folder's name (`db<i>`
/// when it has none), `#2`, `#3`, … appended to repeats.
fn too_many(what: &str) -> Error {
    Error::invalid(
        "databases",
        format!("the mixture has more than 2^32 {what} (ids are u32)"),
    )
}

/// Effective per-task weights of a mixture: `w_t · p_d / (S_d / S)` (see
/// [`SamplerCore`]); a database whose task weights are all 0 gets 0.
fn mixture_weights(task_w: &[f64], tasks: &[TaskPlan], dbs: &[MixtureDatabase]) -> Vec<f64> {
    let mut per_db = vec![0.0; dbs.len()];
    for (w, t) in task_w.iter().zip(tasks) {
        per_db[t.db] += w;
    }
    let total: f64 = per_db.iter().sum();
    task_w
        .iter()
        .zip(tasks)
        .map(|(&w, t)| {
            if per_db[t.db] > 0.0 {
                w * (dbs[t.db].share / (per_db[t.db] / total))
            } else {
                0.0
            }
        })
        .collect()
}

/// The least memory the batches in flight take, and the cells of each:
/// `num_prefetch` waiting and `num_threads + 2` being built, each at least
/// its cells' tensors (`crate::batch::batch_bytes` without rows, segments
/// or texts; about 91 bytes a cell).
fn batches_in_flight(cfg: &SamplerConfig) -> (u64, usize) {
    let cells = cfg
        .tokens_per_batch
        .unwrap_or(cfg.default_batch_size * cfg.default_sequence_length);
    let threads = cfg.num_threads.unwrap_or(1);
    let one = crate::batch::batch_bytes(1, cells, (1, 0), 0, 0, 0);
    (
        one.saturating_mul((cfg.num_prefetch + threads + 2) as u64),
        cells,
    )
}

/// The task names of `dbs`: a single database's as they are, a mixture's as
/// `<database>/<task>`.
fn mixture_task_names(dbs: &[(String, Arc<Database>)], as_mixture: bool) -> Vec<String> {
    let mut names = Vec::new();
    for (name, db) in dbs {
        for k in &db.metadata().tasks {
            names.push(if as_mixture {
                format!("{name}/{}", k.name)
            } else {
                k.name.clone()
            });
        }
    }
    names
}
