//! The batch maker's side of in-context contexts (`examples = true`,
//! `crate::context::incontext`): which tasks can have examples (checked
//! when the sampler is made) and the parallel build of a batch's contexts,
//! each sequence drawing its recipe from its own generator key.
//!
//! Never: a random choice of its own (the key of each sequence is drawn in
//! `draw.rs`), or a change to the default path (`examples = false` never
//! enters this file).

use std::cell::RefCell;
use std::sync::OnceLock;
use std::time::Duration;

use rayon::prelude::*;

use super::plan::{SamplerCore, TargetPlan};
use crate::config::{bad, ExampleRanker};
use crate::context::{
    build_in_context, row_codes, BfsScratch, ExampleParams, ExampleScratch, ExampleSplits,
    ItemIndex, LabelTimes, SeqRecipe, Subgraph, TaskItems,
};
use crate::error::{Error, Result};
use crate::format::GraphView;
use crate::ranking::rank_store::{BuildLock, RankStore, StoreParams};
use crate::ranking::rankers::Ranker;
use crate::ranking::walks::WalkGraph;
use crate::say::info;
use crate::seeds::{task_split_codes, Split};

thread_local! {
    // Boxed: the extension's static TLS block is small (a large
    // thread-local fails `dlopen` with "cannot allocate memory in static
    // TLS block").
    static SCRATCH: RefCell<Box<(BfsScratch, ExampleScratch)>> = RefCell::new(Box::default());
}

/// A database's store items (seed row, time bound; sorted), the store's
/// settings, and the key naming its file.
type StoreItems = (Vec<(u32, i64)>, StoreParams, u64);

impl SamplerCore {
    /// With `examples`, every task with weight > 0 must be a cell task
    /// (its target a column of its anchor table, so examples carry their
    /// labels as ordinary cells) or a forecast task with a label `window`
    /// (its examples are its earlier items), whose anchor table has a row
    /// besides the seed; then each forecast task (a task at weight 0 too)
    /// is marked to have its items indexed at its first batch, and each
    /// database's walk graph is built (or mapped).
    pub(super) fn plan_examples(&mut self) -> Result<()> {
        if !self.cfg.examples {
            return Ok(());
        }
        self.task_items = (0..self.tasks.len()).map(|_| None).collect();
        for k in 0..self.tasks.len() {
            if self.weights[k] > 0.0 {
                self.plan_example_task(k)?;
            }
            self.index_items(k);
        }
        self.example_splits = (0..self.tasks.len()).map(|_| OnceLock::new()).collect();
        if self.weights.iter().all(|&w| w <= 0.0) {
            return Err(bad(
                "examples",
                "true, but no task with weight > 0 can have examples (every one is a query task without a `window`)",
            ));
        }
        // Each database's graph is a file of its directory mapped by every
        // process of the host (built once, by the first).
        self.walk_graphs = self
            .dbs
            .iter()
            .map(|d| {
                let db = &d.db;
                let integrity = db.shared_integrity();
                WalkGraph::shared(&db.graph(), db.dir(), db.content_hash(), integrity, &info)
            })
            .collect::<Result<_>>()?;
        if self.cfg.expected_store && self.cfg.example_ranker == ExampleRanker::Expected {
            self.rank_stores = (0..self.dbs.len())
                .map(|d| {
                    let mut s = self.rank_store(d)?;
                    // A corrupt block fails the batch as the database's would.
                    s.report_to(self.dbs[d].db.shared_integrity());
                    Ok(s)
                })
                .collect::<Result<_>>()?;
        }
        self.plan_derived_reads();
        Ok(())
    }

    /// Count the files `examples` maps beside each database in the read
    /// plan (the stored rankings; the walk graphs unless stored rankings
    /// replace the walks), and over the memory budget read them, and the
    /// databases if the first plan did not, without read-ahead.
    fn plan_derived_reads(&mut self) {
        let stores: u64 = self.rank_stores.iter().map(|r| r.bytes() as u64).sum();
        let walks: u64 = if self.rank_stores.is_empty() {
            self.walk_graphs.iter().map(WalkGraph::mapped_bytes).sum()
        } else {
            0
        };
        if self.reads.with_derived(stores + walks, &self.cfg) {
            for d in &self.dbs {
                d.db.advise_random();
            }
        }
        if self.reads.random_reads {
            for wg in &self.walk_graphs {
                wg.advise_random();
            }
            for rs in &self.rank_stores {
                rs.advise_random();
            }
        }
    }

    /// Check task `k` (weight > 0) can have examples; index a forecast
    /// task's items. Under recipe "rt-j" a query task without a window gets
    /// weight 0 with a warning instead of the error.
    fn plan_example_task(&mut self, k: usize) -> Result<()> {
        let t = &self.tasks[k];
        let name = &self.task_names[k];
        let db = &self.dbs[t.db].db;
        let m = db.metadata();
        let km = &m.tasks[t.local];
        let table = &m.tables[km.anchor_table as usize];
        let query = matches!(t.target, TargetPlan::Virtual { .. });
        if query && km.window_us.is_none() {
            if self.cfg.recipe.is_some() {
                crate::say::warn(&format!(
                    "task `{name}` gets weight 0 under recipe \"rt-j\": it is a query task \
                     without a `window` (when its labels become known), so no earlier \
                     label can be shown as an example"
                ));
                self.weights[k] = 0.0;
                return Ok(());
            }
            return Err(bad(
                "examples",
                format!(
                    "true, but query task `{name}` declares no `window` (how long after its \
                     observation time a label becomes known; a duration such as \"90d\" in its \
                     schema [[tasks]] entry, or RelBench's timedelta): declare `window`, or give \
                     it weight 0"
                ),
            ));
        }
        if table.num_rows < 2 {
            return Err(bad(
                "examples",
                format!(
                    "true, but the anchor table `{}` of task `{name}` has {} row(s): no row can be an example",
                    table.name, table.num_rows
                ),
            ));
        }
        Ok(())
    }

    /// Mark task `k` as having items if it is a query task with a window,
    /// whatever its weight: an evaluation pass gives a task at weight 0 its
    /// examples too, as it does a cell task. The index is built at the
    /// first batch that needs it ([`item_index`](Self::item_index)), not
    /// here: opening reads no seed.
    fn index_items(&mut self, k: usize) {
        let t = &self.tasks[k];
        let km = &self.dbs[t.db].db.metadata().tasks[t.local];
        if matches!(t.target, TargetPlan::Virtual { .. }) && km.window_us.is_some() {
            self.task_items[k] = Some(OnceLock::new());
        }
    }

    /// The items of forecast task `k` by anchor row (`None`: the task has
    /// none), indexed on first call from its file, checked whole (the index
    /// reads every item).
    fn item_index(&self, k: usize) -> Result<Option<&ItemIndex>> {
        let Some(cell) = self.task_items.get(k).and_then(Option::as_ref) else {
            return Ok(None);
        };
        if let Some(index) = cell.get() {
            return Ok(Some(index));
        }
        let t = &self.tasks[k];
        let db = &self.dbs[t.db].db;
        let task = db.task(t.local)?;
        let anchor = db.metadata().tasks[t.local].anchor_table as usize;
        let range = db.graph().table_rows[anchor];
        Ok(Some(cell.get_or_init(|| {
            ItemIndex::build(task.anchor_rows, task.obs_times, range)
        })))
    }

    /// Task `k`'s example candidates' split codes ([`candidate_splits`](Self::candidate_splits)),
    /// made on first call.
    fn example_split_codes(&self, k: usize) -> Result<&[u8]> {
        let cell = &self.example_splits[k];
        if let Some(codes) = cell.get() {
            return Ok(codes);
        }
        let codes = self.candidate_splits(k)?;
        Ok(cell.get_or_init(|| codes))
    }

    /// Task `k`'s example candidates' split codes: each seed's split as
    /// its pools read it (stored codes, else the hash rule under this
    /// sampler's `split_seed` and `split_ratios`), by item for a forecast
    /// task, by row of the anchor table for a cell task.
    fn candidate_splits(&self, k: usize) -> Result<Vec<u8>> {
        let t = &self.tasks[k];
        let db = &self.dbs[t.db].db;
        let task = db.task(t.local)?;
        let c = &self.cfg;
        let seeds = task_split_codes(
            t.local as u32,
            task.anchor_rows,
            task.splits,
            c.split_seed,
            c.split_ratios,
        );
        Ok(match t.target {
            TargetPlan::Virtual { .. } => seeds,
            TargetPlan::Cell { .. } => {
                let anchor = db.metadata().tasks[t.local].anchor_table as usize;
                row_codes(db.graph().table_rows[anchor], task.anchor_rows, &seeds)
            }
        })
    }

    /// Database `d`'s stored rankings (`expected_store`) of the items of
    /// its tasks with examples: read from `rankings/` in its directory,
    /// or computed and written there when missing or refused.
    fn rank_store(&self, d: usize) -> Result<RankStore> {
        let db = &*self.dbs[d].db;
        let (keys, p, key) = self.store_items(d)?;
        let path = db
            .dir()
            .join("rankings")
            .join(format!("expected-{key:016x}.bin"));
        if let Ok(s) = RankStore::open(&path, key) {
            return Ok(s);
        }
        let unwritable = |e: Error| {
            bad(
                "expected_store",
                format!("true, but its rankings cannot be written: {e}"),
            )
        };
        // One process of the host computes it; the others wait, then read.
        let _lock = BuildLock::take(&path.with_extension("lock"), || {
            info(&format!(
                "expected_store: another process is computing {}; waiting for it",
                path.display()
            ));
        })
        .map_err(unwritable)?;
        match RankStore::open(&path, key) {
            Ok(s) => return Ok(s),
            Err(Error::Io { .. }) => {}
            Err(e) => info(&format!("expected_store: {e}; computing it again")),
        }
        let t0 = std::time::Instant::now();
        let (g, wg) = (db.graph(), &self.walk_graphs[d]);
        // Written as computed, a window of items at a time: the build holds
        // one window and the index, never the whole store.
        let s = self
            .pool
            .install(|| RankStore::build(&g, wg, &keys, &p, key, &path))
            .map_err(unwritable)?;
        // A corrupt walk-graph block the walks met is in the database's
        // record: rankings computed past it are never kept.
        if let Err(e) = db.integrity().check() {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let msg = format!(
            "expected_store: {} items ranked in {:.1} s ({} rows, {} complete, {:.1} MiB) into {}",
            s.len(),
            t0.elapsed().as_secs_f64(),
            s.stored_rows(),
            s.complete_items(),
            s.bytes() as f64 / f64::from(1 << 20),
            path.display()
        );
        info(&msg);
        // Mapped: one copy in the page cache for every process of the host.
        Ok(s)
    }

    /// The items of database `d`'s tasks with examples, the settings and
    /// the key (content hash, settings, items) of their store.
    fn store_items(&self, d: usize) -> Result<StoreItems> {
        let c = &self.cfg;
        let db = &*self.dbs[d].db;
        let mut keys = Vec::new();
        for (k, t) in self.tasks.iter().enumerate() {
            if t.db != d || self.weights[k] <= 0.0 {
                continue;
            }
            let task = db.task(t.local)?;
            let bound = |obs: i64| if c.temporal_filter { obs } else { i64::MAX };
            keys.extend(
                task.anchor_rows
                    .iter()
                    .zip(task.obs_times)
                    .map(|(&r, &o)| (r, bound(o))),
            );
        }
        keys.sort_unstable();
        keys.dedup();
        let p = StoreParams {
            num_walks: c.num_walks,
            walk_length: c.walk_length,
            prune: c.expected_prune as f32,
            cap: c.expected_store_rows,
        };
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(db.content_hash().as_bytes());
        for x in [
            p.num_walks as u64,
            p.walk_length as u64,
            u64::from(p.prune.to_bits()),
            p.cap as u64,
        ] {
            h.update(&x.to_le_bytes());
        }
        for &(r, b) in &keys {
            h.update(&r.to_le_bytes());
            h.update(&b.to_le_bytes());
        }
        Ok((keys, p, h.digest()))
    }

    /// The in-context parameters of task `k` for seeds of `split`, handed
    /// to `f` with the database's graph; `None` (nothing called) for a query task without
    /// indexed items (no window), which keeps plain contexts.
    pub(crate) fn with_example_params<R>(
        &self,
        (k, s): (usize, usize),
        split: Split,
        f: impl FnOnce(&GraphView<'_>, &ExampleParams<'_>) -> R,
    ) -> Result<Option<R>> {
        let plan = &self.tasks[k];
        let mdb = &self.dbs[plan.db];
        let db = &*mdb.db;
        let km = &db.metadata().tasks[plan.local];
        let anchor = km.anchor_table as usize;
        let view = db.table(anchor)?;
        let off = view.row_offset;
        let (label, items) = match (plan.target, self.item_index(k)?) {
            (TargetPlan::Cell { slot }, _) => (Some(view.columns[slot]), None),
            (TargetPlan::Virtual { .. }, Some(index)) => {
                let task = db.task(plan.local)?;
                let items = TaskItems {
                    index,
                    row_offset: off,
                    anchor_rows: task.anchor_rows,
                    obs: task.obs_times,
                    valid: task.target_validity,
                    // The fault of `debug_ignore_window`: any item observed
                    // before the seed (a 1 µs window); the leak count keeps
                    // the task's own window.
                    window: if self.cfg.debug_ignore_window {
                        1
                    } else {
                        km.window_us.unwrap_or(i64::MAX)
                    },
                };
                (None, Some(items))
            }
            (TargetPlan::Virtual { .. }, _) => return Ok(None),
        };
        // A forecast task's rows are labelled through their items.
        let has_label = move |row: u32| {
            label.is_some_and(|label| {
                row.checked_sub(off)
                    .is_some_and(|i| i < view.num_rows && label.read(i as usize))
            })
        };
        let graph = db.graph();
        let c = &self.cfg;
        let p = ExampleParams {
            seq_len: s,
            max_hops: c.max_hops,
            temporal_filter: c.temporal_filter,
            num_walks: c.num_walks,
            walk_length: c.walk_length,
            table: graph.table_rows[anchor],
            walk_graph: &self.walk_graphs[plan.db],
            row_cells: &mdb.row_cells,
            seed_cells: plan.seed_cells,
            has_label: &has_label,
            deadline: c
                .context_deadline_ms
                .map(|ms| Duration::from_secs_f64(ms / 1e3)),
            ranker: match c.example_ranker {
                ExampleRanker::Walks => Ranker::Walks,
                ExampleRanker::Adaptive => Ranker::Adaptive,
                ExampleRanker::Expected => Ranker::Expected,
            },
            prune: c.expected_prune as f32,
            walk_salt: 0,
            store: self.rank_stores.get(plan.db),
            labels: self
                .label_slots(k)
                .and_then(|l| l.time)
                .map(|t| LabelTimes {
                    row_offset: off,
                    column: Some(view.columns[t]),
                }),
            items,
            splits: Some(ExampleSplits {
                codes: self.example_split_codes(k)?,
                seed: split.index() as u8,
            }),
        };
        Ok(Some(f(&graph, &p)))
    }

    /// Every context of `jobs` (task `k`, seeds of `split`) as an
    /// in-context context, in parallel (`min_len` per job at least); `false` (nothing built) for a
    /// query task without indexed items, which only an evaluation pass of
    /// a task at weight 0 reaches (`plan_examples` refuses one at weight >
    /// 0 without a window): it keeps the plain context.
    pub(super) fn build_in_context(
        &self,
        (k, s): (usize, usize),
        split: Split,
        jobs: &[(u32, u32, i64, u64)],
        subgraphs: &mut [Subgraph],
        min_len: usize,
    ) -> Result<bool> {
        let c = &self.cfg;
        // A bounded step of the walk graph's check (a corrupt block fails
        // this batch, at the integrity check): once every block is
        // checked, a walk step's check is one load.
        if let Some(wg) = self.walk_graphs.get(self.tasks[k].db) {
            wg.check_ahead(WALK_BLOCKS_PER_BATCH);
        }
        let built = self.with_example_params((k, s), split, |graph, p| {
            self.pool.install(|| {
                subgraphs
                    .par_iter_mut()
                    .zip(jobs.par_iter())
                    .with_min_len(min_len)
                    .for_each(|(sub, &(_, row, obs, key))| {
                        let r = SeqRecipe::draw(
                            key,
                            &c.local_context_sizes,
                            &c.bfs_widths,
                            &c.prefer_latest,
                        );
                        SCRATCH.with(|sc| {
                            let mut sc = sc.borrow_mut();
                            let (bs, ex) = &mut **sc;
                            build_in_context(
                                graph,
                                row,
                                obs,
                                key,
                                &r,
                                p,
                                c.bfs_child_width,
                                bs,
                                ex,
                                sub,
                            );
                        });
                    });
            });
        })?;
        Ok(built.is_some())
    }
}

/// Walk-graph blocks checked per in-context batch besides those its walks
/// read (1 MiB of 4 KiB blocks: about 0.2 ms of hashing from the page
/// cache; TPC-H SF 1's graph is checked whole within ~400 batches).
const WALK_BLOCKS_PER_BATCH: usize = 256;
