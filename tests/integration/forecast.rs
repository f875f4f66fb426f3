//! Forecast (query) tasks in context: on a database whose task observes
//! each user every 10 days with a 30-day label window, no example item's
//! window is open at its seed's time over hundreds of contexts (and some
//! are, with the filter off), the example's label cell is visible and the
//! seed's masked in the batch, `label_leaks` counts an open window only
//! with the filter off, and a query task without a window is refused
//! naming it and the key (weight 0 under recipe "rt-j"); stored rankings
//! (`expected_store`) give the live ranker's batches.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use headwater::config::Recipe;
use headwater::context::{
    build_in_context, BfsScratch, ExampleParams, ExampleScratch, ItemIndex, SeqRecipe, Subgraph,
    TaskItems,
};
use headwater::format::{ColumnValues, Database, SemanticType};
use headwater::preprocess::{
    ColumnData, ColumnInput, DatabaseWriter, ForeignKeyInput, TableInput, TaskInput, TaskTarget,
};
use headwater::ranking::rankers::Ranker;
use headwater::ranking::walks::WalkGraph;
use headwater::sampler::{BatchMaker, SamplerCore};
use headwater::{Error, SamplerConfig, Split};

use crate::oracle::scratch_dir;

const DAY: i64 = 86_400_000_000;
const USERS: usize = 60;
const EVENTS: usize = 600;
/// Observations per user, one every 10 days.
const STEPS: usize = 20;
const WINDOW: i64 = 30 * DAY;

fn numerical<'a>(name: &str, values: &'a [f64], valid: &'a [u8]) -> ColumnInput<'a> {
    ColumnInput {
        name: name.into(),
        stype: SemanticType::Numerical,
        source_type: "DOUBLE".into(),
        inferred: false,
        data: ColumnData::Numerical { values, valid },
    }
}

/// Users (undated), their events (one every third of a day, for 200
/// days) and the task `will_buy` on users observed every 10 days (every
/// 11th label null), with the 30-day window when `window`.
fn write_db(dir: &Path, window: bool) -> Arc<Database> {
    write_db_with(dir, window, false)
}

/// [`write_db`], and the cell task `users.age` after `will_buy` when `cell`.
fn write_db_with(dir: &Path, window: bool, cell: bool) -> Arc<Database> {
    let mut w = DatabaseWriter::new(dir, "forecast-test", "hash", 4).unwrap();
    let age: Vec<f64> = (0..USERS).map(|u| (u % 7) as f64).collect();
    let ok_u = vec![1u8; USERS];
    w.add_table(TableInput {
        name: "users".into(),
        num_rows: USERS,
        primary_key: None,
        time_column: None,
        row_time: &[i64::MIN; USERS],
        columns: vec![numerical("age", &age, &ok_u)],
        foreign_keys: vec![],
        fingerprint: "users".into(),
    })
    .unwrap();
    let times: Vec<i64> = (0..EVENTS as i64).map(|e| e * DAY / 3).collect();
    let amount: Vec<f64> = (0..EVENTS).map(|e| (e % 13) as f64).collect();
    let parents: Vec<i64> = (0..EVENTS).map(|e| (e % USERS) as i64).collect();
    let ok_e = vec![1u8; EVENTS];
    w.add_table(TableInput {
        name: "events".into(),
        num_rows: EVENTS,
        primary_key: None,
        time_column: Some("t".into()),
        row_time: &times,
        columns: vec![numerical("amount", &amount, &ok_e)],
        foreign_keys: vec![ForeignKeyInput {
            column: "user".into(),
            references: "users".into(),
            parents: &parents,
            num_null: 0,
            num_dangling: 0,
        }],
        fingerprint: "events".into(),
    })
    .unwrap();
    let n = USERS * STEPS;
    let anchors: Vec<u32> = (0..n).map(|i| (i % USERS) as u32).collect();
    let obs: Vec<i64> = (0..n)
        .map(|i| (10 + 10 * (i / USERS) as i64) * DAY)
        .collect();
    let y: Vec<u8> = (0..n).map(|i| u8::from((i * 7 / 3) % 3 == 0)).collect();
    let valid: Vec<u8> = (0..n).map(|i| u8::from(i % 11 != 0)).collect();
    w.add_task(TaskInput {
        name: "will_buy".into(),
        kind: "sql".into(),
        anchor_table: "users".into(),
        anchor_rows: &anchors,
        obs_time: &obs,
        target: TaskTarget::Values {
            stype: SemanticType::Boolean,
            data: ColumnData::Boolean {
                values: &y,
                valid: &valid,
            },
        },
        query: None,
        description: None,
        splits: None,
    })
    .unwrap();
    if window {
        w.set_window("will_buy", WINDOW).unwrap();
    }
    if cell {
        w.add_cell_task("users.age", "users", "age", None).unwrap();
    }
    let z = |n: usize| vec![half::f16::ZERO; n * 4];
    let (c, k, t) = (
        w.column_texts().len(),
        w.category_texts().len(),
        w.num_text_values(),
    );
    w.finish(&z(c), &z(k), &z(t), false).unwrap();
    Arc::new(Database::open(dir).unwrap())
}

/// Every item's in-context context (`S` = 96; the filter `filter`), with
/// its seed row and observation time.
fn contexts(db: &Database, filter: bool) -> Vec<(Subgraph, u32, i64)> {
    let m = db.metadata();
    let task = db.task(0).unwrap();
    let g = db.graph();
    let table = g.table_rows[0];
    let index = ItemIndex::build(task.anchor_rows, task.obs_times, table);
    let items = TaskItems {
        index: &index,
        row_offset: table.0,
        anchor_rows: task.anchor_rows,
        obs: task.obs_times,
        valid: task.target_validity,
        window: m.tasks[0].window_us.unwrap(),
    };
    let wg = WalkGraph::new(&g).unwrap();
    let row_cells: Vec<u16> = m.tables.iter().map(|t| t.columns.len() as u16).collect();
    let p = ExampleParams {
        seq_len: 96,
        max_hops: 2,
        temporal_filter: filter,
        num_walks: 200,
        walk_length: 6,
        table,
        walk_graph: &wg,
        row_cells: &row_cells,
        seed_cells: usize::from(row_cells[0]) + 1,
        has_label: &|_| false,
        deadline: None,
        ranker: Ranker::Walks,
        prune: 0.25,
        store: None,
        walk_salt: 0,
        labels: None,
        items: Some(items),
        splits: None,
    };
    let (mut bs, mut ex) = (BfsScratch::default(), ExampleScratch::default());
    let mut out = Vec::new();
    for (i, (&seed, &obs)) in task.anchor_rows.iter().zip(task.obs_times).enumerate() {
        let r = SeqRecipe {
            local_size: [4, 8, 16][i % 3],
            bfs_width: 4,
            prefer_latest: i % 2 == 1,
        };
        let mut sub = Subgraph::default();
        build_in_context(
            &g, seed, obs, i as u64, &r, &p, 4, &mut bs, &mut ex, &mut sub,
        );
        out.push((sub, seed, obs));
    }
    out
}

#[test]
fn no_example_item_is_shown_before_its_window_closed() {
    let tmp = scratch_dir();
    let db = write_db(&tmp.path().join("db"), true);
    let task = db.task(0).unwrap();
    let (mut examples, mut tier2) = (0usize, 0usize);
    for (sub, seed, t) in contexts(&db, true) {
        assert_eq!(sub.example_items.len(), sub.example_rows.len());
        assert!(sub.cells <= 96, "{} cells", sub.cells);
        assert_eq!(sub.temporal_leaks, 0);
        let mut rows = HashSet::new();
        for (&(local, j), &(row, tier)) in sub.example_items.iter().zip(&sub.example_rows) {
            let j = j as usize;
            assert_eq!(sub.rows[usize::from(local)], row);
            assert_eq!(task.anchor_rows[j], row, "the item's anchor row");
            assert_ne!(row, seed, "the seed's own row is no example");
            assert!(rows.insert(row), "one item per anchor row");
            assert!(
                task.obs_times[j] + WINDOW <= t,
                "item at {} shown to a seed at {t}: its window closes at {}",
                task.obs_times[j],
                task.obs_times[j] + WINDOW
            );
            assert!(headwater::format::bit(task.target_validity, j));
            examples += 1;
            tier2 += usize::from(tier == 2);
        }
        // Items observed 30 days or more before the seed exist from day 40.
        if t >= 40 * DAY {
            assert!(!sub.example_items.is_empty(), "no example at {t}");
        }
    }
    assert!(
        examples > 1000 && tier2 > 0,
        "{examples} examples, {tier2} in tier 2"
    );
    // The filter is what keeps open windows out.
    let open = contexts(&db, false)
        .iter()
        .flat_map(|(sub, _, t)| sub.example_items.iter().map(move |e| (e.1, *t)))
        .filter(|&(j, t)| task.obs_times[j as usize] + WINDOW > t)
        .count();
    assert!(open > 0, "with the filter off no open window was shown");
}

fn cfg(filter: bool) -> SamplerConfig {
    SamplerConfig {
        default_batch_size: 8,
        default_sequence_length: 96,
        max_hops: 2,
        num_threads: Some(2),
        seed: 5,
        examples: true,
        temporal_filter: filter,
        local_context_sizes: vec![4, 8, 16],
        bfs_widths: vec![2, 4],
        num_walks: 100,
        walk_length: 6,
        ..SamplerConfig::default()
    }
}

#[test]
fn the_seed_label_is_masked_and_example_labels_are_visible() {
    let tmp = scratch_dir();
    let db = write_db(&tmp.path().join("db"), true);
    let target_col = db.metadata().tasks[0].target_column as i32;
    let core = SamplerCore::with_database(db.clone(), cfg(true)).unwrap();
    let mut mk = BatchMaker::new(Arc::new(core), Split::Train);
    let (mut examples, mut shown) = (0u32, 0u32);
    for _ in 0..12 {
        let b = mk.next().unwrap().unwrap();
        let s = b.seq_len;
        for (q, r) in b.readings.seqs.iter().enumerate() {
            let at = |p: usize| q * s + p;
            assert_eq!(b.is_target[at(0)], 1, "the seed's label is the target");
            assert_eq!(b.column_ids[at(0)], target_col);
            assert_eq!((1..s).filter(|&p| b.is_target[at(p)] == 1).count(), 0);
            let labels: Vec<usize> = (1..s)
                .filter(|&p| b.column_ids[at(p)] == target_col && b.is_padding[at(p)] == 0)
                .collect();
            // One visible label cell per example, first cell of its row.
            assert_eq!(labels.len(), r.examples as usize);
            for &p in &labels {
                assert_eq!(b.is_null[at(p)], 0, "an example's label is null");
                assert_ne!(b.seq_row_ids[at(p)], b.seq_row_ids[at(p - 1)]);
            }
            assert_eq!(r.label_leaks, 0);
            examples += r.examples;
            shown += labels.len() as u32;
        }
    }
    assert!(examples > 0 && shown == examples);
    // With the filter off the invariant counts the open windows shown.
    let core = SamplerCore::with_database(db, cfg(false)).unwrap();
    let mut mk = BatchMaker::new(Arc::new(core), Split::Train);
    let leaks: u64 = (0..12)
        .flat_map(|_| mk.next().unwrap().unwrap().readings.seqs)
        .map(|r| r.label_leaks)
        .sum();
    assert!(leaks > 0, "temporal_filter = false: label_leaks stayed 0");
}

#[test]
fn a_query_task_without_a_window_is_refused_naming_it_and_the_key() {
    let tmp = scratch_dir();
    let db = write_db(&tmp.path().join("db"), false);
    assert_eq!(db.metadata().tasks[0].window_us, None);
    match SamplerCore::with_database(db.clone(), cfg(true)) {
        Err(Error::Config { key, what, .. }) => {
            assert_eq!(key, "examples");
            assert!(
                what.contains("`will_buy`") && what.contains("`window`"),
                "{what}"
            );
        }
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("a query task without a window got examples"),
    }
    // Under recipe "rt-j" it gets weight 0: here no task is left.
    let rtj = SamplerConfig {
        recipe: Some(Recipe::RtJ),
        ..cfg(true)
    };
    let Err(Error::Config { what, .. }) = SamplerCore::with_database(db.clone(), rtj.clone())
    else {
        panic!("expected a config error")
    };
    assert!(what.contains("no task with weight > 0"), "{what}");
    // Plain contexts need no window.
    let plain = SamplerConfig {
        examples: false,
        ..cfg(true)
    };
    assert!(SamplerCore::with_database(db, plain).is_ok());
    // With a window the recipe keeps the task.
    let tmp2 = scratch_dir();
    let db2 = write_db(&tmp2.path().join("db"), true);
    assert!(SamplerCore::with_database(db2, rtj).is_ok());
}

#[test]
fn a_window_is_stored_and_set_on_query_tasks_only() {
    let tmp = scratch_dir();
    let db = write_db(&tmp.path().join("db"), true);
    let m = db.metadata();
    assert_eq!(m.tasks[0].window_us, Some(WINDOW));
    let task = db.task(0).unwrap();
    assert!(matches!(task.targets, ColumnValues::Boolean(_)));
    let mut w = DatabaseWriter::new(tmp.path().join("db2"), "t", "hash", 4).unwrap();
    let e = w.set_window("nope", DAY).unwrap_err().to_string();
    assert!(e.contains("`nope`") && e.contains("no query task"), "{e}");
}

/// Stored rankings (`expected_store`) are keyed by (seed row, time bound)
/// for a forecast task too, and map rows to items as the live ranker does:
/// the batches equal the live `expected` ranker's.
#[test]
fn stored_rankings_give_a_forecast_task_the_live_batches() {
    use headwater::config::ExampleRanker;
    use headwater::sampler::MadeBatch;

    use crate::oracle::same_batch;

    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    let db = write_db(&dir, true);
    let run = |store: bool| -> Vec<MadeBatch> {
        let c = SamplerConfig {
            num_walks: 500,
            example_ranker: ExampleRanker::Expected,
            expected_store: store,
            ..cfg(true)
        };
        let core = SamplerCore::with_database(db.clone(), c).unwrap();
        let mut mk = BatchMaker::new(Arc::new(core), Split::Train);
        (0..4).map(|_| mk.next().unwrap().unwrap()).collect()
    };
    let live = run(false);
    let stored = run(true);
    assert!(dir.join("rankings").is_dir(), "no store written");
    let examples: u32 = live
        .iter()
        .flat_map(|b| b.readings.seqs.iter().map(|s| s.examples))
        .sum();
    assert!(examples > 0);
    for (a, mut b) in live.into_iter().zip(stored) {
        for (x, y) in b.readings.seqs.iter_mut().zip(&a.readings.seqs) {
            x.walk_steps = y.walk_steps;
        }
        assert!(
            same_batch(&a, &b),
            "the stored batches differ from the live ones"
        );
    }
}

/// An evaluation pass gives a forecast task at weight 0 its examples, as
/// it does a cell task at weight 0.
#[test]
fn an_evaluation_pass_gives_a_forecast_task_at_weight_0_its_examples() {
    use std::collections::BTreeMap;

    use headwater::config::TaskWeights;
    use headwater::sampler::EvalPass;

    let tmp = scratch_dir();
    let db = write_db_with(&tmp.path().join("db"), true, true);
    let c = SamplerConfig {
        task_weights: Some(TaskWeights::ByName(BTreeMap::from([(
            "will_buy".to_string(),
            0.0,
        )]))),
        ..cfg(true)
    };
    let core = Arc::new(SamplerCore::with_database(db, c).unwrap());
    let (mut seen, mut examples) = (0, 0);
    // Every val seed: the first ones are observed before any window closed.
    for b in EvalPass::new(core, Split::Val, Some(0), None).unwrap() {
        let b = b.unwrap();
        if b.task_idx == 0 {
            seen += 1;
            examples += b.readings.seqs.iter().map(|s| s.examples).sum::<u32>();
            assert!(b.readings.seqs.iter().all(|s| s.label_leaks == 0));
        }
    }
    assert!(
        seen > 0 && examples > 0,
        "{seen} batches, {examples} examples"
    );
}
