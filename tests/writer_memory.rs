//! The writer encodes each column into its file a chunk at a time: adding a
//! column of n rows allocates a bounded buffer, not a second copy of the
//! column (4-8 bytes per row: gigabytes for a table of 10^9 rows). Its own
//! test binary, so that a counting global allocator sees only this test's
//! allocations. (The Python binding, which sets its own global allocator,
//! is another crate: `crates/python`.)

// Tests spell out their cases in line; the 80-line bound on functions
// (clippy.toml) is for the library.
#![allow(clippy::too_many_lines)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use headwater::format::{bit, ColumnValues, Database, SemanticType};
use headwater::preprocess::{
    ColumnData, ColumnInput, DatabaseWriter, TableSpec, TaskInput, TaskTarget,
};

const MIB: usize = 1 << 20;

/// Bytes allocated now, and the most since the last [`reset_peak`].
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        System.dealloc(ptr, layout);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Held for the whole of each test: the harness runs tests in parallel,
/// and one test's allocations would count in another's measurement.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Bytes allocated at the peak of `f` beyond what was live when it began.
fn peak_growth(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    f();
    PEAK.load(Relaxed) - base
}

#[test]
fn columns_are_encoded_into_the_file_without_a_whole_column_copy() {
    let _one = one_at_a_time();
    // Not a multiple of the chunk (2^16 rows) nor of 8: the last chunk and
    // the last validity byte are partial.
    let n = (4 << 20) + 13;
    let xs: Vec<f64> = (0..n)
        .map(|i| {
            if i % 1001 == 7 {
                f64::NAN
            } else {
                (i % 977) as f64
            }
        })
        .collect();
    let ts: Vec<i64> = (0..n).map(|i| 1_000_000 * (i as i64 % 5003)).collect();
    let codes: Vec<u32> = (0..n).map(|i| (i % 3) as u32).collect();
    let valid: Vec<u8> = (0..n).map(|i| (i % 11 != 3) as u8).collect();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("db");
    let mut w = DatabaseWriter::new(&out, "memory-test", "hash", 4).unwrap();
    w.begin_table(TableSpec {
        name: "t".into(),
        num_rows: n,
        primary_key: None,
        time_column: None,
        fingerprint: "t-v1".into(),
        num_stored: 4,
    })
    .unwrap();
    let texts = ["a", "bb", "ccc"].concat();
    let ids = w.intern_texts(&[0, 1, 3, 6], texts.as_bytes()).unwrap();
    let text_ids: Vec<u32> = codes.iter().map(|&c| ids[c as usize]).collect();
    let col = |name: &str, stype, data| ColumnInput {
        name: name.into(),
        stype,
        source_type: "test".into(),
        inferred: false,
        data,
    };
    let columns = [
        col(
            "x",
            SemanticType::Numerical,
            ColumnData::Numerical {
                values: &xs,
                valid: &valid,
            },
        ),
        col(
            "when",
            SemanticType::Timestamp,
            ColumnData::Timestamp {
                values: &ts,
                valid: &valid,
            },
        ),
        col(
            "kind",
            SemanticType::Categorical,
            ColumnData::Categorical {
                codes: &codes,
                valid: &valid,
                categories: vec!["p".into(), "q".into(), "r".into()],
            },
        ),
        col(
            "note",
            SemanticType::Text,
            ColumnData::TextIds {
                ids: &text_ids,
                valid: &valid,
            },
        ),
    ];
    for c in columns {
        let name = c.name.clone();
        let grown = peak_growth(|| w.add_column(c).unwrap());
        assert!(
            grown < 2 * MIB,
            "adding column `{name}` of {n} rows allocated {:.1} MiB at its peak",
            grown as f64 / MIB as f64
        );
    }
    let row_time = vec![i64::MIN; n];
    w.end_table(&row_time, &[]).unwrap();
    // A declared task's rows (anchors, targets) are streamed the same way.
    let anchors: Vec<u32> = (0..n as u32).rev().collect();
    let obs = vec![i64::MAX; n];
    let flags: Vec<u8> = (0..n).map(|i| (i % 3 == 0) as u8).collect();
    let task = TaskInput {
        name: "flag".into(),
        kind: "sql".into(),
        anchor_table: "t".into(),
        anchor_rows: &anchors,
        obs_time: &obs,
        target: TaskTarget::Values {
            stype: SemanticType::Boolean,
            data: ColumnData::Boolean {
                values: &flags,
                valid: &valid,
            },
        },
        query: None,
        description: None,
        splits: None,
    };
    let grown = peak_growth(|| w.add_task(task).unwrap());
    assert!(
        grown < 2 * MIB,
        "adding a task of {n} rows allocated {:.1} MiB at its peak",
        grown as f64 / MIB as f64
    );
    let z = |k: usize| vec![half::f16::ZERO; k * 4];
    let (c, k, t) = (
        w.column_texts().len(),
        w.category_texts().len(),
        w.num_text_values(),
    );
    w.finish(&z(c), &z(k), &z(t), false).unwrap();

    // What was streamed is what a whole-column encoding writes.
    let db = Database::open(&out).unwrap();
    let view = db.table(0).unwrap();
    let good: Vec<f64> = (0..n)
        .filter(|&i| valid[i] != 0 && xs[i].is_finite())
        .map(|i| xs[i])
        .collect();
    let mean = good.iter().sum::<f64>() / good.len() as f64;
    let std = (good.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / good.len() as f64).sqrt();
    let probe = [0, 3, 7, 65_535, 65_536, 65_543, n - 14, n - 9, n - 1];
    for cv in &view.columns {
        for &i in &probe {
            let ok = valid[i] != 0;
            match cv.values {
                ColumnValues::Numerical(v) => {
                    let want = ok && xs[i].is_finite();
                    assert_eq!(cv.is_valid(i), want, "x validity at row {i}");
                    let expect = if want {
                        ((xs[i] - mean) / std) as f32
                    } else {
                        0.0
                    };
                    assert!((v[i] - expect).abs() < 1e-4, "x at row {i}: {}", v[i]);
                }
                ColumnValues::Timestamp(v) => {
                    assert_eq!(cv.is_valid(i), ok);
                    assert_eq!(v[i], if ok { ts[i] } else { 0 }, "when at row {i}");
                }
                ColumnValues::Categorical(v) => {
                    assert_eq!(cv.is_valid(i), ok);
                    assert_eq!(v[i], if ok { codes[i] } else { 0 }, "kind at row {i}");
                }
                ColumnValues::Text(v) => {
                    assert_eq!(cv.is_valid(i), ok);
                    assert_eq!(v[i], if ok { text_ids[i] } else { 0 }, "note at row {i}");
                }
                ColumnValues::Boolean(_) => unreachable!("no boolean column"),
            }
        }
        let len = match cv.values {
            ColumnValues::Numerical(v) => v.len(),
            ColumnValues::Timestamp(v) => v.len(),
            ColumnValues::Categorical(v) | ColumnValues::Text(v) => v.len(),
            ColumnValues::Boolean(v) => v.len(),
        };
        assert_eq!(len, n);
        let nulls = (0..n).filter(|&i| !cv.is_valid(i)).count() as u64;
        let meta = &db.metadata().columns[cv.column_idx as usize];
        assert_eq!(meta.stats.null_count, nulls, "{} null count", meta.name);
    }
    let m = db.metadata();
    let tv = db
        .task(m.task_by_name("flag").unwrap().idx as usize)
        .unwrap();
    for &i in &probe {
        assert_eq!(tv.anchor_rows[i], (n - 1 - i) as u32, "anchor of seed {i}");
        let ok = valid[i] != 0;
        assert_eq!(
            bit(tv.target_validity, i),
            ok,
            "target validity of seed {i}"
        );
        let ColumnValues::Boolean(v) = tv.targets else {
            panic!("a boolean target")
        };
        assert_eq!(v[i], (ok && i % 3 == 0) as u8, "target of seed {i}");
    }
}

#[test]
fn distinct_texts_are_kept_in_scratch_files_not_in_private_memory() {
    let _one = one_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("db");
    let mut w = DatabaseWriter::new(&out, "memory-test", "hash", 4).unwrap();
    w.begin_table(TableSpec {
        name: "t".into(),
        num_rows: 0,
        primary_key: None,
        time_column: None,
        fingerprint: "t-v1".into(),
        num_stored: 0,
    })
    .unwrap();
    // 2 M distinct values of 20-27 bytes in chunks of 64 Ki, as a text
    // column's chunks arrive: about 80 MiB of arena, offsets and index.
    let (chunks, per) = (32usize, 1usize << 16);
    let mut bytes = Vec::new();
    let mut offsets = vec![0i64];
    let grown = peak_growth(|| {
        for c in 0..chunks {
            bytes.clear();
            offsets.truncate(1);
            for i in 0..per {
                bytes.extend_from_slice(format!("value number {}", c * per + i).as_bytes());
                offsets.push(bytes.len() as i64);
            }
            let ids = w.intern_texts(&offsets, &bytes).unwrap();
            assert_eq!(ids[per - 1] as usize, (c + 1) * per - 1);
        }
    });
    assert_eq!(w.num_text_values(), chunks * per);
    assert!(
        grown < 8 * MIB,
        "interning {} distinct texts allocated {:.1} MiB at its peak",
        chunks * per,
        grown as f64 / MIB as f64
    );
    let some: Vec<&str> = w.text_values(70_000, 70_002).collect();
    assert_eq!(some, ["value number 70000", "value number 70001"]);
}
