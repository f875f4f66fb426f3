//! Shared machinery of the sampler property tests: random synthetic
//! databases, an independent checker of one BFS, a reference model of the
//! randomness of `SamplerCore::make_batch` (so a batch's sequences can be
//! mapped back to global rows without any extra public API), and checkers of
//! the batch layout.
//!
//! The reference model mirrors the documented stream layout of
//! `src/seeds` and `src/maker/`: each task's global pool (the
//! split's seeds over all ranks) is keyed by `derive(seed, [split, task, 1])`,
//! the picker by `derive(seed, [split, 3])`; step `t` picks its task from the
//! step alone, rank `r` draws global positions `drawn[k] + r·B ..` and the
//! counter advances by `world_size · B`; sequence `j` of the rank's slice
//! runs its BFS with `derive(derive(seed, [split, t, 2]), [r·B + j])`. If
//! that layout changes, `check_against_reference` fails on the drawn seeds
//! first, with a message that says so.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use headwater::batch::{encode_timestamp, TIMESTAMP_DIM};
use headwater::context::{bfs, BfsParams, BfsScratch, Subgraph};
use headwater::format::{bit, ColumnValues, Database, GraphView};
use headwater::preprocess::{synth_database, SynthSpec};
use headwater::rng::{mix64, Xoshiro256pp};
use headwater::sampler::MadeBatch;
use headwater::seeds::{split_seeds, SeedPool, Split, TaskPicker};
use headwater::{Error, SamplerConfig, TaskPick};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};

pub type Check = Result<(), TestCaseError>;

/// Few, cheap cases (`PROPTEST_CASES` overrides, for a deeper run); no
/// regression files written into the source tree (a failure prints the
/// shrunk input instead).
pub fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

/// Turn a property check into a plain assertion (for fixed-input tests).
pub fn must(r: Check) {
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// A synthetic database in its own temporary directory.
pub struct SynthDb {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub db: Arc<Database>,
}

/// A temporary directory, in memory where possible: the writer syncs every
/// file it publishes, which on a disk costs more than the whole test case.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(t) = tempfile::Builder::new().prefix("hw-prop").tempdir_in(shm) {
            return t;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Build and open `spec`. `None` when the generator refuses the spec because
/// a cell task would have no seeds (a table whose `x` column came out all
/// null, e.g. one row that drew the 10% null): see the report.
pub fn build(spec: &SynthSpec) -> Option<SynthDb> {
    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    match synth_database(&dir, spec) {
        Ok(_) => {}
        Err(Error::Preprocess(m)) if m.contains("no non-null values") => return None,
        Err(e) => panic!("synth_database({spec:?}) failed: {e}"),
    }
    let db = Arc::new(Database::open(&dir).unwrap());
    Some(SynthDb { _tmp: tmp, dir, db })
}

fn arb_spec_with(monotone_time: bool) -> impl Strategy<Value = SynthSpec> {
    (2usize..=6).prop_flat_map(move |n| {
        (
            proptest::collection::vec(1usize..=80, n),
            0usize..=3,
            prop_oneof![Just(0.0), 0.0..0.6f64],
            proptest::collection::vec(any::<bool>(), n),
            0..=n,
            prop_oneof![2 => Just(0.0), 1 => 0.0..1.0f64],
            any::<u64>(),
        )
            .prop_map(
                move |(rows, fks_per_table, null_fk, flags, first, hub_share, seed)| SynthSpec {
                    tables: n,
                    rows,
                    fks_per_table,
                    null_fk,
                    temporal: if monotone_time {
                        (0..n).map(|i| i >= first).collect()
                    } else {
                        flags
                    },
                    hub_share,
                    seed,
                },
            )
    })
}

/// Any small synthetic database (2..=6 tables of 1..=80 rows).
pub fn arb_spec() -> impl Strategy<Value = SynthSpec> {
    arb_spec_with(false)
}

/// A synthetic database in which no non-temporal table references a
/// temporal one (temporal flags are a suffix of the tables). Only then does
/// the generator's "times are consistent" promise imply that a time-filtered
/// BFS never reaches a row from after the observation time: parents are
/// taken unconditionally, so a non-temporal child (always visible) may lead
/// to a temporal parent from the future.
pub fn arb_time_consistent_spec() -> impl Strategy<Value = SynthSpec> {
    arb_spec_with(true)
}

/// Small random sampler settings (one thread: thread counts are the subject
/// of the determinism test only).
pub fn arb_config() -> impl Strategy<Value = SamplerConfig> {
    (
        (1u32..=3).prop_flat_map(|w| (Just(w), 0..w)),
        1usize..=6,
        prop_oneof![1usize..=16, 16usize..=160],
        prop_oneof![1 => Just(0usize), 4 => 1usize..=4],
        1usize..=6,
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
        0u64..4,
    )
        .prop_map(
            |((world_size, rank), b, s, hops, width, rr, tf, seed, split_seed)| SamplerConfig {
                rank,
                world_size,
                default_batch_size: b,
                default_sequence_length: s,
                max_hops: hops,
                bfs_child_width: width,
                task_pick: if rr {
                    TaskPick::RoundRobin
                } else {
                    TaskPick::Weighted
                },
                temporal_filter: tf,
                seed,
                split_seed,
                num_threads: Some(1),
                num_prefetch: 1,
                ..SamplerConfig::default()
            },
        )
}

/// How a task's target cell is found, recomputed from the metadata.
#[derive(Debug, Clone)]
pub struct Plan {
    pub anchor_table: usize,
    pub target_column: u32,
    /// `Some(slot)`: a stored column of the anchor table; `None`: virtual
    /// (values from the task file, one extra cell).
    pub cell_slot: Option<usize>,
    pub seed_cells: usize,
    pub code: u8,
}

pub fn plans(db: &Database) -> Vec<Plan> {
    let m = db.metadata();
    m.tasks
        .iter()
        .map(|k| {
            let col = &m.columns[k.target_column as usize];
            let cell_slot = match col.slot {
                Some(s) if col.table == k.anchor_table => Some(s as usize),
                _ => None,
            };
            let stored = m.tables[k.anchor_table as usize].columns.len();
            Plan {
                anchor_table: k.anchor_table as usize,
                target_column: k.target_column,
                cell_slot,
                seed_cells: stored + cell_slot.is_none() as usize,
                code: k.target_stype.code().expect("targets have a code"),
            }
        })
        .collect()
}

/// Cells per row of each table (its stored columns).
pub fn row_cells(db: &Database) -> Vec<u16> {
    db.metadata()
        .tables
        .iter()
        .map(|t| t.columns.len() as u16)
        .collect()
}

pub fn params(cfg: &SamplerConfig) -> BfsParams {
    BfsParams {
        max_cells: cfg.default_sequence_length,
        max_hops: cfg.max_hops,
        child_width: cfg.bfs_child_width,
        temporal_filter: cfg.temporal_filter,
    }
}

/// Mirror of `derive` in `src/maker/`.
fn derive(seed: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(mix64(seed ^ 0x6865_6164_7761_7465), |acc, &p| {
            mix64(acc ^ mix64(p.wrapping_add(0x9E37_79B9)))
        })
}

pub struct RefSeq {
    pub seed_pos: u32,
    pub anchor: u32,
    pub obs: i64,
    pub sub: Subgraph,
}

pub struct RefBatch {
    pub task: usize,
    pub seqs: Vec<RefSeq>,
    pub exhaust_events: u32,
    pub duplicates: u32,
}

/// Independent re-run of one split's seed draws and BFS calls.
pub struct Reference<'a> {
    db: &'a Database,
    cfg: SamplerConfig,
    pub plans: Vec<Plan>,
    pub row_cells: Vec<u16>,
    split: Split,
    step: u64,
    drawn: Vec<u64>,
    pools: Vec<Option<SeedPool>>,
    picker: TaskPicker,
    scratch: BfsScratch,
}

impl<'a> Reference<'a> {
    pub fn new(db: &'a Database, cfg: &SamplerConfig, split: Split) -> Self {
        let c = cfg;
        let m = db.metadata();
        let names: Vec<String> = m.tasks.iter().map(|k| k.name.clone()).collect();
        let weights = c.weights_for(&names).unwrap();
        let mut pools = Vec::new();
        let mut eligible = Vec::new();
        for k in 0..m.tasks.len() {
            let seeds = split_seeds(
                k as u32,
                db.task(k).unwrap().anchor_rows,
                split,
                c.split_seed,
                c.split_ratios,
            );
            eligible.push(!seeds.is_empty());
            pools.push((!seeds.is_empty()).then(|| {
                let s = derive(c.seed, &[split.index() as u64, k as u64, 1]);
                SeedPool::new(seeds, s)
            }));
        }
        let key = derive(c.seed, &[split.index() as u64, 3]);
        Reference {
            db,
            cfg: cfg.clone(),
            plans: plans(db),
            row_cells: row_cells(db),
            split,
            step: 0,
            drawn: vec![0; m.tasks.len()],
            pools,
            picker: TaskPicker::new(c.task_pick, &weights, &eligible, key),
            scratch: BfsScratch::default(),
        }
    }

    /// No task can be picked: `make_batch` must refuse.
    pub fn is_empty(&self) -> bool {
        self.picker.is_empty()
    }

    pub fn next_batch(&mut self) -> RefBatch {
        let k = self.picker.pick(self.step) as usize;
        let task = self.db.task(k).unwrap();
        let pool = self.pools[k].as_mut().unwrap();
        let key = derive(self.cfg.seed, &[self.split.index() as u64, self.step, 2]);
        let p = params(&self.cfg);
        let g = self.db.graph();
        let mut out = RefBatch {
            task: k,
            seqs: Vec::new(),
            exhaust_events: 0,
            duplicates: 0,
        };
        let mut jobs = Vec::new();
        let b = self.cfg.default_batch_size as u64;
        let first = self.drawn[k] + self.cfg.rank as u64 * b;
        for j in 0..b {
            let d = pool.at(first + j);
            out.exhaust_events += d.exhausted as u32;
            out.duplicates += d.duplicate as u32;
            jobs.push((d.seed, derive(key, &[self.cfg.rank as u64 * b + j])));
        }
        self.drawn[k] += self.cfg.world_size as u64 * b;
        self.step += 1;
        for (pos, rs) in jobs {
            let anchor = task.anchor_rows[pos as usize];
            let obs = task.obs_times[pos as usize];
            let mut sub = Subgraph::default();
            let mut rng = Xoshiro256pp::seed_from_u64(rs);
            bfs(
                &g,
                &self.row_cells,
                anchor,
                self.plans[k].seed_cells,
                obs,
                &p,
                &mut rng,
                &mut self.scratch,
                &mut sub,
            );
            out.seqs.push(RefSeq {
                seed_pos: pos,
                anchor,
                obs,
                sub,
            });
        }
        out
    }
}

/// One BFS call's inputs, for [`check_subgraph`].
pub struct BfsCase<'a> {
    pub g: GraphView<'a>,
    pub row_cells: &'a [u16],
    pub seed: u32,
    pub seed_cells: usize,
    pub obs: i64,
    pub p: BfsParams,
}

/// Check one BFS result against the rules, recomputing everything from the
/// graph (parents from the forward CSR, child visibility from the children's
/// own row times, not from the CSR's time column):
/// - the seed first, rows distinct, depths non-decreasing and ≤ `max_hops`;
/// - every row at hop `h` is a parent of a hop-`h-1` row, or a child of one
///   that is visible at the cutoff; parents come before children in a hop;
/// - no row other than the seed is after the cutoff (parents included: a
///   parent dated after the cutoff is future data reached through a row
///   without a time, and is filtered too);
/// - the cell count, `temporal_filtered` (hidden children per expansion plus
///   distinct future parents), `children_capped` and `temporal_leaks` (rows
///   other than the seed that are after `obs_time`) equal independent
///   recounts;
/// - `edges` are exactly the FK edges between included rows;
/// - when nothing was dropped for the budget, every parent of every expanded
///   row is included, and so is every visible child of a row whose visible
///   children fit the width.
pub fn check_subgraph(c: &BfsCase<'_>, sub: &Subgraph) -> Check {
    let (g, p) = (&c.g, &c.p);
    let rows = &sub.rows;
    let depth = &sub.depth;
    let n = rows.len();
    prop_assert!(n >= 1 && rows[0] == c.seed, "seed {} not first", c.seed);
    prop_assert_eq!(depth.len(), n);
    prop_assert_eq!(depth[0], 0);
    let mut local: HashMap<u32, usize> = HashMap::new();
    for (i, &r) in rows.iter().enumerate() {
        prop_assert!((r as usize) < g.num_rows());
        prop_assert!(local.insert(r, i).is_none(), "row {} included twice", r);
    }
    let cutoff = if p.temporal_filter { c.obs } else { i64::MAX };
    let max_rows = p.max_cells.min(u16::MAX as usize - 1);
    let cells_of = |i: usize| -> usize {
        if i == 0 {
            c.seed_cells.min(p.max_cells)
        } else {
            c.row_cells[g.row_table[rows[i] as usize] as usize] as usize
        }
    };
    let cells: usize = (0..n).map(cells_of).sum();
    prop_assert_eq!(sub.cells, cells);
    prop_assert!(sub.cells <= p.max_cells);
    prop_assert!(n <= max_rows.max(1));
    for i in 1..n {
        prop_assert!(depth[i] >= depth[i - 1], "depths not in BFS order");
        prop_assert!(depth[i] as usize <= p.max_hops);
    }
    prop_assert_eq!(sub.max_depth, depth[n - 1]);

    let mut filtered = 0u64;
    let mut capped = 0u64;
    let mut leaks = 0u64;
    let mut future_parents: HashSet<u32> = HashSet::new();
    for hop in 1..=p.max_hops {
        let frontier: Vec<usize> = (0..n).filter(|&i| depth[i] as usize == hop - 1).collect();
        let before: Vec<usize> = (0..n).filter(|&i| (depth[i] as usize) < hop).collect();
        let cells_before: usize = before.iter().map(|&i| cells_of(i)).sum();
        let here: Vec<usize> = (0..n).filter(|&i| depth[i] as usize == hop).collect();
        let ran = !frontier.is_empty() && cells_before < p.max_cells && before.len() < max_rows;
        if !ran {
            prop_assert!(here.is_empty(), "rows at hop {} after the BFS stopped", hop);
            break;
        }
        let frontier_rows: HashSet<u32> = frontier.iter().map(|&i| rows[i]).collect();
        let parent_of_frontier: HashSet<u32> = frontier
            .iter()
            .flat_map(|&i| g.parents(rows[i]).iter().copied())
            .collect();
        let mut seen_child = false;
        for &i in &here {
            let r = rows[i];
            let t = g.row_time[r as usize];
            leaks += (t != i64::MIN && t > c.obs) as u64;
            prop_assert!(
                t <= cutoff,
                "hop {}: row {} has time {} after the cutoff {}",
                hop,
                r,
                t,
                cutoff
            );
            if parent_of_frontier.contains(&r) {
                prop_assert!(
                    !seen_child,
                    "hop {}: parent row {} comes after a child",
                    hop,
                    r
                );
            } else {
                seen_child = true;
                let linked = g.parents(r).iter().any(|q| frontier_rows.contains(q));
                prop_assert!(
                    linked,
                    "hop {}: row {} is neither a parent nor a child of a hop-{} row",
                    hop,
                    r,
                    hop - 1
                );
            }
        }
        let included_by = |r: u32| local.get(&r).is_some_and(|&k| depth[k] as usize <= hop);
        for &j in &frontier {
            let u = rows[j];
            for &par in g.parents(u) {
                let t = g.row_time[par as usize];
                if par != c.seed && t != i64::MIN && t > cutoff && future_parents.insert(par) {
                    filtered += 1;
                }
            }
            if sub.cells_dropped == 0 {
                for &par in g
                    .parents(u)
                    .iter()
                    .filter(|&&q| g.row_time[q as usize] <= cutoff)
                {
                    prop_assert!(
                        included_by(par),
                        "parent {} of row {} missing with nothing dropped",
                        par,
                        u
                    );
                }
            }
            let (ids, _) = g.children(u);
            let visible: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&ch| g.row_time[ch as usize] <= cutoff)
                .collect();
            filtered += (ids.len() - visible.len()) as u64;
            capped += visible.len().saturating_sub(p.child_width) as u64;
            if sub.cells_dropped == 0 && visible.len() <= p.child_width {
                for ch in visible {
                    prop_assert!(
                        included_by(ch),
                        "visible child {} of row {} missing (width {}, nothing dropped)",
                        ch,
                        u,
                        p.child_width
                    );
                }
            }
        }
    }
    prop_assert_eq!(sub.temporal_filtered, filtered, "temporal_filtered recount");
    prop_assert_eq!(sub.children_capped, capped, "children_capped recount");

    let want: BTreeSet<(u16, u16)> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, &r)| {
            g.parents(r)
                .iter()
                .filter_map(|q| local.get(q).map(|&j| (i as u16, j as u16)))
                .collect::<Vec<_>>()
        })
        .collect();
    let got: BTreeSet<(u16, u16)> = sub.edges.iter().copied().collect();
    prop_assert_eq!(got, want, "edges are not exactly the FK edges between rows");

    // The leak invariant counts every included row after the observation
    // time, however it was reached.
    prop_assert_eq!(sub.temporal_leaks, leaks, "temporal_leaks recount");
    Ok(())
}

/// Every included row (seed included) is at or before `obs` (or has no time).
pub fn check_no_future_rows(g: &GraphView<'_>, sub: &Subgraph, obs: i64) -> Check {
    for &r in &sub.rows {
        let t = g.row_time[r as usize];
        prop_assert!(
            t == i64::MIN || t <= obs,
            "row {} at {} is after the observation time {}",
            r,
            t,
            obs
        );
    }
    prop_assert_eq!(sub.temporal_leaks, 0);
    Ok(())
}

/// Is `perm` a permutation of `0..s` with the `cells` real positions first?
fn check_perm(name: &str, perm: &[u16], cells: usize) -> Check {
    let s = perm.len();
    let mut seen = vec![false; s];
    for (k, &p) in perm.iter().enumerate() {
        let p = p as usize;
        prop_assert!(p < s && !seen[p], "{}: not a permutation: {:?}", name, perm);
        seen[p] = true;
        prop_assert_eq!(
            k < cells,
            p < cells,
            "{}: padding not last at {}: {:?}",
            name,
            k,
            perm
        );
    }
    Ok(())
}

/// Layout invariants of a batch that need no knowledge of its rows.
pub fn check_layout(db: &Database, batch: &MadeBatch, cfg: &SamplerConfig) -> Check {
    let m = db.metadata();
    let (b, s) = (cfg.default_batch_size, cfg.default_sequence_length);
    prop_assert_eq!((batch.batch_size, batch.seq_len), (b, s));
    let n = b * s;
    let r = batch.max_rows;
    prop_assert_eq!(batch.semantic_types.len(), n);
    prop_assert_eq!(batch.column_ids.len(), n);
    prop_assert_eq!(batch.seq_row_ids.len(), n);
    prop_assert_eq!(batch.numeric_values.len(), n);
    prop_assert_eq!(batch.timestamp_values.len(), n * TIMESTAMP_DIM);
    prop_assert_eq!(batch.bool_values.len(), n);
    prop_assert_eq!(batch.categorical_embed_ids.len(), n);
    prop_assert_eq!(batch.text_embed_ids.len(), n);
    prop_assert_eq!(batch.is_null.len(), n);
    prop_assert_eq!(batch.is_target.len(), n);
    prop_assert_eq!(batch.is_padding.len(), n);
    prop_assert_eq!(batch.fk_adj.len(), b * r * r);
    prop_assert_eq!(batch.col_perm.len(), n);
    prop_assert_eq!(batch.out_perm.len(), n);
    prop_assert_eq!(batch.in_perm.len(), n);
    let dim = m.embedder.dim as usize;
    prop_assert_eq!(batch.text_dim, dim);
    prop_assert_eq!(batch.text_batch_embeddings.len(), batch.num_text * dim);
    prop_assert_eq!(batch.seeds.len(), b);
    prop_assert_eq!(batch.readings.seqs.len(), b);

    let task = &m.tasks[batch.task_idx as usize];
    let tcol = &m.columns[task.target_column as usize];
    prop_assert_eq!(batch.target_stype, task.target_stype.code().unwrap());
    prop_assert_eq!(
        (batch.cat_emb_start, batch.cat_emb_count),
        (tcol.cat_emb_start, tcol.cat_emb_count)
    );

    let mut max_rows = 0usize;
    for q in 0..b {
        let rng = q * s..(q + 1) * s;
        let pad = &batch.is_padding[rng.clone()];
        let cells = pad.iter().position(|&x| x != 0).unwrap_or(s);
        prop_assert!(cells >= 1, "seq {}: no target cell", q);
        prop_assert!(
            pad[cells..].iter().all(|&x| x == 1) && pad.iter().all(|&x| x <= 1),
            "seq {}: is_padding is not a suffix: {:?}",
            q,
            pad
        );
        let at = |p: usize| q * s + p;
        // Padding cells are zero in every value tensor.
        for p in cells..s {
            let f = at(p);
            prop_assert!(
                batch.semantic_types[f] == 0
                    && batch.column_ids[f] == 0
                    && batch.seq_row_ids[f] == 0
                    && batch.numeric_values[f].to_bits() == 0
                    && batch.bool_values[f] == 0
                    && batch.categorical_embed_ids[f] == 0
                    && batch.text_embed_ids[f] == 0
                    && batch.is_null[f] == 0
                    && batch.is_target[f] == 0
                    && batch.timestamp_values[f * TIMESTAMP_DIM..(f + 1) * TIMESTAMP_DIM]
                        .iter()
                        .all(|x| x.to_bits() == 0),
                "seq {}: padding position {} is not all-zero",
                q,
                p
            );
        }
        // Exactly one target, at position 0, of the task's column and type.
        prop_assert_eq!(
            batch.is_target[at(0)],
            1,
            "seq {}: position 0 not target",
            q
        );
        prop_assert!(
            batch.is_target[at(1)..at(s)].iter().all(|&x| x == 0),
            "seq {}: more than one target",
            q
        );
        prop_assert_eq!(batch.semantic_types[at(0)], batch.target_stype as i8);
        prop_assert_eq!(batch.column_ids[at(0)], task.target_column as i32);
        // Rows: local ids from 0, in order, each row's cells together, one table per row.
        let ids = &batch.seq_row_ids[at(0)..at(cells)];
        prop_assert_eq!(ids[0], 0);
        for w in ids.windows(2) {
            prop_assert!(
                w[1] == w[0] || w[1] == w[0] + 1,
                "seq {}: seq_row_ids {:?}",
                q,
                ids
            );
        }
        let nrows = ids[cells - 1] as usize + 1;
        max_rows = max_rows.max(nrows);
        let mut row_table: Vec<Option<u32>> = vec![None; nrows];
        for p in 0..cells {
            let f = at(p);
            let col = batch.column_ids[f];
            prop_assert!(col >= 0 && (col as usize) < m.columns.len());
            let cm = &m.columns[col as usize];
            let code = batch.semantic_types[f];
            prop_assert_eq!(
                Some(code as u8),
                cm.stype.code(),
                "seq {} pos {}: semantic type of column {}",
                q,
                p,
                col
            );
            let rt = &mut row_table[batch.seq_row_ids[f] as usize];
            prop_assert!(
                rt.is_none() || *rt == Some(cm.table),
                "seq {}: a row mixes tables",
                q
            );
            *rt = Some(cm.table);
            // Only the tensor of the cell's own type may be set, none if null.
            let null = batch.is_null[f];
            prop_assert!(null <= 1);
            let live = |c: i8| null == 0 && code == c;
            prop_assert!(live(0) || batch.numeric_values[f].to_bits() == 0);
            prop_assert!(live(1) || batch.bool_values[f] == 0);
            prop_assert!(
                live(2)
                    || batch.timestamp_values[f * TIMESTAMP_DIM..(f + 1) * TIMESTAMP_DIM]
                        .iter()
                        .all(|x| x.to_bits() == 0)
            );
            prop_assert!(live(3) || batch.categorical_embed_ids[f] == 0);
            prop_assert!(live(4) || batch.text_embed_ids[f] == 0);
            prop_assert!(batch.bool_values[f] <= 1);
            if live(3) {
                let id = batch.categorical_embed_ids[f];
                prop_assert!(
                    id >= cm.cat_emb_start && id < cm.cat_emb_start + cm.cat_emb_count,
                    "seq {} pos {}: category {} outside column {}'s block",
                    q,
                    p,
                    id,
                    col
                );
                if col as u32 == task.target_column {
                    prop_assert!(
                        id >= batch.cat_emb_start && id < batch.cat_emb_start + batch.cat_emb_count
                    );
                }
            }
            if live(4) {
                prop_assert!((batch.text_embed_ids[f] as usize) < batch.num_text);
            }
        }
        // fk_adj: 0/1, nothing outside this sequence's rows.
        let adj = &batch.fk_adj[q * r * r..(q + 1) * r * r];
        for i in 0..r {
            for j in 0..r {
                let v = adj[i * r + j];
                prop_assert!(v <= 1);
                prop_assert!(
                    v == 0 || (i < nrows && j < nrows),
                    "seq {}: fk_adj[{}, {}] set outside its {} rows",
                    q,
                    i,
                    j,
                    nrows
                );
            }
        }
        // Permutations.
        check_perm("col_perm", &batch.col_perm[rng.clone()], cells)?;
        check_perm("out_perm", &batch.out_perm[rng.clone()], cells)?;
        check_perm("in_perm", &batch.in_perm[rng.clone()], cells)?;
        let key = |p: u16| (batch.column_ids[at(p as usize)], p);
        for w in batch.col_perm[at(0)..at(cells)].windows(2) {
            prop_assert!(
                key(w[0]) < key(w[1]),
                "seq {}: col_perm does not group by column",
                q
            );
        }
        for (name, perm) in [("out_perm", &batch.out_perm), ("in_perm", &batch.in_perm)] {
            let mut done = HashSet::new();
            let mut last = None;
            for &p in &perm[at(0)..at(cells)] {
                let row = batch.seq_row_ids[at(p as usize)];
                if last != Some(row) {
                    prop_assert!(
                        done.insert(row),
                        "seq {}: {} splits the cells of row {}",
                        q,
                        name,
                        row
                    );
                    last = Some(row);
                }
            }
            prop_assert_eq!(done.len(), nrows);
        }
        let st = &batch.readings.seqs[q];
        prop_assert_eq!(st.rows as usize, nrows);
        prop_assert_eq!(st.cells as usize, cells);
    }
    prop_assert_eq!(
        batch.max_rows,
        max_rows,
        "R is not the most rows of any sequence"
    );

    // Text: batch-local ids in first-seen order, every one used.
    let mut next = 0u32;
    for f in 0..n {
        if batch.semantic_types[f] == 4 && batch.is_null[f] == 0 && batch.is_padding[f] == 0 {
            let id = batch.text_embed_ids[f];
            prop_assert!(id <= next, "text ids not in first-seen order");
            if id == next {
                next += 1;
            }
        }
    }
    prop_assert_eq!(
        next as usize,
        batch.num_text,
        "unused text_batch_embeddings rows"
    );
    Ok(())
}

/// Everything about `batch` that needs its global rows, from the reference
/// model: the drawn seeds, the subgraphs (checked by [`check_subgraph`]),
/// every cell's column and value, `fk_adj` against the FK graph, the text
/// dictionary and the per-sequence counters.
pub fn check_against_reference(
    db: &Database,
    batch: &MadeBatch,
    rb: &RefBatch,
    reference: &Reference<'_>,
    cfg: &SamplerConfig,
) -> Check {
    let m = db.metadata();
    let g = db.graph();
    prop_assert_eq!(
        batch.task_idx as usize,
        rb.task,
        "reference model out of sync with make_batch (task pick): has the RNG stream layout of src/maker/ changed?"
    );
    let ref_seeds: Vec<u32> = rb.seqs.iter().map(|x| x.seed_pos).collect();
    prop_assert_eq!(
        &batch.seeds,
        &ref_seeds,
        "reference model out of sync with make_batch (seed draws)"
    );
    prop_assert_eq!(batch.readings.exhaust_events, rb.exhaust_events);
    prop_assert_eq!(batch.readings.duplicate_seeds, rb.duplicates);
    prop_assert_eq!(batch.readings.duplicate_seeds, 0);
    let plan = &reference.plans[rb.task];
    prop_assert_eq!(batch.target_stype, plan.code);
    let s = batch.seq_len;
    let r = batch.max_rows;
    prop_assert_eq!(
        r,
        rb.seqs.iter().map(|x| x.sub.rows.len()).max().unwrap(),
        "R"
    );
    let tables: Vec<_> = (0..m.tables.len()).map(|t| db.table(t).unwrap()).collect();
    let task = db.task(rb.task).unwrap();
    let (ts_mean, ts_std) = (m.timestamp_stats.mean_us, m.timestamp_stats.std_us);
    let mut local_to_global: HashMap<u32, u32> = HashMap::new();
    let mut global_to_local: HashMap<u32, u32> = HashMap::new();
    for (q, x) in rb.seqs.iter().enumerate() {
        let sub = &x.sub;
        prop_assert_eq!(sub.rows[0], x.anchor);
        check_subgraph(
            &BfsCase {
                g,
                row_cells: &reference.row_cells,
                seed: x.anchor,
                seed_cells: plan.seed_cells,
                obs: x.obs,
                p: params(cfg),
            },
            sub,
        )?;
        // Expected cells, in order.
        let mut cells: Vec<(u32, u16, ColumnValues<'_>, bool, usize)> = Vec::new();
        for (i, &row) in sub.rows.iter().enumerate() {
            let t = g.row_table[row as usize] as usize;
            let tv = &tables[t];
            let lr = (row - tv.row_offset) as usize;
            let mut skip = usize::MAX;
            if i == 0 {
                prop_assert_eq!(t, plan.anchor_table);
                if let Some(slot) = plan.cell_slot {
                    let c = &tv.columns[slot];
                    cells.push((c.column_idx, 0, c.values, c.is_valid(lr), lr));
                    skip = slot;
                } else {
                    let sp = x.seed_pos as usize;
                    cells.push((
                        plan.target_column,
                        0,
                        task.targets,
                        bit(task.target_validity, sp),
                        sp,
                    ));
                }
            }
            for (j, c) in tv.columns.iter().enumerate() {
                if j != skip {
                    cells.push((c.column_idx, i as u16, c.values, c.is_valid(lr), lr));
                }
            }
        }
        cells.truncate(s);
        let real = batch.is_padding[q * s..(q + 1) * s]
            .iter()
            .filter(|&&p| p == 0)
            .count();
        prop_assert_eq!(real, cells.len(), "seq {}: cell count", q);
        for (p, &(col, lrow, values, valid, idx)) in cells.iter().enumerate() {
            let f = q * s + p;
            prop_assert_eq!(
                batch.column_ids[f],
                col as i32,
                "seq {} pos {}: column",
                q,
                p
            );
            prop_assert_eq!(batch.seq_row_ids[f], lrow, "seq {} pos {}: row", q, p);
            prop_assert_eq!(batch.is_null[f], !valid as u8, "seq {} pos {}: null", q, p);
            if !valid {
                continue;
            }
            match values {
                ColumnValues::Numerical(v) => prop_assert_eq!(
                    batch.numeric_values[f].to_bits(),
                    v[idx].to_bits(),
                    "seq {} pos {}: numeric value",
                    q,
                    p
                ),
                ColumnValues::Boolean(v) => prop_assert_eq!(batch.bool_values[f], v[idx]),
                ColumnValues::Categorical(v) => {
                    prop_assert_eq!(batch.categorical_embed_ids[f], v[idx]);
                }
                ColumnValues::Timestamp(v) => {
                    let mut want = [0f32; TIMESTAMP_DIM];
                    encode_timestamp(v[idx], ts_mean, ts_std, &mut want);
                    let got = &batch.timestamp_values[f * TIMESTAMP_DIM..(f + 1) * TIMESTAMP_DIM];
                    prop_assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "seq {} pos {}: timestamp encoding",
                        q,
                        p
                    );
                }
                ColumnValues::Text(v) => {
                    let (l, gl) = (batch.text_embed_ids[f], v[idx]);
                    prop_assert_eq!(*local_to_global.entry(l).or_insert(gl), gl, "text id map");
                    prop_assert_eq!(*global_to_local.entry(gl).or_insert(l), l, "text id map");
                }
            }
        }
        // fk_adj is exactly the FK relation between included rows.
        let adj = &batch.fk_adj[q * r * r..(q + 1) * r * r];
        let nrows = sub.rows.len();
        for i in 0..nrows {
            for j in 0..nrows {
                let real = g.parents(sub.rows[i]).contains(&sub.rows[j]);
                prop_assert_eq!(
                    adj[i * r + j] == 1,
                    real,
                    "seq {}: fk_adj[{}, {}] (rows {} -> {})",
                    q,
                    i,
                    j,
                    sub.rows[i],
                    sub.rows[j]
                );
            }
        }
        let st = &batch.readings.seqs[q];
        prop_assert_eq!(st.depth, sub.max_depth);
        prop_assert_eq!(st.rows as usize, nrows);
        prop_assert_eq!(st.cells_dropped, sub.cells_dropped);
        prop_assert_eq!(st.children_capped, sub.children_capped);
        prop_assert_eq!(st.temporal_filtered, sub.temporal_filtered);
        prop_assert_eq!(st.temporal_leaks, sub.temporal_leaks);
    }
    // The batch's text embeddings are the rows of the global table.
    let emb = db.text_embeddings().unwrap();
    let dim = batch.text_dim;
    for (&l, &gl) in &local_to_global {
        let (l, gl) = (l as usize, gl as usize);
        prop_assert!(
            batch.text_batch_embeddings[l * dim..(l + 1) * dim]
                .iter()
                .zip(&emb[gl * dim..(gl + 1) * dim])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "text embedding {} is not global text {}",
            l,
            gl
        );
    }
    Ok(())
}

/// Every tensor and counter of two batches, bit for bit (timings excluded).
pub fn same_batch(a: &MadeBatch, b: &MadeBatch) -> bool {
    let f32s = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let f16s = |x: &[half::f16]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    (a.batch_size, a.seq_len, a.max_rows, a.num_text, a.text_dim)
        == (b.batch_size, b.seq_len, b.max_rows, b.num_text, b.text_dim)
        && a.semantic_types == b.semantic_types
        && a.column_ids == b.column_ids
        && a.seq_row_ids == b.seq_row_ids
        && f32s(&a.numeric_values) == f32s(&b.numeric_values)
        && f32s(&a.timestamp_values) == f32s(&b.timestamp_values)
        && a.bool_values == b.bool_values
        && a.categorical_embed_ids == b.categorical_embed_ids
        && a.text_embed_ids == b.text_embed_ids
        && a.is_null == b.is_null
        && a.is_target == b.is_target
        && a.is_padding == b.is_padding
        && a.fk_adj == b.fk_adj
        && a.col_perm == b.col_perm
        && a.out_perm == b.out_perm
        && a.in_perm == b.in_perm
        && f16s(&a.text_batch_embeddings) == f16s(&b.text_batch_embeddings)
        && (a.target_stype, a.task_idx, a.cat_emb_start, a.cat_emb_count)
            == (b.target_stype, b.task_idx, b.cat_emb_start, b.cat_emb_count)
        && a.segments == b.segments
        && a.segment_ids == b.segment_ids
        && a.target_pos == b.target_pos
        && a.target_count == b.target_count
        && a.segment_seeds == b.segment_seeds
        && a.seeds == b.seeds
        && a.readings.seqs == b.readings.seqs
        && (
            a.readings.exhaust_events,
            a.readings.duplicate_seeds,
            a.split,
            a.step,
        ) == (
            b.readings.exhaust_events,
            b.readings.duplicate_seeds,
            b.split,
            b.step,
        )
}
