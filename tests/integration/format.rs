//! The golden v1 and v2 databases keep opening with the same content, and
//! every kind of damage is a clear error naming the file, never a panic.

use std::fs;

use headwater::format::{bit, verify_database, ColumnValues, Database, EmbeddingKind, Verify};
use headwater::Error;

use crate::support::{expected_v1, expected_v2, golden_copy, golden_v1, golden_v2};

fn table_idx(db: &Database, name: &str) -> usize {
    db.metadata()
        .tables
        .iter()
        .position(|t| t.name == name)
        .unwrap()
}

fn column<'a>(db: &'a Database, table: &str, col: &str) -> (u32, ColumnValues<'a>, Vec<bool>) {
    let t = table_idx(db, table);
    let view = db.table(t).unwrap();
    let c = view
        .columns
        .iter()
        .find(|c| db.metadata().columns[c.column_idx as usize].name == col)
        .unwrap();
    let valid = (0..view.num_rows as usize).map(|i| c.is_valid(i)).collect();
    (c.column_idx, c.values, valid)
}

#[test]
fn golden_v1_opens_and_matches_its_source() {
    golden_opens_and_matches_its_source(&golden_v1(), &expected_v1());
}

#[test]
fn golden_v2_opens_and_matches_its_source() {
    golden_opens_and_matches_its_source(&golden_v2(), &expected_v2());
    let db = Database::open(golden_v2()).unwrap();
    for rel in db.metadata().files.keys() {
        let b = fs::read(golden_v2().join(rel)).unwrap();
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 2, "{rel}");
    }
}

fn golden_opens_and_matches_its_source(dir: &std::path::Path, exp: &serde_json::Value) {
    let db = Database::open(dir).expect("golden database must keep opening");
    let m = db.metadata();
    assert_eq!(
        m.format_version,
        exp["format_version"].as_u64().unwrap() as u32
    );
    let names: Vec<&str> = m.tables.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        exp["tables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect::<Vec<_>>()
    );
    assert_eq!(m.num_rows, exp["num_rows"].as_u64().unwrap());

    // Foreign keys: each event's parents, as global rows.
    let g = db.graph();
    let ev = &m.tables[table_idx(&db, "events")];
    let users_off = m.tables[table_idx(&db, "users")].row_offset as u32;
    let items_off = m.tables[table_idx(&db, "items")].row_offset as u32;
    for (i, pair) in exp["event_parents"].as_array().unwrap().iter().enumerate() {
        let mut want = vec![];
        if let Some(u) = pair[0].as_u64() {
            want.push(users_off + u as u32);
        }
        if let Some(it) = pair[1].as_u64() {
            want.push(items_off + it as u32);
        }
        assert_eq!(
            g.parents(ev.row_offset as u32 + i as u32),
            &want[..],
            "event row {i}"
        );
    }
    // The dangling user 9 was counted, not linked.
    assert_eq!(
        ev.foreign_keys
            .iter()
            .find(|f| f.column == "user_id")
            .unwrap()
            .num_dangling,
        1
    );
    // Reverse edges are the transpose, children sorted by time.
    let mut rev_count = 0;
    for p in 0..m.num_rows as u32 {
        let (kids, times) = g.children(p);
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        for (&c, &t) in kids.iter().zip(times) {
            assert!(g.parents(c).contains(&p));
            assert_eq!(t, g.row_time[c as usize]);
        }
        rev_count += kids.len();
    }
    assert_eq!(rev_count as u64, m.num_edges);

    // Numerical: z-scored with the column's stats.
    let (ci, vals, valid) = column(&db, "users", "age");
    let st = &m.columns[ci as usize].stats;
    let ColumnValues::Numerical(x) = vals else {
        panic!("age is numerical")
    };
    for (i, e) in exp["users_age"].as_array().unwrap().iter().enumerate() {
        match e.as_f64() {
            Some(v) => {
                assert!(valid[i]);
                assert!(
                    (x[i] as f64 * st.std + st.mean - v).abs() < 1e-4,
                    "age row {i}"
                );
            }
            None => assert!(!valid[i] && x[i] == 0.0),
        }
    }
    let (_, vals, valid) = column(&db, "users", "active");
    let ColumnValues::Boolean(b) = vals else {
        panic!("active is boolean")
    };
    for (i, e) in exp["users_active"].as_array().unwrap().iter().enumerate() {
        assert_eq!(e.as_bool(), valid[i].then_some(b[i] == 1), "active row {i}");
    }
    let (ci, vals, valid) = column(&db, "users", "tier");
    let cm = &m.columns[ci as usize];
    let ColumnValues::Categorical(codes) = vals else {
        panic!("tier is categorical")
    };
    for (i, e) in exp["users_tier"].as_array().unwrap().iter().enumerate() {
        let got = valid[i].then(|| cm.categories[(codes[i] - cm.cat_emb_start) as usize].as_str());
        assert_eq!(got, e.as_str(), "tier row {i}");
    }
    let (_, vals, _) = column(&db, "items", "title");
    let ColumnValues::Text(ids) = vals else {
        panic!("title is text")
    };
    for (i, e) in exp["items_title"].as_array().unwrap().iter().enumerate() {
        assert_eq!(
            db.embedded_string(EmbeddingKind::Text, ids[i] as usize)
                .unwrap(),
            e.as_str().unwrap()
        );
    }
    // Duplicate text values share one embedding.
    assert_eq!(ids[0], ids[2]);
    let (_, vals, valid) = column(&db, "events", "ts");
    let ColumnValues::Timestamp(ts) = vals else {
        panic!("ts is timestamp")
    };
    for (i, e) in exp["events_ts_us"].as_array().unwrap().iter().enumerate() {
        assert_eq!(e.as_i64(), valid[i].then_some(ts[i]), "ts row {i}");
        assert_eq!(
            g.row_time[ev.row_offset as usize + i],
            e.as_i64().unwrap_or(i64::MIN)
        );
    }

    // Tasks.
    let task_names: Vec<&str> = m.tasks.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        task_names,
        exp["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect::<Vec<_>>()
    );
    let k = m.task_by_name("event_amount_next").unwrap();
    let tv = db.task(k.idx as usize).unwrap();
    let target = &m.columns[k.target_column as usize];
    assert!(target.slot.is_none(), "SQL targets are virtual columns");
    let ColumnValues::Numerical(y) = tv.targets else {
        panic!("numerical task")
    };
    for (i, e) in exp["event_amount_next_targets"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let got =
            bit(tv.target_validity, i).then(|| y[i] as f64 * target.stats.std + target.stats.mean);
        match (got, e.as_f64()) {
            (Some(a), Some(b)) => assert!((a - b).abs() < 1e-3),
            (a, b) => assert_eq!(a.is_some(), b.is_some(), "target row {i}"),
        }
        assert_eq!(tv.anchor_rows[i], ev.row_offset as u32 + i as u32);
    }
    // Embedding tables have the recorded shapes.
    let d = m.embedder.dim as usize;
    assert_eq!(db.column_embeddings().unwrap().len(), m.columns.len() * d);
    assert_eq!(
        db.text_embeddings().unwrap().len(),
        m.num_text_embeddings as usize * d
    );
}

fn open_err(dir: &std::path::Path) -> Error {
    match Database::open_with(dir, Verify::Full) {
        Ok(_) => panic!("damaged database opened"),
        Err(e) => e,
    }
}

#[test]
fn truncated_file_names_the_file() {
    let (_tmp, dir) = golden_copy();
    let p = dir.join("graph.bin");
    let len = fs::metadata(&p).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let e = open_err(&dir).to_string();
    assert!(e.contains("graph.bin") && e.contains("truncated"), "{e}");
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(20)
        .unwrap();
    let e = open_err(&dir).to_string();
    assert!(
        e.contains("graph.bin") && e.contains("shorter than the 48-byte header"),
        "{e}"
    );
}

#[test]
fn flipped_payload_byte_is_a_checksum_error() {
    let (_tmp, dir) = golden_copy();
    let p = dir.join("tables/2.bin");
    let mut b = fs::read(&p).unwrap();
    let mid = b.len() - 40;
    b[mid] ^= 0x20;
    fs::write(&p, &b).unwrap();
    // A plain open reads no payload byte, so it does not notice ...
    Database::open(&dir).expect("header-only open ignores payload bytes");
    // ... `headwater verify` names the file and reads every payload byte ...
    let mut last = (0, 0);
    let report = verify_database(&dir, &mut |done, total| last = (done, total)).unwrap();
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    assert!(
        report.errors[0].contains("tables/2.bin"),
        "{:?}",
        report.errors
    );
    assert_eq!(
        last,
        (report.bytes, report.bytes),
        "progress reaches the total"
    );
    assert_eq!(report.files, 9);
    // ... and so does `verify="full"`.
    let e = open_err(&dir);
    assert!(matches!(e, Error::Format { .. }));
    let e = e.to_string();
    assert!(
        e.contains("tables/2.bin") && e.contains("payload checksum mismatch"),
        "{e}"
    );
}

#[test]
fn flipped_header_byte_is_a_header_error() {
    let (_tmp, dir) = golden_copy();
    let p = dir.join("tasks/0.bin");
    let mut b = fs::read(&p).unwrap();
    b[50] ^= 1; // inside the section table
    fs::write(&p, &b).unwrap();
    let e = open_err(&dir).to_string();
    assert!(
        e.contains("tasks/0.bin") && e.contains("header checksum"),
        "{e}"
    );
}

#[test]
fn every_single_byte_flip_is_caught_without_panic() {
    let (_tmp, dir) = golden_copy();
    for rel in [
        "graph.bin",
        "tables/0.bin",
        "tasks/1.bin",
        "categorical_embeddings.bin",
    ] {
        let p = dir.join(rel);
        let orig = fs::read(&p).unwrap();
        for i in 0..orig.len() {
            let mut b = orig.clone();
            b[i] ^= 0x5a;
            fs::write(&p, &b).unwrap();
            let r = std::panic::catch_unwind(|| Database::open_with(&dir, Verify::Full));
            match r {
                Ok(Err(Error::Format { file, .. })) => {
                    assert!(file.ends_with(rel), "{rel}@{i}: blamed {file:?}");
                }
                Ok(Err(Error::Version { .. })) => assert!((8..12).contains(&i), "{rel}@{i}"),
                Ok(Err(other)) => panic!("{rel}@{i}: unexpected error {other}"),
                Ok(Ok(_)) => panic!("{rel}@{i}: flipped byte went unnoticed"),
                Err(p) => panic!("{rel}@{i}: panicked: {:?}", p.downcast_ref::<String>()),
            }
        }
        fs::write(&p, &orig).unwrap();
    }
    Database::open(&dir).expect("restored copy opens");
}

#[test]
fn unsupported_format_version_is_named() {
    let (_tmp, dir) = golden_copy();
    let p = dir.join("metadata.json");
    let s = fs::read_to_string(&p).unwrap().replacen(
        "\"format_version\": 1",
        "\"format_version\": 99",
        1,
    );
    fs::write(&p, s).unwrap();
    let e = open_err(&dir);
    assert!(matches!(e, Error::Version { found: 99, .. }), "{e}");
    assert!(e.to_string().contains("format version 99 is not supported"));
}

#[test]
fn edited_metadata_fails_the_content_hash() {
    let (_tmp, dir) = golden_copy();
    let p = dir.join("metadata.json");
    let s = fs::read_to_string(&p)
        .unwrap()
        .replacen("\"num_null\": 0", "\"num_null\": 7", 1);
    fs::write(&p, s).unwrap();
    let e = open_err(&dir).to_string();
    assert!(
        e.contains("metadata.json") && e.contains("content hash mismatch"),
        "{e}"
    );
}

#[test]
fn missing_and_swapped_files() {
    let (_tmp, dir) = golden_copy();
    fs::remove_file(dir.join("tasks/0.bin")).unwrap();
    match open_err(&dir) {
        Error::Io { path, source } => {
            assert!(path.ends_with("tasks/0.bin"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected a not-found error, got {other}"),
    }
    let (_tmp2, dir2) = golden_copy();
    fs::copy(dir2.join("tasks/1.bin"), dir2.join("tables/0.bin")).unwrap();
    let e = open_err(&dir2).to_string();
    assert!(
        e.contains("tables/0.bin") && e.contains("expected a Table file"),
        "{e}"
    );
    let (_tmp3, dir3) = golden_copy();
    fs::copy(dir3.join("tables/1.bin"), dir3.join("tables/0.bin")).unwrap();
    let e = open_err(&dir3).to_string();
    assert!(
        e.contains("tables/0.bin") && e.contains("does not belong to this snapshot"),
        "{e}"
    );
    assert!(matches!(
        Database::open(dir3.join("nope")),
        Err(Error::Io { .. })
    ));
}

/// The sampler skips the validity bitmap of a column whose metadata counts
/// no null (`ColumnView::all_valid`): that is only sound if the writer's
/// null count and its bitmap agree, bit for bit, on every column kind.
#[test]
fn the_null_count_is_the_bitmaps_zero_bits_on_every_column() {
    let mut checked = (0, 0);
    let dbs: Vec<(Option<crate::oracle::SynthDb>, Database)> =
        vec![(None, Database::open(golden_v1()).unwrap()), {
            let s = crate::oracle::build(&headwater::preprocess::SynthSpec::small(4, 300, 3))
                .expect("synthesizes");
            let db = Database::open(&s.dir).unwrap();
            (Some(s), db)
        }];
    for (_keep, db) in &dbs {
        let m = db.metadata();
        for t in 0..m.tables.len() {
            let view = db.table(t).unwrap();
            for c in &view.columns {
                let meta = &m.columns[c.column_idx as usize];
                let n = view.num_rows as usize;
                let zeros = (0..n).filter(|&r| !bit(c.validity, r)).count() as u64;
                assert_eq!(zeros, meta.stats.null_count, "column `{}`", meta.name);
                assert_eq!(c.all_valid, zeros == 0, "column `{}`", meta.name);
                if c.all_valid {
                    checked.0 += 1;
                } else {
                    checked.1 += 1;
                }
            }
        }
    }
    assert!(
        checked.0 > 0 && checked.1 > 0,
        "both kinds of column seen: {checked:?}"
    );
}
