//! Statistics from the past only: a shift planted in the scored period
//! (rows dated after the validation cutoff, a task's val/test labels) moves
//! no statistic of a database written with the cutoff, while it moves those
//! of one written without; every row is still normalised with them. Older
//! databases, without the rule, still open.

use headwater::format::{ColumnStats, ColumnValues, Database, Metadata, SemanticType, Split};
use headwater::preprocess::{
    ColumnData, ColumnInput, DatabaseWriter, TableInput, TableSpec, TaskInput, TaskTarget,
};
use headwater::seeds::split_of;
use headwater::SamplerConfig;

use crate::support;

const DAY_US: i64 = 86_400_000_000;
const ROWS: usize = 240;
/// Rows `0..PAST` are dated at or before the cutoff, the rest after it.
const PAST: usize = 180;
const CUTOFF: i64 = (PAST as i64 - 1) * DAY_US;
/// What the scored period's values are shifted by.
const SHIFT: f64 = 1000.0;

/// The source: per row a time (one a day), a value and a timestamp value;
/// `shift` adds [`SHIFT`] to the values (and days to the timestamps) of
/// every row after the cutoff.
struct Source {
    times: Vec<i64>,
    x: Vec<f64>,
    stamp: Vec<i64>,
}

impl Source {
    fn new(shift: bool) -> Self {
        let times: Vec<i64> = (0..ROWS as i64).map(|i| i * DAY_US).collect();
        let after = |i: usize| shift && i >= PAST;
        let x = (0..ROWS)
            .map(|i| ((i * 37) % 101) as f64 * 0.5 + if after(i) { SHIFT } else { 0.0 })
            .collect();
        let stamp = (0..ROWS)
            .map(|i| times[i] + if after(i) { 1000 * DAY_US } else { 0 })
            .collect();
        Source { times, x, stamp }
    }
}

/// A task's target per seed (one seed per row): the row's index, shifted
/// where `scored` says the seed is (when `shift`).
fn labels(shift: bool, scored: impl Fn(usize) -> bool) -> Vec<f64> {
    (0..ROWS)
        .map(|i| i as f64 + if shift && scored(i) { SHIFT } else { 0.0 })
        .collect()
}

fn numerical<'a>(name: &str, values: &'a [f64], valid: &'a [u8]) -> ColumnInput<'a> {
    ColumnInput {
        name: name.into(),
        stype: SemanticType::Numerical,
        source_type: "DOUBLE".into(),
        inferred: false,
        data: ColumnData::Numerical { values, valid },
    }
}

fn task<'a>(
    name: &str,
    anchors: &'a [u32],
    obs: &'a [i64],
    labels: &'a [f64],
    valid: &'a [u8],
    splits: Option<&'a [u8]>,
) -> TaskInput<'a> {
    TaskInput {
        name: name.into(),
        kind: "sql".into(),
        anchor_table: "events".into(),
        anchor_rows: anchors,
        obs_time: obs,
        target: TaskTarget::Values {
            stype: SemanticType::Numerical,
            data: ColumnData::Numerical {
                values: labels,
                valid,
            },
        },
        query: None,
        description: None,
        splits,
    }
}

/// The stored split of seed `i` of the stored-split task: a third each.
fn stored_code(i: usize) -> u8 {
    (i % 3) as u8
}

/// Is seed `i` (anchor row `i`) of task `k` a val/test seed under the
/// sampler's default hash split? The events table's rows are global 0..
fn hash_scored(k: u32, i: usize) -> bool {
    let c = SamplerConfig::default();
    split_of(k, i as u32, c.split_seed, c.split_ratios) != Split::Train
}

/// Build the database of `src` (tasks shifted too when `shift`), with the
/// cutoff or without; its metadata.
fn build(dir: &std::path::Path, src: &Source, shift: bool, cutoff: Option<i64>) -> Metadata {
    let mut w = DatabaseWriter::new(dir, "past-stats-test", "hash", 4).unwrap();
    if let Some(c) = cutoff {
        w.set_stats_cutoff(c).unwrap();
    }
    let ok = vec![1u8; ROWS];
    w.add_table(TableInput {
        name: "events".into(),
        num_rows: ROWS,
        primary_key: None,
        time_column: Some("t".into()),
        row_time: &src.times,
        columns: vec![
            numerical("x", &src.x, &ok),
            ColumnInput {
                name: "stamp".into(),
                stype: SemanticType::Timestamp,
                source_type: "TIMESTAMP".into(),
                inferred: false,
                data: ColumnData::Timestamp {
                    values: &src.stamp,
                    valid: &ok,
                },
            },
        ],
        foreign_keys: vec![],
        fingerprint: "events".into(),
    })
    .unwrap();
    // Task 0: hash split, all seeds before the cutoff, val/test labels
    // shifted. Task 1: stored split, its val/test labels shifted.
    let anchors: Vec<u32> = (0..ROWS as u32).collect();
    let early = vec![0i64; ROWS];
    let hashed = labels(shift, |i| hash_scored(0, i));
    w.add_task(task("hashed", &anchors, &early, &hashed, &ok, None))
        .unwrap();
    let codes: Vec<u8> = (0..ROWS).map(stored_code).collect();
    let stored = labels(shift, |i| stored_code(i) != 0);
    w.add_task(task("stored", &anchors, &early, &stored, &ok, Some(&codes)))
        .unwrap();
    // Task 2: hash split, observed at the rows' times; the labels of seeds
    // after the cutoff shifted.
    let late = labels(shift, |i| i >= PAST);
    w.add_task(task("timed", &anchors, &src.times, &late, &ok, None))
        .unwrap();
    let z = |n: usize| vec![half::f16::ZERO; n * 4];
    let (c, k, t) = (
        w.column_texts().len(),
        w.category_texts().len(),
        w.num_text_values(),
    );
    w.finish(&z(c), &z(k), &z(t), false).unwrap()
}

fn stats<'m>(m: &'m Metadata, name: &str) -> &'m ColumnStats {
    &m.columns.iter().find(|c| c.name == name).unwrap().stats
}

/// Mean, std, min, max and the number of values they came from.
fn value_stats(s: &ColumnStats) -> [f64; 5] {
    [
        s.mean,
        s.std,
        s.min,
        s.max,
        s.stats_count.unwrap_or(s.count) as f64,
    ]
}

/// Population mean and std of `xs`, for the expected statistics.
fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn a_shift_after_the_cutoff_moves_no_statistic() {
    let tmp = tempfile::tempdir().unwrap();
    let (plain, shifted) = (Source::new(false), Source::new(true));
    let db = |name: &str, src: &Source, shift: bool, cutoff: Option<i64>| {
        build(&tmp.path().join(name), src, shift, cutoff)
    };
    // Today's rule (every row) moves with the shift; the cutoff's does not.
    let (all_a, all_b) = (
        db("all_a", &plain, false, None),
        db("all_b", &shifted, true, None),
    );
    let (past_a, past_b) = (
        db("past_a", &plain, false, Some(CUTOFF)),
        db("past_b", &shifted, true, Some(CUTOFF)),
    );
    for col in ["x", "stamp", "timed"] {
        assert_ne!(
            value_stats(stats(&all_a, col)),
            value_stats(stats(&all_b, col)),
            "{col}: without a cutoff the scored period moves the statistics"
        );
        assert_eq!(
            value_stats(stats(&past_a, col)),
            value_stats(stats(&past_b, col)),
            "{col}: with the cutoff no value of the scored period is in any statistic"
        );
    }
    // Hash and stored splits leave the val/test labels out even without a
    // cutoff.
    for col in ["hashed", "stored"] {
        assert_eq!(
            value_stats(stats(&all_a, col)),
            value_stats(stats(&all_b, col)),
            "{col}: no val/test label is in the target's statistics"
        );
    }
    assert_eq!(past_a.timestamp_stats, past_b.timestamp_stats);
    assert_ne!(all_a.timestamp_stats, all_b.timestamp_stats);
    // The statistics are those of the rows up to the cutoff; the counts
    // still cover every row.
    let x = stats(&past_b, "x");
    let (mean, std) = mean_std(&shifted.x[..PAST]);
    assert!((x.mean - mean).abs() < 1e-9 && (x.std - std).abs() < 1e-9);
    assert_eq!((x.count, x.stats_count), (ROWS as u64, Some(PAST as u64)));
    let train: Vec<f64> = (0..ROWS)
        .filter(|&i| !hash_scored(0, i))
        .map(|i| i as f64)
        .collect();
    let hashed = stats(&past_b, "hashed");
    assert_eq!(hashed.stats_count, Some(train.len() as u64));
    assert!((hashed.mean - mean_std(&train).0).abs() < 1e-9);
    let rule = past_b.stats_rule.as_ref().unwrap();
    assert_eq!(rule.cutoff_us, Some(CUTOFF));
    // A run with the default split scores none of the labels the hash-split
    // targets' statistics saw; one with another split seed is told which.
    let c = SamplerConfig::default();
    assert!(past_b
        .targets_split_otherwise(c.split_seed, c.split_ratios)
        .is_empty());
    assert_eq!(
        past_b.targets_split_otherwise(c.split_seed + 1, c.split_ratios),
        ["hashed", "timed"]
    );
    assert_eq!(all_b.stats_rule.as_ref().unwrap().cutoff_us, None);
    // Every row is still normalised, with the past's statistics.
    let d = Database::open(tmp.path().join("past_b")).unwrap();
    let table = d.table(0).unwrap();
    let ColumnValues::Numerical(z) = table.columns[0].values else {
        panic!("x is numerical")
    };
    for (i, (&zi, &xi)) in z.iter().zip(&shifted.x).enumerate() {
        let back = zi as f64 * x.std + x.mean;
        assert!((back - xi).abs() < 1e-3 * xi.abs().max(1.0), "row {i}");
    }
}

#[test]
fn the_cutoff_needs_row_times_before_the_columns_and_before_the_tables() {
    let tmp = tempfile::tempdir().unwrap();
    let src = Source::new(false);
    let ok = vec![1u8; ROWS];
    let spec = || TableSpec {
        name: "events".into(),
        num_rows: ROWS,
        primary_key: None,
        time_column: Some("t".into()),
        fingerprint: "events".into(),
        num_stored: 1,
    };
    let mut w = DatabaseWriter::new(tmp.path().join("db"), "t", "hash", 4).unwrap();
    w.set_stats_cutoff(CUTOFF).unwrap();
    w.begin_table(spec()).unwrap();
    let err = w.add_column(numerical("x", &src.x, &ok)).unwrap_err();
    assert!(err.to_string().contains("set_row_times"), "{err}");
    w.begin_table(spec()).unwrap();
    w.set_row_times(&src.times).unwrap();
    w.add_column(numerical("x", &src.x, &ok)).unwrap();
    let moved: Vec<i64> = src.times.iter().map(|t| t + 1000 * DAY_US).collect();
    let err = w.end_table(&moved, &[]).unwrap_err();
    assert!(err.to_string().contains("differ"), "{err}");
    let mut w = DatabaseWriter::new(tmp.path().join("db2"), "t", "hash", 4).unwrap();
    w.begin_table(spec()).unwrap();
    let err = w.set_stats_cutoff(CUTOFF).unwrap_err();
    assert!(err.to_string().contains("before the first table"), "{err}");
}

#[test]
fn databases_written_before_the_rule_open_without_it() {
    for dir in [support::golden_v1(), support::golden_v2()] {
        let d = Database::open(&dir).unwrap();
        let m = d.metadata();
        assert!(m.stats_rule.is_none(), "{}", dir.display());
        assert!(m.targets_split_otherwise(7, [0.5, 0.25, 0.25]).is_empty());
        assert!(m.columns.iter().all(|c| c.stats.stats_count.is_none()));
    }
}
