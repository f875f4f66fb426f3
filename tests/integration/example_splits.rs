//! In-context examples respect the splits (docs/contexts.md, "Splits"): a
//! seed of split s shows the labels of examples whose split is at most s
//! in the order train < val < test, for every task kind. Checked from the
//! outside on a database whose labels name their row or item: over the
//! training stream and whole val and test passes, every visible example
//! label is read back from the batch tensors, looked up, and its split
//! (the hash rule for a cell task and a hash-split query task, the stored
//! codes for a query task that keeps its source's splits) compared with
//! the seed's. Later splits' labels are eligible by time (the stored codes
//! are mixed over time), so only the split rule keeps them out; each
//! split's seeds also show examples of their own split.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use headwater::format::{ColumnValues, Database, SemanticType};
use headwater::preprocess::{
    ColumnData, ColumnInput, DatabaseWriter, ForeignKeyInput, TableInput, TaskInput, TaskTarget,
};
use headwater::sampler::{BatchMaker, EvalPass, MadeBatch, SamplerCore};
use headwater::seeds::split_of;
use headwater::{SamplerConfig, Split};

use crate::oracle::scratch_dir;

const DAY: i64 = 86_400_000_000;
const USERS: usize = 90;
const EVENTS: usize = 900;
/// Observations per user of each query task, one every 10 days.
const STEPS: usize = 12;

fn numerical<'a>(name: &str, values: &'a [f64], valid: &'a [u8]) -> ColumnInput<'a> {
    ColumnInput {
        name: name.into(),
        stype: SemanticType::Numerical,
        source_type: "DOUBLE".into(),
        inferred: false,
        data: ColumnData::Numerical { values, valid },
    }
}

/// A numerical query task on users observed every 10 days (10-day
/// window), each item's label its own index; with `splits`, stored codes.
fn query_task<'a>(
    name: &str,
    anchors: &'a [u32],
    obs: &'a [i64],
    y: &'a [f64],
    valid: &'a [u8],
    splits: Option<&'a [u8]>,
) -> TaskInput<'a> {
    TaskInput {
        name: name.into(),
        kind: if splits.is_some() { "relbench" } else { "sql" }.into(),
        anchor_table: "users".into(),
        anchor_rows: anchors,
        obs_time: obs,
        target: TaskTarget::Values {
            stype: SemanticType::Numerical,
            data: ColumnData::Numerical { values: y, valid },
        },
        query: None,
        description: None,
        splits,
    }
}

/// Users (undated; `score` distinct per row, the cell task `users.score`),
/// their dated events, and two query tasks on users: `stored` with stored
/// split codes mixed over time, `hashed` under the hash rule.
fn write_db(dir: &Path) -> Arc<Database> {
    let mut w = DatabaseWriter::new(dir, "splits-test", "hash", 4).unwrap();
    let score: Vec<f64> = (0..USERS).map(|u| 3.0 * u as f64 + 1.0).collect();
    let ok_u = vec![1u8; USERS];
    w.add_table(TableInput {
        name: "users".into(),
        num_rows: USERS,
        primary_key: None,
        time_column: None,
        row_time: &[i64::MIN; USERS],
        columns: vec![numerical("score", &score, &ok_u)],
        foreign_keys: vec![],
        fingerprint: "users".into(),
    })
    .unwrap();
    let times: Vec<i64> = (0..EVENTS as i64).map(|e| e * DAY / 7).collect();
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
    let y: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let valid = vec![1u8; n];
    // Mixed over time and over each user's items: 60 % train.
    let codes: Vec<u8> = (0..n)
        .map(|i| [0, 1, 0, 2, 0][(i * 7 + i / 5) % 5])
        .collect();
    w.add_task(query_task(
        "stored",
        &anchors,
        &obs,
        &y,
        &valid,
        Some(&codes),
    ))
    .unwrap();
    w.add_task(query_task("hashed", &anchors, &obs, &y, &valid, None))
        .unwrap();
    for name in ["stored", "hashed"] {
        w.set_window(name, 10 * DAY).unwrap();
    }
    w.add_cell_task("users.score", "users", "score", None)
        .unwrap();
    let z = |n: usize| vec![half::f16::ZERO; n * 4];
    let (c, k, t) = (
        w.column_texts().len(),
        w.category_texts().len(),
        w.num_text_values(),
    );
    w.finish(&z(c), &z(k), &z(t), false).unwrap();
    Arc::new(Database::open(dir).unwrap())
}

fn cfg() -> SamplerConfig {
    SamplerConfig {
        default_batch_size: 16,
        default_sequence_length: 128,
        max_hops: 2,
        num_threads: Some(2),
        seed: 3,
        examples: true,
        local_context_sizes: vec![4, 8],
        bfs_widths: vec![2, 4],
        num_walks: 60,
        walk_length: 6,
        ..SamplerConfig::default()
    }
}

fn f32_values(v: ColumnValues<'_>) -> &[f32] {
    match v {
        ColumnValues::Numerical(v) => v,
        _ => panic!("a numerical column"),
    }
}

/// Per task: its label column's id and each stored label value's split.
struct Truth {
    column: Vec<i32>,
    split_of_label: Vec<HashMap<u32, Split>>,
}

fn truth(db: &Database, c: &SamplerConfig) -> Truth {
    let m = db.metadata();
    let (mut column, mut split_of_label) = (Vec::new(), Vec::new());
    for (k, km) in m.tasks.iter().enumerate() {
        column.push(km.target_column as i32);
        let task = db.task(k).unwrap();
        let hash = |row: u32| split_of(k as u32, row, c.split_seed, c.split_ratios);
        let mut map = HashMap::new();
        if km.kind == "cell" {
            // A cell task's labels are its anchor rows' cells.
            let users = db.table(km.anchor_table as usize).unwrap();
            let v = f32_values(users.columns[0].values);
            for (i, x) in v.iter().enumerate() {
                map.insert(x.to_bits(), hash(users.row_offset + i as u32));
            }
        } else {
            let v = f32_values(task.targets);
            for (j, x) in v.iter().enumerate() {
                let s = match task.splits {
                    Some(codes) => Split::from_code(codes[j]).unwrap(),
                    None => hash(task.anchor_rows[j]),
                };
                map.insert(x.to_bits(), s);
            }
            assert_eq!(map.len(), v.len(), "task {k}: labels not distinct");
        }
        split_of_label.push(map);
    }
    Truth {
        column,
        split_of_label,
    }
}

/// Count, into `seen[seed split][example split]`, every visible example
/// label of `b` (its seeds are of split `seed`).
fn tally(b: &MadeBatch, seed: Split, t: &Truth, seen: &mut [[u64; 3]; 3]) {
    let s = b.seq_len;
    for q in 0..b.seq_task_idx.len() {
        let k = b.seq_task_idx[q] as usize;
        for p in 1..s {
            let at = q * s + p;
            if b.is_padding[at] == 1 || b.is_null[at] == 1 || b.column_ids[at] != t.column[k] {
                continue;
            }
            let bits = b.numeric_values[at].to_bits();
            let Some(&ex) = t.split_of_label[k].get(&bits) else {
                panic!("task {k}: label {} is no label", b.numeric_values[at]);
            };
            assert!(
                ex <= seed,
                "task {k}: a {} seed shows a {} label as an example",
                seed.name(),
                ex.name()
            );
            seen[seed.index()][ex.index()] += 1;
        }
    }
}

#[test]
fn no_seed_shows_an_example_label_of_a_later_split() {
    let tmp = scratch_dir();
    let db = write_db(&tmp.path().join("db"));
    assert_eq!(db.metadata().tasks.len(), 3);
    let c = cfg();
    let t = truth(&db, &c);
    let core = Arc::new(SamplerCore::with_database(db, c).unwrap());
    // Per task: [seed split][example split].
    let mut seen = vec![[[0u64; 3]; 3]; 3];
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    for _ in 0..60 {
        let b = mk.next().unwrap().unwrap();
        tally(&b, Split::Train, &t, &mut seen[b.task_idx as usize]);
    }
    for split in [Split::Val, Split::Test] {
        for b in EvalPass::new(core.clone(), split, None, None).unwrap() {
            let b = b.unwrap();
            tally(&b, split, &t, &mut seen[b.task_idx as usize]);
        }
    }
    for (k, s) in seen.iter().enumerate() {
        // Each split's seeds see examples of their own split.
        for i in 0..3 {
            assert!(s[i][i] > 0, "task {k}: {s:?}");
        }
        assert!(s[2][0] > 0 && s[2][1] > 0, "task {k}: {s:?}");
    }
}
