//! Properties of the parts under the batch: BFS called directly from any
//! row, splits and shards, the hub width cap, categorical target blocks.

use std::sync::Arc;

use headwater::context::{bfs, BfsParams, BfsScratch, Subgraph};
use headwater::format::{Database, SemanticType};
use headwater::preprocess::{
    ColumnData, ColumnInput, DatabaseWriter, ForeignKeyInput, SynthSpec, TableInput, TaskInput,
    TaskTarget,
};
use headwater::rng::Xoshiro256pp;
use headwater::sampler::{BatchMaker, SamplerCore};
use headwater::seeds::split::bucket;
use headwater::seeds::{rank_slice, split_of, split_seeds, Split};
use headwater::SamplerConfig;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestRunner;

use crate::oracle::{
    arb_spec, arb_time_consistent_spec, build, check_against_reference, check_layout,
    check_no_future_rows, check_subgraph, config, must, row_cells, scratch_dir, BfsCase, Check,
    Reference,
};

const DAY_US: i64 = 86_400_000_000;

/// One BFS start: which row, its generator, how to pick `obs_time`, and
/// whether the seed carries an extra (virtual target) cell.
fn arb_starts() -> impl Strategy<Value = Vec<(Index, u64, u8, u64, bool)>> {
    proptest::collection::vec(
        (
            any::<Index>(),
            any::<u64>(),
            0u8..4,
            0..40 * DAY_US as u64,
            any::<bool>(),
        ),
        1..12,
    )
}

fn arb_params() -> impl Strategy<Value = BfsParams> {
    (1usize..=80, 0usize..=5, 1usize..=6, any::<bool>()).prop_map(|(c, h, w, f)| BfsParams {
        max_cells: c,
        max_hops: h,
        child_width: w,
        temporal_filter: f,
    })
}

fn same_sub(a: &Subgraph, b: &Subgraph) -> bool {
    (
        &a.rows,
        &a.depth,
        &a.edges,
        a.cells,
        a.max_depth,
        a.cells_dropped,
        a.children_capped,
        a.temporal_filtered,
        a.temporal_leaks,
    ) == (
        &b.rows,
        &b.depth,
        &b.edges,
        b.cells,
        b.max_depth,
        b.cells_dropped,
        b.children_capped,
        b.temporal_filtered,
        b.temporal_leaks,
    )
}

/// `obs_time` for a start: 0 the seed's own time, 1 that plus `delta`,
/// 2 none (`i64::MAX`), 3 anywhere in the data's time range.
fn obs_for(db: &Database, row: u32, how: u8, delta: u64) -> i64 {
    let g = db.graph();
    let own = g.row_time[row as usize];
    let base = if own == i64::MIN { i64::MAX } else { own };
    match how {
        0 => base,
        1 => base.saturating_add(delta as i64),
        2 => i64::MAX,
        _ => {
            let times = g.row_time.iter().filter(|&&t| t != i64::MIN);
            let lo = times.clone().min().copied().unwrap_or(0);
            lo - DAY_US + delta as i64
        }
    }
}

/// `check(case, rng seed, result)` on the BFS from each of `starts` over
/// `spec`'s database, one scratch reused across starts.
fn each_bfs(
    spec: &SynthSpec,
    p: BfsParams,
    starts: Vec<(Index, u64, u8, u64, bool)>,
    mut check: impl FnMut(&BfsCase<'_>, u64, &Subgraph) -> Check,
) -> Check {
    let Some(sdb) = build(spec) else {
        return Ok(());
    };
    let db = &sdb.db;
    let g = db.graph();
    let rc = row_cells(db);
    let mut scratch = BfsScratch::default();
    let mut sub = Subgraph::default();
    for (idx, rs, how, delta, extra) in starts {
        let seed = idx.index(g.num_rows()) as u32;
        let obs = obs_for(db, seed, how, delta);
        let seed_cells = rc[g.row_table[seed as usize] as usize] as usize + usize::from(extra);
        let mut rng = Xoshiro256pp::seed_from_u64(rs);
        bfs(
            &g,
            &rc,
            seed,
            seed_cells,
            obs,
            &p,
            &mut rng,
            &mut scratch,
            &mut sub,
        );
        let case = BfsCase {
            g,
            row_cells: &rc,
            seed,
            seed_cells,
            obs,
            p,
        };
        check(&case, rs, &sub)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(64))]

    /// Property 1 (and the BFS rules behind 2 and 3) on BFS called directly,
    /// from any row, with one scratch reused across starts; a fresh scratch
    /// gives the identical result.
    #[test]
    fn bfs_from_any_row_follows_the_rules(
        spec in arb_spec(),
        p in arb_params(),
        starts in arb_starts(),
    ) {
        each_bfs(&spec, p, starts, |c, rs, sub| {
            check_subgraph(c, sub)?;
            let mut fresh = Subgraph::default();
            bfs(&c.g, c.row_cells, c.seed, c.seed_cells, c.obs, &p, &mut Xoshiro256pp::seed_from_u64(rs), &mut BfsScratch::default(), &mut fresh);
            prop_assert!(same_sub(sub, &fresh), "result depends on scratch state");
            Ok(())
        })?;
    }

    /// What packing keeps of a context larger than its share: the longest
    /// prefix of its rows (BFS order) that fits the budget, every FK edge
    /// between the kept rows, connected (each kept row but the seed has an
    /// edge to an earlier kept row, as it was reached), the cut cells in
    /// `cells_dropped` and the leaks recounted over the kept rows.
    #[test]
    fn a_cut_context_is_the_longest_prefix_that_fits(
        spec in arb_spec(),
        p in arb_params(),
        starts in arb_starts(),
    ) {
        each_bfs(&spec, p, starts, |c, rs, whole| {
            let (g, rc, seed_cells, obs) = (&c.g, c.row_cells, c.seed_cells, c.obs);
            let first = seed_cells.min(p.max_cells);
            let budget = first + (rs as usize) % (whole.cells - first + 1);
            let mut cut = whole.clone();
            cut.keep_prefix(budget, rc, seed_cells, g.row_time, obs);
            let n = cut.rows.len();
            prop_assert!(n >= 1 && cut.rows[..] == whole.rows[..n], "not a prefix");
            prop_assert_eq!(&cut.depth[..], &whole.depth[..n]);
            prop_assert_eq!(&cut.tables[..], &whole.tables[..n]);
            let cells_of = |i: usize| rc[whole.tables[i] as usize] as usize;
            prop_assert_eq!(cut.cells, first + (1..n).map(cells_of).sum::<usize>());
            prop_assert!(cut.cells <= budget, "{} cells over the budget {}", cut.cells, budget);
            if n < whole.rows.len() {
                prop_assert!(cut.cells + cells_of(n) > budget, "row {} would still fit", n);
            } else {
                prop_assert_eq!(budget, whole.cells, "a whole context under a smaller budget");
            }
            prop_assert_eq!(cut.budget, budget);
            prop_assert_eq!(cut.cells_dropped, whole.cells_dropped + (whole.cells - cut.cells) as u64);
            let want: Vec<(u16, u16)> = whole
                .edges
                .iter()
                .copied()
                .filter(|&(i, j)| (i as usize) < n && (j as usize) < n)
                .collect();
            prop_assert_eq!(&cut.edges, &want);
            for i in 1..n {
                prop_assert!(
                    cut.edges.iter().any(|&(a, b)| (a as usize == i && (b as usize) < i) || (b as usize == i && (a as usize) < i)),
                    "kept row {} has no edge to an earlier kept row", i
                );
            }
            let leaks = cut.rows[1..]
                .iter()
                .filter(|&&r| g.row_time[r as usize] != i64::MIN && g.row_time[r as usize] > obs)
                .count() as u64;
            prop_assert_eq!(cut.temporal_leaks, leaks);
            prop_assert_eq!(cut.max_depth, cut.depth[n - 1]);
            prop_assert_eq!(
                (cut.children_capped, cut.temporal_filtered),
                (whole.children_capped, whole.temporal_filtered),
                "the BFS's own counts stay"
            );
            Ok(())
        })?;
    }

    /// Property 3 on BFS directly: time-consistent database, filter on, any
    /// observation time not before the seed's own time ⇒ nothing from the
    /// future, zero leaks.
    #[test]
    fn filtered_bfs_never_reaches_the_future(
        spec in arb_time_consistent_spec(),
        p in arb_params(),
        starts in arb_starts(),
    ) {
        let Some(sdb) = build(&spec) else { return Ok(()) };
        let db = &sdb.db;
        let g = db.graph();
        let rc = row_cells(db);
        let p = BfsParams { temporal_filter: true, ..p };
        let mut scratch = BfsScratch::default();
        let mut sub = Subgraph::default();
        for (idx, rs, how, delta, _) in starts {
            let seed = idx.index(g.num_rows()) as u32;
            let own = g.row_time[seed as usize];
            let obs = match how % 3 {
                0 if own != i64::MIN => own,
                1 if own != i64::MIN => own + delta as i64,
                2 if own == i64::MIN => obs_for(db, seed, 3, delta),
                _ => i64::MAX,
            };
            let seed_cells = rc[g.row_table[seed as usize] as usize] as usize;
            bfs(&g, &rc, seed, seed_cells, obs, &p, &mut Xoshiro256pp::seed_from_u64(rs), &mut scratch, &mut sub);
            check_no_future_rows(&g, &sub, obs)?;
        }
    }

    /// Property 4: splits partition each task's seeds, the rank slices of a
    /// step partition the step's global positions for every world size
    /// 1..=5, and split membership depends only on (task, row, split_seed,
    /// ratios) — the bucket being the documented
    /// `xxh3(task_le ‖ row_le, split_seed) % 1000`.
    #[test]
    fn splits_and_shards_partition(
        rows in proptest::collection::vec(any::<u32>(), 0..300),
        task in 0u32..8,
        split_seed in any::<u64>(),
        w in (0u32..=10, 0u32..=10, 0u32..=10).prop_filter("some weight", |w| w.0 + w.1 + w.2 > 0),
        drawn in 0u64..1_000_000,
        b in 1usize..=9,
    ) {
        let sum = (w.0 + w.1 + w.2) as f64;
        let ratios = [w.0 as f64 / sum, w.1 as f64 / sum, 1.0 - (w.0 + w.1) as f64 / sum];
        let splits = [Split::Train, Split::Val, Split::Test];
        for (pos, &r) in rows.iter().enumerate() {
            let mut key = [0u8; 8];
            key[..4].copy_from_slice(&task.to_le_bytes());
            key[4..].copy_from_slice(&r.to_le_bytes());
            let b = bucket(task, r, split_seed);
            prop_assert_eq!(b as u64, xxhash_rust::xxh3::xxh3_64_with_seed(&key, split_seed) % 1000);
            let want = if b < (ratios[0] * 1000.0).round() as u32 {
                Split::Train
            } else if b < ((ratios[0] + ratios[1]) * 1000.0).round() as u32 {
                Split::Val
            } else {
                Split::Test
            };
            prop_assert_eq!(split_of(task, r, split_seed, ratios), want, "row {} at {}", r, pos);
        }
        let mut owner = vec![None; rows.len()];
        for split in splits {
            let mine = split_seeds(task, &rows, split, split_seed, ratios);
            prop_assert!(mine.windows(2).all(|w| w[0] < w[1]), "ascending");
            for &p in &mine {
                let o = &mut owner[p as usize];
                prop_assert!(o.is_none(), "seed {} in two splits", p);
                *o = Some(split);
                prop_assert_eq!(split_of(task, rows[p as usize], split_seed, ratios), split);
            }
        }
        prop_assert!(owner.iter().all(Option::is_some), "a seed in no split");
        for world in 1u32..=5 {
            let mut union: Vec<u64> = Vec::new();
            for rank in 0..world {
                let mine = rank_slice(drawn, rank, b);
                prop_assert_eq!(mine.end - mine.start, b as u64);
                union.extend(mine);
            }
            union.sort_unstable();
            let whole: Vec<u64> = (drawn..drawn + world as u64 * b as u64).collect();
            prop_assert_eq!(union, whole, "rank slices over {} ranks", world);
        }
    }
}

/// Regression: tables t00 (temporal) ← t01 (no time) ← t02 (temporal), one
/// FK each. Seed row 6 (t02, observed at its own time) → parent row 4 (t01,
/// no time) → parent row 0 (t00), whose time is after the observation time.
/// The time-filtered BFS must not include it, even though it is a parent.
#[test]
fn future_grandparent_through_timeless_parent_is_filtered() {
    let sdb = build(&SynthSpec {
        tables: 3,
        rows: vec![3, 3, 3],
        fks_per_table: 1,
        null_fk: 0.0,
        temporal: vec![true, false, true],
        hub_share: 0.0,
        seed: 0,
    })
    .unwrap();
    let db = &sdb.db;
    let g = db.graph();
    let rc = row_cells(db);
    let task = db.task(2).unwrap(); // t02.x: obs_time = the row's own time
    let p = BfsParams {
        max_cells: 64,
        max_hops: 2,
        child_width: 16,
        temporal_filter: true,
    };
    for (i, &seed) in task.anchor_rows.iter().enumerate() {
        let obs = task.obs_times[i];
        let mut sub = Subgraph::default();
        bfs(
            &g,
            &rc,
            seed,
            rc[2] as usize,
            obs,
            &p,
            &mut Xoshiro256pp::seed_from_u64(1),
            &mut BfsScratch::default(),
            &mut sub,
        );
        must(check_no_future_rows(&g, &sub, obs));
    }
}

/// Property 8: a hub row with ~49k children. BFS from it samples exactly
/// `bfs_child_width` of its visible children, counts the rest as capped and
/// the invisible ones as filtered (recounted from the forward edges).
#[test]
fn hub_children_are_capped_at_the_width() {
    let sdb = build(&SynthSpec {
        tables: 2,
        rows: vec![3, 50_000],
        fks_per_table: 1,
        null_fk: 0.0,
        temporal: vec![false, true],
        hub_share: 0.98,
        seed: 17,
    })
    .unwrap();
    let db = &sdb.db;
    let g = db.graph();
    let rc = row_cells(db);
    let hub = 0u32;
    assert_eq!(g.row_table[hub as usize], 0);
    // Children of the hub, from the forward CSR (not the reverse one BFS uses).
    let mut child_times: Vec<i64> = (0..g.num_rows() as u32)
        .filter(|&r| g.parents(r).contains(&hub))
        .map(|r| g.row_time[r as usize])
        .collect();
    child_times.sort_unstable();
    let total = child_times.len();
    assert!(total > 45_000, "hub has only {total} children");
    let mut runner = TestRunner::new(config(32));
    let strategy = (1usize..=64, 0usize..=total, any::<u64>(), any::<bool>());
    runner
        .run(&strategy, |(width, k, rs, filter)| {
            // A cutoff with exactly `k` children at or before it (or all).
            let obs = if k == total {
                i64::MAX
            } else {
                child_times[k] - 1
            };
            let visible = if filter {
                child_times.partition_point(|&t| t <= obs)
            } else {
                total
            };
            let p = BfsParams {
                max_cells: 16 + width * rc[1] as usize,
                max_hops: 1,
                child_width: width,
                temporal_filter: filter,
            };
            let mut sub = Subgraph::default();
            let seed_cells = rc[0] as usize;
            bfs(
                &g,
                &rc,
                hub,
                seed_cells,
                obs,
                &p,
                &mut Xoshiro256pp::seed_from_u64(rs),
                &mut BfsScratch::default(),
                &mut sub,
            );
            prop_assert_eq!(sub.rows.len(), 1 + width.min(visible));
            prop_assert_eq!(sub.children_capped as usize, visible.saturating_sub(width));
            prop_assert_eq!(sub.temporal_filtered as usize, total - visible);
            prop_assert_eq!(sub.cells_dropped, 0);
            for &c in &sub.rows[1..] {
                prop_assert!(g.parents(c).contains(&hub));
                prop_assert!(!filter || g.row_time[c as usize] <= obs);
            }
            check_subgraph(
                &BfsCase {
                    g,
                    row_cells: &rc,
                    seed: hub,
                    seed_cells,
                    obs,
                    p,
                },
                &sub,
            )
        })
        .unwrap();
}

/// A small database with categorical targets: a cell task on the second
/// categorical column of the child table and a value task with its own
/// categories, so neither target block starts at 0.
fn categorical_db(dir: &std::path::Path) -> Database {
    let mut w = DatabaseWriter::new(dir, "cat-test", "hash", 8).unwrap();
    let n_p = 10;
    let n_c = 40;
    let none_p = vec![i64::MIN; n_p];
    let times_c: Vec<i64> = (0..n_c as i64).map(|i| 1_000_000 * (i + 1)).collect();
    let all_p = vec![1u8; n_p];
    let all_c: Vec<u8> = (0..n_c).map(|i| (i % 7 != 3) as u8).collect();
    let colors: Vec<u32> = (0..n_p as u32).map(|i| i % 3).collect();
    let sizes: Vec<u32> = (0..n_p as u32).map(|i| (i * 7) % 4).collect();
    let kinds: Vec<u32> = (0..n_c as u32).map(|i| i % 2).collect();
    let shades: Vec<u32> = (0..n_c as u32).map(|i| (i * 5) % 3).collect();
    let parents: Vec<i64> = (0..n_c as i64).map(|i| i % n_p as i64).collect();
    let id = || ColumnInput {
        name: "id".into(),
        stype: SemanticType::Identifier,
        source_type: "BIGINT".into(),
        inferred: false,
        data: ColumnData::Unstored,
    };
    #[allow(clippy::items_after_statements)] // the helper sits by its only use
    fn cat<'a>(name: &str, codes: &'a [u32], valid: &'a [u8], k: usize) -> ColumnInput<'a> {
        ColumnInput {
            name: name.into(),
            stype: SemanticType::Categorical,
            source_type: "VARCHAR".into(),
            inferred: false,
            data: ColumnData::Categorical {
                codes,
                valid,
                categories: (0..k).map(|i| format!("{name}{i}")).collect(),
            },
        }
    }
    w.add_table(TableInput {
        name: "p".into(),
        num_rows: n_p,
        primary_key: Some("id".into()),
        time_column: None,
        row_time: &none_p,
        columns: vec![
            id(),
            cat("color", &colors, &all_p, 3),
            cat("size", &sizes, &all_p, 4),
        ],
        foreign_keys: vec![],
        fingerprint: "p".into(),
    })
    .unwrap();
    let ts_valid = vec![1u8; n_c];
    w.add_table(TableInput {
        name: "c".into(),
        num_rows: n_c,
        primary_key: Some("id".into()),
        time_column: Some("ts".into()),
        row_time: &times_c,
        columns: vec![
            id(),
            cat("kind", &kinds, &all_c, 2),
            cat("shade", &shades, &all_c, 3),
            ColumnInput {
                name: "ts".into(),
                stype: SemanticType::Timestamp,
                source_type: "TIMESTAMP".into(),
                inferred: false,
                data: ColumnData::Timestamp {
                    values: &times_c,
                    valid: &ts_valid,
                },
            },
            ColumnInput {
                name: "pid".into(),
                stype: SemanticType::Identifier,
                source_type: "BIGINT".into(),
                inferred: false,
                data: ColumnData::Unstored,
            },
        ],
        foreign_keys: vec![ForeignKeyInput {
            column: "pid".into(),
            references: "p".into(),
            parents: &parents,
            num_null: 0,
            num_dangling: 0,
        }],
        fingerprint: "c".into(),
    })
    .unwrap();
    w.add_cell_task("c.shade", "c", "shade", None).unwrap();
    let anchors: Vec<u32> = (0..n_c as u32).collect();
    let obs: Vec<i64> = times_c.iter().map(|t| t + 5).collect();
    let y: Vec<u32> = (0..n_c as u32).map(|i| (i * 3) % 4).collect();
    let ok = vec![1u8; n_c];
    w.add_task(TaskInput {
        name: "next_kind".into(),
        kind: "sql".into(),
        anchor_table: "c".into(),
        anchor_rows: &anchors,
        obs_time: &obs,
        target: TaskTarget::Values {
            stype: SemanticType::Categorical,
            data: ColumnData::Categorical {
                codes: &y,
                valid: &ok,
                categories: (0..4).map(|i| format!("next{i}")).collect(),
            },
        },
        query: None,
        description: None,
        splits: None,
    })
    .unwrap();
    let z = |k: usize| vec![half::f16::from_f32(0.25); k * 8];
    let (c, k, t) = (
        w.column_texts().len(),
        w.category_texts().len(),
        w.num_text_values(),
    );
    w.finish(&z(c), &z(k), &z(t), true).unwrap();
    Database::open(dir).unwrap()
}

/// Property 7's target-block clause, on categorical targets (the synthetic
/// generator has none): stored cell target and virtual target.
#[test]
fn categorical_targets_stay_in_their_block() {
    let tmp = scratch_dir();
    let db = Arc::new(categorical_db(&tmp.path().join("db")));
    let m = db.metadata();
    for (k, task) in m.tasks.iter().enumerate() {
        let col = &m.columns[task.target_column as usize];
        assert_eq!(task.target_stype, SemanticType::Categorical);
        assert!(col.cat_emb_start > 0 && col.cat_emb_count > 0, "{col:?}");
        let mut weights = vec![0.0; m.tasks.len()];
        weights[k] = 1.0;
        let cfg = SamplerConfig {
            default_batch_size: 8,
            default_sequence_length: 24,
            bfs_child_width: 3,
            max_hops: 2,
            num_threads: Some(1),
            task_weights: Some(weights.into()),
            ..SamplerConfig::default()
        };
        let core = Arc::new(SamplerCore::with_database(db.clone(), cfg.clone()).unwrap());
        let mut mk = BatchMaker::new(core, Split::Train);
        let mut reference = Reference::new(&db, &cfg, Split::Train);
        must((|| -> Check {
            for _ in 0..4 {
                let b = mk.next().unwrap().unwrap();
                prop_assert_eq!(
                    (b.cat_emb_start, b.cat_emb_count),
                    (col.cat_emb_start, col.cat_emb_count)
                );
                check_layout(&db, &b, &cfg)?;
                check_against_reference(&db, &b, &reference.next_batch(), &reference, &cfg)?;
                for q in 0..b.batch_size {
                    let f = q * b.seq_len;
                    if b.is_null[f] == 0 {
                        let id = b.categorical_embed_ids[f];
                        prop_assert!(
                            id >= b.cat_emb_start && id < b.cat_emb_start + b.cat_emb_count
                        );
                    }
                }
            }
            Ok(())
        })());
    }
}
