//! The writer driven from Rust: a database built without Python opens, and
//! the output appears only when complete.

use headwater::format::{Database, SemanticType};
use headwater::preprocess::{
    ColumnData, ColumnInput, DatabaseWriter, ForeignKeyInput, TableInput, TableSpec, TaskInput,
    TaskTarget,
};
use headwater::Error;

fn parents_table<'a>(
    name: &str,
    n: usize,
    row_time: &'a [i64],
    values: &'a [f64],
    valid: &'a [u8],
) -> TableInput<'a> {
    TableInput {
        name: name.into(),
        num_rows: n,
        primary_key: Some("id".into()),
        time_column: None,
        row_time,
        columns: vec![
            ColumnInput {
                name: "id".into(),
                stype: SemanticType::Identifier,
                source_type: "BIGINT".into(),
                inferred: false,
                data: ColumnData::Unstored,
            },
            ColumnInput {
                name: "x".into(),
                stype: SemanticType::Numerical,
                source_type: "DOUBLE".into(),
                inferred: false,
                data: ColumnData::Numerical { values, valid },
            },
        ],
        foreign_keys: vec![],
        fingerprint: format!("{name}-v1"),
    }
}

#[test]
fn rust_built_database_round_trips_and_publishes_atomically() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("db");
    let mut w = DatabaseWriter::new(&out, "unit-test", "hash", 8).unwrap();
    let none = [i64::MIN; 3];
    let xs = [1.0, 2.0, 6.0];
    let ok = [1u8, 1, 1];
    w.add_table(parents_table("a", 3, &none, &xs, &ok)).unwrap();
    let times = [30i64, 10, 20, 10];
    let parents = [0i64, 0, 2, -1];
    let ys = [0.5, 1.5, 2.5, 3.5];
    let ok4 = [1u8, 1, 0, 1];
    w.add_table(TableInput {
        name: "b".into(),
        num_rows: 4,
        primary_key: None,
        time_column: Some("t".into()),
        row_time: &times,
        columns: vec![
            ColumnInput {
                name: "a_id".into(),
                stype: SemanticType::Identifier,
                source_type: "BIGINT".into(),
                inferred: false,
                data: ColumnData::Unstored,
            },
            ColumnInput {
                name: "y".into(),
                stype: SemanticType::Numerical,
                source_type: "DOUBLE".into(),
                inferred: false,
                data: ColumnData::Numerical {
                    values: &ys,
                    valid: &ok4,
                },
            },
        ],
        foreign_keys: vec![ForeignKeyInput {
            column: "a_id".into(),
            references: "a".into(),
            parents: &parents,
            num_null: 1,
            num_dangling: 0,
        }],
        fingerprint: "b-v1".into(),
    })
    .unwrap();
    w.add_cell_task("b.y", "b", "y", None).unwrap();
    let anchors = [0u32, 2];
    let obs = [i64::MAX, 15];
    let labels = [1u8, 0];
    w.add_task(TaskInput {
        name: "flag".into(),
        kind: "sql".into(),
        anchor_table: "a".into(),
        anchor_rows: &anchors,
        obs_time: &obs,
        target: TaskTarget::Values {
            stype: SemanticType::Boolean,
            data: ColumnData::Boolean {
                values: &labels,
                valid: &[1, 1],
            },
        },
        query: None,
        description: None,
        splits: None,
    })
    .unwrap();
    assert!(!out.exists(), "nothing is published before finish");
    let cols = w.column_texts().len();
    let cats = w.category_texts().len();
    let texts = w.num_text_values();
    let z = |n: usize| vec![half::f16::ZERO; n * 8];
    w.finish(&z(cols), &z(cats), &z(texts), false).unwrap();
    let db = Database::open(&out).unwrap();
    let g = db.graph();
    // b rows are globals 3..7; a rows 0..3.
    assert_eq!(g.parents(3), &[0]);
    assert_eq!(g.parents(6), &[] as &[u32]);
    let (kids, times) = g.children(0);
    assert_eq!((kids, times), (&[4u32, 3][..], &[10i64, 30][..]));
    assert_eq!(g.children_visible_at(0, 15), &[4]);
    assert_eq!(g.children_visible_at(0, 9), &[] as &[u32]);
    let m = db.metadata();
    let cell = m.task_by_name("b.y").unwrap();
    assert_eq!(cell.num_seeds, 3, "the null y row is not a seed");
    let tv = db.task(cell.idx as usize).unwrap();
    assert_eq!(tv.anchor_rows, &[3, 4, 6]);
    assert_eq!(tv.obs_times, &[30, 10, 10]);
    let flag = db
        .task(m.task_by_name("flag").unwrap().idx as usize)
        .unwrap();
    assert_eq!(flag.obs_times, &[i64::MAX, 15]);
    assert_eq!(flag.anchor_rows, &[0, 2]);
}

#[test]
fn bad_inputs_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = DatabaseWriter::new(tmp.path().join("db"), "unit-test", "hash", 4).unwrap();
    let none = [i64::MIN; 3];
    let ok = [1u8; 3];
    let e = w
        .add_table(parents_table("../evil", 3, &none, &[1.0, 2.0, 3.0], &ok))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Preprocess(m) if m.contains("unsafe table name \"../evil\"")),
        "{e}"
    );
    let e = w
        .add_table(parents_table("short", 3, &none, &[1.0, 2.0], &ok))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("table `short` column `x`: 2 values, expected 3"),
        "{e}"
    );
    w.add_table(parents_table("a", 3, &none, &[1.0, 2.0, 3.0], &ok))
        .unwrap();
    let e = w.add_cell_task("t", "nope", "x", None).unwrap_err();
    assert!(e.to_string().contains("unknown anchor table `nope`"), "{e}");
    let e = w
        .add_task(TaskInput {
            name: "empty".into(),
            kind: "sql".into(),
            anchor_table: "a".into(),
            anchor_rows: &[],
            obs_time: &[],
            target: TaskTarget::Values {
                stype: SemanticType::Numerical,
                data: ColumnData::Numerical {
                    values: &[],
                    valid: &[],
                },
            },
            query: None,
            description: None,
            splits: None,
        })
        .unwrap_err();
    assert!(e.to_string().contains("task `empty` has zero rows"), "{e}");
    let e = w
        .add_task(TaskInput {
            name: "far".into(),
            kind: "sql".into(),
            anchor_table: "a".into(),
            anchor_rows: &[7],
            obs_time: &[0],
            target: TaskTarget::Values {
                stype: SemanticType::Numerical,
                data: ColumnData::Numerical {
                    values: &[1.0],
                    valid: &[1],
                },
            },
            query: None,
            description: None,
            splits: None,
        })
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("anchors row 7 of `a`, which has 3 rows"),
        "{e}"
    );
    w.add_cell_task("a.x", "a", "x", None).unwrap();
    let e = w.set_label_rule("a.x", Some("x"), &[]).unwrap_err();
    assert!(
        e.to_string()
            .contains("task `a.x`.label_time_column: `a.x` is numerical, not a timestamp"),
        "{e}"
    );
    let e = w.set_label_rule("a.x", None, &["id"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("task `a.x`.label_columns: table `a` has no stored column `id`"),
        "{e}"
    );
    let e = w.set_label_rule("far", None, &[]).unwrap_err();
    assert!(e.to_string().contains("task `far`: no cell task"), "{e}");
}

fn spec(name: &str, num_rows: usize, num_stored: usize) -> TableSpec {
    TableSpec {
        name: name.into(),
        num_rows,
        primary_key: None,
        time_column: None,
        fingerprint: format!("{name}-v1"),
        num_stored,
    }
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

#[test]
fn streamed_tables_check_the_protocol_and_name_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = DatabaseWriter::new(tmp.path().join("db"), "unit-test", "hash", 4).unwrap();
    let (xs, ok) = ([1.0, 2.0], [1u8, 1]);
    let msg = |e: Error| e.to_string();
    assert!(msg(w.add_column(numerical("x", &xs, &ok)).unwrap_err()).contains("no table begun"));
    assert!(msg(w.end_table(&[0, 0], &[]).unwrap_err()).contains("no table begun"));
    w.begin_table(spec("a", 2, 1)).unwrap();
    let e = msg(w.begin_table(spec("b", 2, 1)).unwrap_err());
    assert!(e.contains("`b`") && e.contains("`a` is not ended"), "{e}");
    w.add_column(numerical("x", &xs, &ok)).unwrap();
    let e = msg(w.add_column(numerical("y", &xs, &ok)).unwrap_err());
    assert!(e.contains("column `y`") && e.contains("1 declared"), "{e}");
    // The failed column discarded table `a`.
    assert!(msg(w.end_table(&[0, 0], &[]).unwrap_err()).contains("no table begun"));
    assert!(w.columns().is_empty());
    w.begin_table(spec("a", 2, 1)).unwrap();
    w.add_column(numerical("x", &xs, &ok)).unwrap();
    let e = msg(w.end_table(&[0], &[]).unwrap_err());
    assert!(
        e.contains("table `a` row times: 1 values, expected 2"),
        "{e}"
    );
    w.begin_table(spec("c", 2, 2)).unwrap();
    w.add_column(numerical("x", &xs, &ok)).unwrap();
    let e = msg(w.end_table(&[0, 0], &[]).unwrap_err());
    assert!(
        e.contains("table `c`: 1 stored columns added, 2 declared"),
        "{e}"
    );
}

#[test]
fn a_streamed_table_writes_the_bytes_of_a_whole_one() {
    let tmp = tempfile::tempdir().unwrap();
    let none = [i64::MIN; 3];
    let (xs, ok) = ([1.0, 2.0, 6.0], [1u8, 0, 1]);
    let mut whole = DatabaseWriter::new(tmp.path().join("whole"), "t", "hash", 4).unwrap();
    whole
        .add_table(parents_table("a", 3, &none, &xs, &ok))
        .unwrap();
    let mut streamed = DatabaseWriter::new(tmp.path().join("streamed"), "t", "hash", 4).unwrap();
    streamed
        .begin_table(TableSpec {
            primary_key: Some("id".into()),
            ..spec("a", 3, 1)
        })
        .unwrap();
    for c in parents_table("a", 3, &none, &xs, &ok).columns {
        streamed.add_column(c).unwrap();
    }
    streamed.end_table(&none, &[]).unwrap();
    for f in ["tables/0.bin", "parts/0.bin", "parts/0.json"] {
        let a = std::fs::read(whole.staging_dir().join(f)).unwrap();
        let b = std::fs::read(streamed.staging_dir().join(f)).unwrap();
        assert_eq!(a, b, "{f}");
    }
}

/// A task with stored splits round-trips its codes; the writer refuses an
/// unknown code, and a code corrupted on disk is a named error at open.
#[test]
fn stored_split_codes_round_trip_and_a_bad_code_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("db");
    let mut w = DatabaseWriter::new(&out, "unit-test", "hash", 8).unwrap();
    let none = [i64::MIN; 3];
    w.add_table(parents_table("a", 3, &none, &[1.0, 2.0, 3.0], &[1; 3]))
        .unwrap();
    let task = |name: &str, splits: &'static [u8]| TaskInput {
        name: name.into(),
        kind: "relbench".into(),
        anchor_table: "a".into(),
        anchor_rows: &[0, 1, 2],
        obs_time: &[5, 6, 7],
        target: TaskTarget::Values {
            stype: SemanticType::Numerical,
            data: ColumnData::Numerical {
                values: &[1.0, 2.0, 3.0],
                valid: &[1, 1, 1],
            },
        },
        query: None,
        description: None,
        splits: Some(splits),
    };
    let e = w.add_task(task("bad", &[0, 3, 1])).unwrap_err();
    assert!(
        e.to_string().contains(
            "task `bad`: row 1 has split code 3; expected 0 (train), 1 (val) or 2 (test)"
        ),
        "{e}"
    );
    let e = w.add_task(task("short", &[0, 1])).unwrap_err();
    assert!(e.to_string().contains("task `short` stored splits"), "{e}");
    w.add_task(task("rb", &[2, 0, 1])).unwrap();
    w.add_cell_task("a.x", "a", "x", None).unwrap();
    let z = |n: usize| vec![half::f16::ZERO; n * 8];
    let (c, k, t) = (
        w.column_texts().len(),
        w.category_texts().len(),
        w.num_text_values(),
    );
    w.finish(&z(c), &z(k), &z(t), false).unwrap();
    let db = Database::open(&out).unwrap();
    let m = db.metadata();
    let rb = m.task_by_name("rb").unwrap();
    let cell = m.task_by_name("a.x").unwrap();
    let rb_idx = rb.idx as usize;
    assert!(rb.stored_splits && !cell.stored_splits);
    assert_eq!(
        db.task(rb.idx as usize).unwrap().splits,
        Some(&[2u8, 0, 1][..])
    );
    assert_eq!(db.task(cell.idx as usize).unwrap().splits, None);
    let file = out.join(&rb.file);
    drop(db);
    // Section 4's (offset, length) entry of the section table: 48 + 16·4.
    let mut bytes = std::fs::read(&file).unwrap();
    let off = u64::from_le_bytes(bytes[112..120].try_into().unwrap()) as usize;
    assert_eq!(
        &bytes[off..off + 3],
        &[2, 0, 1],
        "section 4 holds the codes"
    );
    bytes[off + 1] = 7;
    std::fs::write(&file, &bytes).unwrap();
    // Open reads no payload byte; the codes are checked where they are
    // read (a seed list is made from them): the changed byte fails its
    // block's checksum, or, where blocks carry none, the code is refused.
    let db = Database::open(&out).expect("open reads no stored code");
    let e = db
        .task_split_codes(rb_idx)
        .expect_err("a bad split code must not be read");
    let msg = e.to_string();
    assert!(
        msg.contains("tasks/")
            && (msg.contains("block")
                || msg.contains(
                    "task `rb`: seed 1 has stored split code 7; expected 0 (train), 1 (val) or 2 (test)"
                )),
        "{msg}"
    );
}

#[test]
fn ids_out_of_range_are_named_by_row_only_where_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = DatabaseWriter::new(tmp.path().join("db"), "unit-test", "hash", 4).unwrap();
    let col = |stype, data| ColumnInput {
        name: "c".into(),
        stype,
        source_type: "VARCHAR".into(),
        inferred: false,
        data,
    };
    // Row 1's code is out of range but null: row 3 is the one named.
    let (codes, valid) = ([0u32, 9, 1, 2, 7], [1u8, 0, 1, 1, 1]);
    let msg = |r: headwater::Result<()>| r.unwrap_err().to_string();
    w.begin_table(spec("a", 5, 1)).unwrap();
    let e = msg(w.add_column(col(
        SemanticType::Categorical,
        ColumnData::Categorical {
            codes: &codes,
            valid: &valid,
            categories: vec!["p".into(), "q".into()],
        },
    )));
    assert!(
        e.contains("column `c`: row 3 has category code 2, only 2 categories"),
        "{e}"
    );
    w.begin_table(spec("a", 5, 1)).unwrap();
    let ids = w.intern_texts(&[0, 1, 2], b"xy").unwrap();
    assert_eq!(ids, [0, 1]);
    let e = msg(w.add_column(col(
        SemanticType::Text,
        ColumnData::TextIds {
            ids: &codes,
            valid: &valid,
        },
    )));
    assert!(
        e.contains("row 3 has text id 2, only 2 texts interned"),
        "{e}"
    );
    w.begin_table(spec("a", 5, 1)).unwrap();
    let e = msg(w.add_column(col(
        SemanticType::Text,
        ColumnData::Text {
            codes: &codes,
            valid: &valid,
            offsets: &[0, 1, 2, 3],
            bytes: b"xyz",
        },
    )));
    assert!(
        e.contains("row 4 has text code 7, dictionary has 3 entries"),
        "{e}"
    );
}
