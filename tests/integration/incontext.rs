//! In-context contexts (`examples = true`): the tier rules checked context
//! by context on synthetic databases (the seed first, examples only from
//! the seed's table, labelled and before the seed's time, every row within
//! the seed's bound), the leak invariant firing on a broken filter and
//! quiet otherwise, labels visible and the seed's target masked in the
//! batch, determinism across thread counts, the deadline's redraw, and
//! the recipe's config errors.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use headwater::config::ExampleRanker;
use headwater::context::{
    build_in_context, BfsScratch, ExampleParams, ExampleScratch, SeqRecipe, Subgraph,
};
use headwater::format::{Database, GraphView};
use headwater::preprocess::SynthSpec;
use headwater::ranking::rankers::Ranker;
use headwater::ranking::walks::WalkGraph;
use headwater::sampler::{BatchMaker, MadeBatch, SamplerCore};
use headwater::{Error, SamplerConfig, Split};

use crate::oracle::{build, same_batch, SynthDb};

/// Tables 0..4 of 150 rows (1 and 3 timed), no null keys.
pub(crate) fn db() -> SynthDb {
    build(&SynthSpec {
        null_fk: 0.0,
        ..SynthSpec::small(4, 150, 21)
    })
    .expect("synthesizes")
}

/// The query task has no labels on its rows: weight 0.
pub(crate) fn cfg() -> SamplerConfig {
    SamplerConfig {
        default_batch_size: 8,
        default_sequence_length: 128,
        max_hops: 2,
        num_threads: Some(2),
        seed: 3,
        examples: true,
        local_context_sizes: vec![16, 32, 64],
        bfs_widths: vec![2, 4],
        num_walks: 200,
        walk_length: 6,
        task_weights: Some(headwater::config::TaskWeights::ByName(BTreeMap::from([(
            "future_flag".to_string(),
            0.0,
        )]))),
        ..SamplerConfig::default()
    }
}

fn row_time(g: &GraphView<'_>, r: u32) -> i64 {
    g.row_time[r as usize]
}

/// Build the in-context context of every seed of cell task `k` (each
/// recipe of the lists in turn), check the tier rules and return the
/// contexts with their seeds' observation times.
fn contexts(db: &Database, k: usize, filter: bool) -> Vec<(Subgraph, i64)> {
    contexts_ranked(db, k, filter, Ranker::Walks)
}

/// The in-context parameters of cell task `k` these tests build with
/// (`S` = 128, 200 walks of 6 rows, `ranker`, the time filter `filter`),
/// handed to `f` with the graph.
pub(crate) fn with_task_params<R>(
    db: &Database,
    k: usize,
    filter: bool,
    ranker: Ranker,
    f: impl FnOnce(&GraphView<'_>, &ExampleParams<'_>) -> R,
) -> R {
    let m = db.metadata();
    let anchor = m.tasks[k].anchor_table as usize;
    let col = &m.columns[m.tasks[k].target_column as usize];
    let view = db.table(anchor).unwrap();
    let label = &view.columns[col.slot.unwrap() as usize];
    let off = view.row_offset;
    let has_label = move |r: u32| label.is_valid((r - off) as usize);
    let g = db.graph();
    let wg = WalkGraph::new(&g).unwrap();
    let row_cells: Vec<u16> = m.tables.iter().map(|t| t.columns.len() as u16).collect();
    let p = ExampleParams {
        seq_len: 128,
        max_hops: 2,
        temporal_filter: filter,
        num_walks: 200,
        walk_length: 6,
        table: g.table_rows[anchor],
        walk_graph: &wg,
        row_cells: &row_cells,
        seed_cells: row_cells[anchor] as usize,
        has_label: &has_label,
        deadline: None,
        ranker,
        prune: 0.25,
        store: None,
        walk_salt: 0,
        labels: None,
        items: None,
        splits: None,
    };
    f(&g, &p)
}

/// [`contexts`] with `ranker` ranking tier 1.
fn contexts_ranked(db: &Database, k: usize, filter: bool, ranker: Ranker) -> Vec<(Subgraph, i64)> {
    let task = db.task(k).unwrap();
    let anchor = db.metadata().tasks[k].anchor_table as usize;
    with_task_params(db, k, filter, ranker, |g, p| {
        let (mut bs, mut ex) = (BfsScratch::default(), ExampleScratch::default());
        let mut out = Vec::new();
        for (i, (&seed, &obs)) in task
            .anchor_rows
            .iter()
            .zip(task.obs_times)
            .enumerate()
            .take(60)
        {
            let r = SeqRecipe {
                local_size: [16, 32, 64][i % 3],
                bfs_width: 4,
                prefer_latest: i % 2 == 1,
            };
            let mut sub = Subgraph::default();
            build_in_context(g, seed, obs, i as u64, &r, p, 4, &mut bs, &mut ex, &mut sub);
            assert_eq!(sub.rows[0], seed, "the seed is row 0");
            assert!(sub.cells <= 128 && sub.tier_cells.iter().sum::<u32>() as usize == sub.cells);
            let distinct: HashSet<u32> = sub.rows.iter().copied().collect();
            assert_eq!(distinct.len(), sub.rows.len(), "a row twice");
            for &(c, par) in &sub.edges {
                let (c, par) = (sub.rows[c as usize], sub.rows[par as usize]);
                assert!(
                    g.parents(c).contains(&par),
                    "edge {c}->{par} is not an FK edge"
                );
            }
            let mut last_time = i64::MAX;
            for &(e, tier) in &sub.example_rows {
                assert!(tier == 1 || tier == 2);
                assert_eq!(
                    g.table_of(e),
                    Some(anchor),
                    "an example outside the seed's table"
                );
                assert_ne!(e, seed);
                assert!((p.has_label)(e), "an example without a label");
                let t = row_time(g, e);
                if filter {
                    assert!(
                        t == i64::MIN || t < obs,
                        "an example at or after the seed's time"
                    );
                }
                if tier == 1 && r.prefer_latest {
                    assert!(t <= last_time, "prefer_latest ranks latest first");
                    last_time = t;
                }
            }
            if filter {
                assert_eq!(sub.temporal_leaks, 0);
                for &row in &sub.rows[1..] {
                    let t = row_time(g, row);
                    assert!(t == i64::MIN || t <= obs, "row {row} after the seed's time");
                }
            }
            out.push((sub, obs));
        }
        out
    })
}

#[test]
fn every_tier_keeps_the_rules_on_timed_and_untimed_tables() {
    let sdb = db();
    let m = sdb.db.metadata();
    let rankers = [Ranker::Walks, Ranker::Adaptive, Ranker::Expected];
    for (k, ranker) in (0..m.tasks.len() - 1).flat_map(|k| rankers.map(|r| (k, r))) {
        let subs = contexts_ranked(&sdb.db, k, true, ranker);
        let tiers = |t: u8| {
            subs.iter()
                .flat_map(|s| &s.0.example_rows)
                .filter(|e| e.1 == t)
                .count()
        };
        assert!(tiers(1) > 0, "task {k}, {ranker:?}: no ranked example");
        assert!(subs.iter().any(|s| s.0.walk_steps > 0));
        assert!(subs.iter().any(|s| s.0.tier_cells[1] > 0));
        // Early seeds of a timed table have few eligible rows: tier 2 may
        // be empty there, never on the untimed table 0.
        if k == 0 {
            assert!(tiers(2) > 0, "task 0, {ranker:?}: no random example");
        }
    }
}

#[test]
fn a_context_is_short_only_when_no_eligible_labelled_row_is_left() {
    let sdb = db();
    let m = sdb.db.metadata();
    let (mut built, mut short) = (0, 0);
    for k in 0..m.tasks.len() - 1 {
        let subs = contexts(&sdb.db, k, true);
        with_task_params(&sdb.db, k, true, Ranker::Walks, |g, p| {
            let (lo, hi) = p.table;
            let ec = usize::from(p.row_cells[g.table_of(lo).unwrap()]);
            for (sub, obs) in &subs {
                built += 1;
                if p.seq_len - sub.cells < ec {
                    continue;
                }
                short += 1;
                let held: HashSet<u32> = sub.rows.iter().copied().collect();
                let left = (lo..hi)
                    .filter(|&r| !held.contains(&r) && (p.has_label)(r))
                    .filter(|&r| row_time(g, r) == i64::MIN || row_time(g, r) < *obs)
                    .count();
                assert_eq!(
                    left, 0,
                    "task {k}: {} of {} cells, {left} rows unused",
                    sub.cells, p.seq_len
                );
            }
        });
    }
    eprintln!("{short} of {built} contexts short");
    assert!(
        short < built,
        "every context short: the check proves nothing"
    );
}

#[test]
fn a_broken_filter_lights_the_leak_invariant_in_the_example_tiers() {
    let sdb = db();
    // Task 1: a timed table; without the filter, later rows become examples.
    let subs = contexts(&sdb.db, 1, false);
    let g = sdb.db.graph();
    let example_leaks = subs
        .iter()
        .flat_map(|(s, obs)| s.example_rows.iter().map(move |e| (e.0, *obs)))
        .filter(|&(e, obs)| row_time(&g, e) >= obs && row_time(&g, e) != i64::MIN)
        .count();
    assert!(
        example_leaks > 0,
        "the broken filter admitted no future example"
    );
    let counted: u64 = subs.iter().map(|s| s.0.temporal_leaks).sum();
    assert!(
        counted >= example_leaks as u64,
        "{counted} < {example_leaks}"
    );
    // And through the batch maker's readings.
    let leaks = |filter: bool| -> u64 {
        let c = SamplerConfig {
            temporal_filter: filter,
            ..cfg()
        };
        let mut mk = maker(&sdb.db, &c);
        (0..4)
            .map(|_| mk.next().unwrap().unwrap())
            .flat_map(|b| b.readings.seqs.clone())
            .map(|s| s.temporal_leaks)
            .sum()
    };
    assert!(leaks(false) > 0, "broken filter: the invariant stays quiet");
    assert_eq!(leaks(true), 0, "healthy run: the invariant fires");
}

pub(crate) fn maker(db: &Arc<Database>, c: &SamplerConfig) -> BatchMaker {
    BatchMaker::new(
        Arc::new(SamplerCore::with_database(db.clone(), c.clone()).unwrap()),
        Split::Train,
    )
}

#[test]
fn the_seed_target_is_masked_and_example_labels_are_visible() {
    let sdb = db();
    let mut mk = maker(&sdb.db, &cfg());
    let m = sdb.db.metadata();
    let mut examples = 0;
    for _ in 0..4 {
        let b = mk.next().unwrap().unwrap();
        let target_col = m.tasks[b.task_idx as usize].target_column as i32;
        let s = b.seq_len;
        for (q, r) in b.readings.seqs.iter().enumerate() {
            let at = |p: usize| q * s + p;
            assert_eq!(b.is_target[at(0)], 1, "the seed's target is the target");
            assert_eq!((1..s).filter(|&p| b.is_target[at(p)] == 1).count(), 0);
            let labels = (1..s)
                .filter(|&p| {
                    b.column_ids[at(p)] == target_col
                        && b.seq_row_ids[at(p)] != 0
                        && b.is_null[at(p)] == 0
                        && b.is_padding[at(p)] == 0
                })
                .count();
            assert!(
                labels >= r.examples as usize,
                "{labels} labels < {} examples",
                r.examples
            );
            examples += r.examples;
            assert_eq!(r.tier_cells.iter().sum::<u32>(), r.cells);
        }
    }
    assert!(examples > 0);
}

/// `n` training batches of a fresh sampler on `db` with `c`.
pub(crate) fn run(db: &Arc<Database>, c: &SamplerConfig, n: usize) -> Vec<MadeBatch> {
    let mut mk = maker(db, c);
    (0..n).map(|_| mk.next().unwrap().unwrap()).collect()
}

#[test]
fn in_context_batches_do_not_depend_on_the_thread_count() {
    let sdb = db();
    let one = run(
        &sdb.db,
        &SamplerConfig {
            num_threads: Some(1),
            ..cfg()
        },
        4,
    );
    assert!(one
        .iter()
        .any(|b| b.readings.seqs.iter().any(|s| s.examples > 0)));
    for t in [2, 4] {
        let c = SamplerConfig {
            num_threads: Some(t),
            ..cfg()
        };
        for (i, (a, b)) in one.iter().zip(run(&sdb.db, &c, 4)).enumerate() {
            assert!(
                same_batch(a, &b),
                "batch {i} differs between 1 and {t} threads"
            );
            assert_eq!(a.readings.seqs, b.readings.seqs);
        }
        // The pipelined stream, several batches in flight.
        let core = SamplerCore::with_database(sdb.db.clone(), c).unwrap();
        let mut state = core.split_state(Split::Train);
        let mut got = Vec::new();
        core.stream_batches(
            &mut state,
            3,
            |_, _| None,
            |b| {
                got.push(b.unwrap());
                got.len() < 4
            },
        );
        for (a, b) in one.iter().zip(&got) {
            assert!(
                same_batch(a, b),
                "the pipelined stream differs with {t} threads"
            );
        }
    }
}

#[test]
fn a_passed_deadline_redraws_the_plain_context_and_is_counted() {
    let sdb = db();
    let base = run(&sdb.db, &cfg(), 2);
    let hits = |bs: &[MadeBatch]| -> u32 {
        bs.iter()
            .flat_map(|b| &b.readings.seqs)
            .map(|s| s.deadline_hits)
            .sum()
    };
    // Each hit also counts in `stalls` (the stall detector's counter; no
    // stall_after_ms is reached by these builds).
    let stalls = |bs: &[MadeBatch]| -> u32 { bs.iter().map(|b| b.readings.stalls).sum() };
    assert_eq!(hits(&base), 0, "quiet without a deadline");
    assert_eq!(stalls(&base), 0, "no stall without a deadline");
    let loose = SamplerConfig {
        context_deadline_ms: Some(3_600_000.0),
        ..cfg()
    };
    let far = run(&sdb.db, &loose, 2);
    assert_eq!(hits(&far), 0, "quiet under a deadline never reached");
    assert_eq!(stalls(&far), 0, "no stall under a deadline never reached");
    for (a, b) in base.iter().zip(&far) {
        assert!(same_batch(a, b), "a deadline not hit changed a batch");
    }
    // 1 ns: every context passes it at its first walk.
    let tight = SamplerConfig {
        context_deadline_ms: Some(1e-6),
        ..cfg()
    };
    let hit = run(&sdb.db, &tight, 2);
    assert_eq!(hits(&hit), 16, "every context counted once");
    assert_eq!(stalls(&hit), 16, "every deadline hit is a stall");
    for b in &hit {
        assert!(b
            .readings
            .seqs
            .iter()
            .all(|s| s.examples == 0 && s.tier_cells[1] == 0));
    }
    // The redraw is the seed's plain context: the same every run.
    for (a, b) in hit.iter().zip(&run(&sdb.db, &tight, 2)) {
        assert!(same_batch(a, b), "the redraw is not deterministic");
    }
}

fn config_error(c: SamplerConfig, sdb: &SynthDb) -> (String, String) {
    match SamplerCore::with_database(sdb.db.clone(), c) {
        Err(Error::Config { key, what, .. }) => (key, what),
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("expected a config error, got a sampler"),
    }
}

#[test]
fn bad_recipes_are_config_errors_naming_key_value_and_range() {
    let sdb = db();
    let cases: Vec<(SamplerConfig, &str, &str)> = vec![
        (
            SamplerConfig {
                local_context_sizes: vec![],
                ..cfg()
            },
            "local_context_sizes",
            "[]",
        ),
        (
            SamplerConfig {
                local_context_sizes: vec![64, 129],
                ..cfg()
            },
            "local_context_sizes",
            "129",
        ),
        (
            SamplerConfig {
                bfs_widths: vec![0],
                ..cfg()
            },
            "bfs_widths",
            "[0]",
        ),
        (
            SamplerConfig {
                prefer_latest: vec![],
                ..cfg()
            },
            "prefer_latest",
            "[]",
        ),
        (
            SamplerConfig {
                context_deadline_ms: Some(0.0),
                ..cfg()
            },
            "context_deadline_ms",
            "0",
        ),
        (
            SamplerConfig {
                context_deadline_ms: Some(-5.0),
                ..cfg()
            },
            "context_deadline_ms",
            "-5",
        ),
        (
            SamplerConfig {
                mask_prob_max: 1.5,
                ..cfg()
            },
            "mask_prob_max",
            "1.5",
        ),
        (
            SamplerConfig {
                walk_length: 0,
                ..cfg()
            },
            "walk_length",
            "0",
        ),
        (
            SamplerConfig {
                expected_prune: 0.0,
                ..cfg()
            },
            "expected_prune",
            "0",
        ),
        (
            SamplerConfig {
                expected_prune: f64::NAN,
                ..cfg()
            },
            "expected_prune",
            "NaN",
        ),
        (
            SamplerConfig {
                pack: true,
                ..cfg()
            },
            "examples",
            "pack",
        ),
        (
            SamplerConfig {
                task_weights: None,
                ..cfg()
            },
            "examples",
            "future_flag",
        ),
    ];
    for (c, key, value) in cases {
        let (k, msg) = config_error(c, &sdb);
        let range = headwater::config::field(key).unwrap().range();
        assert_eq!(k, key, "{msg}");
        assert!(msg.contains(value) && msg.contains(&*range), "{msg}");
    }
    // Off, the lists are not read: a short S keeps the defaults working.
    let off = SamplerConfig {
        default_sequence_length: 64,
        ..SamplerConfig::default()
    };
    assert!(SamplerCore::with_database(sdb.db.clone(), off).is_ok());
    let e = SamplerConfig::from_json(&serde_json::json!({"example_ranker": "fast"})).unwrap_err();
    assert!(
        e.to_string().contains("example_ranker") && e.to_string().contains("\"walks\""),
        "{e}"
    );
    // A task whose anchor table has a single row has no example to show.
    let lone = build(&SynthSpec {
        rows: vec![1, 50, 50],
        null_fk: 0.0,
        ..SynthSpec::small(3, 50, 4)
    })
    .unwrap();
    let (k, msg) = config_error(cfg(), &lone);
    assert_eq!(k, "examples");
    assert!(msg.contains("1 row(s)"), "{msg}");
}

/// An evaluation pass covers every task, the query task at weight 0 too:
/// its contexts stay plain (no examples), the cell tasks' get examples.
#[test]
fn an_evaluation_pass_keeps_plain_contexts_for_a_query_task() {
    let sdb = db();
    let core = Arc::new(SamplerCore::with_database(sdb.db.clone(), cfg()).unwrap());
    let query = sdb.db.metadata().tasks.len() - 1;
    let pass = headwater::sampler::EvalPass::new(core, Split::Val, None, Some(8)).unwrap();
    let mut seen = HashSet::new();
    for b in pass {
        let b = b.unwrap();
        let k = b.task_idx as usize;
        seen.insert(k);
        let examples: u32 = b.readings.seqs.iter().map(|s| s.examples).sum();
        if k == query {
            assert_eq!(examples, 0, "the query task got examples");
            assert!(b.readings.seqs.iter().all(|s| s.walk_steps == 0));
        }
    }
    assert!(seen.contains(&query), "the pass skipped the query task");
}

/// The recipe is part of the stream: a state taken under one recipe is
/// refused by a sampler with another, naming the key; the deadline (a
/// wall-clock safety bound) may change; a state taken without examples is
/// refused by a sampler with them, naming `examples`.
#[test]
fn a_state_saved_with_another_recipe_is_refused_naming_the_key() {
    use headwater::Sampler;
    let sdb = db();
    let take_state = |c: SamplerConfig| {
        let s = Sampler::new(&sdb.dir, c).unwrap();
        s.next_batch(Split::Train).unwrap();
        s.state()
    };
    let state = take_state(cfg());
    let changes: Vec<(&str, SamplerConfig)> = vec![
        (
            "local_context_sizes",
            SamplerConfig {
                local_context_sizes: vec![16, 32],
                ..cfg()
            },
        ),
        (
            "bfs_widths",
            SamplerConfig {
                bfs_widths: vec![4],
                ..cfg()
            },
        ),
        (
            "prefer_latest",
            SamplerConfig {
                prefer_latest: vec![true],
                ..cfg()
            },
        ),
        (
            "num_walks",
            SamplerConfig {
                num_walks: 100,
                ..cfg()
            },
        ),
        (
            "walk_length",
            SamplerConfig {
                walk_length: 4,
                ..cfg()
            },
        ),
        (
            "mask_prob_max",
            SamplerConfig {
                mask_prob_max: 0.25,
                ..cfg()
            },
        ),
        (
            "example_ranker",
            SamplerConfig {
                example_ranker: headwater::config::ExampleRanker::Adaptive,
                ..cfg()
            },
        ),
        (
            "examples",
            SamplerConfig {
                examples: false,
                ..cfg()
            },
        ),
    ];
    for (key, c) in changes {
        match Sampler::with_state(&sdb.dir, c, Some(&state)) {
            Err(Error::State { field, what }) => {
                assert_eq!(field, key, "{what}");
                assert!(what.contains("it changes the batch stream"), "{what}");
            }
            other => panic!(
                "{key}: expected a state refusal, got {:?}",
                other.map(|_| ())
            ),
        }
    }
    // The expected ranker's pruning is part of its recipe.
    let expected = || SamplerConfig {
        example_ranker: ExampleRanker::Expected,
        ..cfg()
    };
    let pruned = take_state(expected());
    let finer = SamplerConfig {
        expected_prune: 0.05,
        ..expected()
    };
    match Sampler::with_state(&sdb.dir, finer, Some(&pruned)) {
        Err(Error::State { field, what }) => assert_eq!(field, "expected_prune", "{what}"),
        other => panic!("expected a state refusal, got {:?}", other.map(|_| ())),
    }
    assert!(Sampler::with_state(&sdb.dir, expected(), Some(&pruned)).is_ok());
    let plain = take_state(SamplerConfig {
        examples: false,
        ..cfg()
    });
    match Sampler::with_state(&sdb.dir, cfg(), Some(&plain)) {
        Err(Error::State { field, what }) => {
            assert_eq!(field, "examples", "{what}");
            assert!(what.contains("examples = not set"), "{what}");
        }
        other => panic!("expected an examples refusal, got {:?}", other.map(|_| ())),
    }
    // The same recipe, and another deadline, continue.
    let same = Sampler::with_state(&sdb.dir, cfg(), Some(&state)).unwrap();
    let again = take_state(cfg());
    let cont = Sampler::with_state(
        &sdb.dir,
        SamplerConfig {
            context_deadline_ms: Some(60_000.0),
            ..cfg()
        },
        Some(&again),
    )
    .unwrap();
    assert_eq!(
        same.next_batch(Split::Train).unwrap().fingerprint,
        cont.next_batch(Split::Train).unwrap().fingerprint
    );
}

/// In-context batches keep the stream's promises: a resume from a state
/// taken after k steps (another thread count) continues bit for bit, and
/// `replay_batch` rebuilds every delivered step exactly.
#[test]
fn in_context_resume_and_replay_are_exact() {
    use headwater::Sampler;
    let sdb = db();
    let with = |t: usize| SamplerConfig {
        num_threads: Some(t),
        ..cfg()
    };
    let whole = Sampler::new(&sdb.dir, with(2)).unwrap();
    let all: Vec<MadeBatch> = (0..5)
        .map(|_| whole.next_batch(Split::Train).unwrap())
        .collect();
    assert!(all
        .iter()
        .any(|b| b.readings.seqs.iter().any(|s| s.examples > 0)));
    let first = Sampler::new(&sdb.dir, with(1)).unwrap();
    for _ in 0..2 {
        first.next_batch(Split::Train).unwrap();
    }
    let resumed = Sampler::with_state(&sdb.dir, with(1), Some(&first.state())).unwrap();
    for (i, a) in all.iter().enumerate().skip(2) {
        let b = resumed.next_batch(Split::Train).unwrap();
        assert!(same_batch(a, &b), "step {i} differs after the resume");
    }
    for (i, a) in all.iter().enumerate() {
        let r = whole.replay_batch(Split::Train, i as u64, None).unwrap();
        assert!(same_batch(a, &r), "replay of step {i} differs");
        assert_eq!(a.readings.seqs, r.readings.seqs);
    }
}

/// `adaptive` walks in blocks and stops once its picks are stable.
#[test]
fn the_adaptive_ranker_walks_less_takes_examples_and_keeps_batches_thread_independent() {
    let sdb = db();
    let walks = SamplerConfig {
        num_walks: 2000,
        ..cfg()
    };
    let adaptive = SamplerConfig {
        example_ranker: ExampleRanker::Adaptive,
        ..walks.clone()
    };
    let steps = |bs: &[MadeBatch]| -> u64 {
        bs.iter()
            .flat_map(|b| b.readings.seqs.iter().map(|s| s.walk_steps))
            .sum()
    };
    let full = run(&sdb.db, &walks, 3);
    let one = run(
        &sdb.db,
        &SamplerConfig {
            num_threads: Some(1),
            ..adaptive.clone()
        },
        3,
    );
    let two = run(&sdb.db, &adaptive, 3);
    for (a, b) in one.iter().zip(&two) {
        assert!(
            same_batch(a, b),
            "adaptive batches differ between 1 and 2 threads"
        );
    }
    assert!(one
        .iter()
        .any(|b| b.readings.seqs.iter().any(|s| s.examples > 0)));
    // At most 256 walks of 6 rows per context (5 steps each).
    let seqs: usize = one.iter().map(|b| b.readings.seqs.len()).sum();
    assert!(steps(&one) <= 256 * 5 * seqs as u64, "{}", steps(&one));
    assert!(
        steps(&one) * 4 < steps(&full),
        "{} vs {}",
        steps(&one),
        steps(&full)
    );
}

/// `expected` draws no walk: its batches are the same at any thread count
/// and on every run, and it takes examples.
#[test]
fn the_expected_ranker_takes_examples_and_keeps_batches_thread_independent() {
    let sdb = db();
    let expected = SamplerConfig {
        example_ranker: ExampleRanker::Expected,
        num_walks: 2000,
        ..cfg()
    };
    let one = run(
        &sdb.db,
        &SamplerConfig {
            num_threads: Some(1),
            ..expected.clone()
        },
        3,
    );
    let two = run(&sdb.db, &expected, 3);
    for (a, b) in one.iter().zip(&two) {
        assert!(
            same_batch(a, b),
            "expected batches differ between 1 and 2 threads"
        );
    }
    let examples: u64 = one
        .iter()
        .flat_map(|b| b.readings.seqs.iter().map(|s| u64::from(s.examples)))
        .sum();
    assert!(examples > 0, "no example taken");
    assert!(one
        .iter()
        .any(|b| b.readings.seqs.iter().any(|s| s.walk_steps > 0)));
}
