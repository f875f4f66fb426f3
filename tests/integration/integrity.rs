//! Verified reads (format 2): a corrupt block is a named error before any
//! batch built from it is delivered, the counters say how reads were
//! checked, and the corruption harness — random bit flips and truncations
//! over every payload file of three generated databases used nowhere else.
//! The default suite runs a 30-case sample; the full 600-case harness is
//! `cargo test --test integration corruption_harness_full -- --ignored --nocapture`
//! (prints the tally).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headwater::format::{Database, Verify};
use headwater::preprocess::{synth_database, SynthSpec};
use headwater::rng::Xoshiro256pp;
use headwater::sampler::{BatchMaker, SamplerCore};
use headwater::{Error, SamplerConfig, Split};
use serde_json::{json, Value};

use crate::golden_batches::describe;
use crate::oracle::scratch_dir;
use crate::support::{copy_dir, golden_v1};

fn cfg() -> SamplerConfig {
    SamplerConfig {
        default_batch_size: 4,
        default_sequence_length: 48,
        max_hops: 2,
        num_threads: Some(2),
        seed: 5,
        ..SamplerConfig::default()
    }
}

/// The three harness databases (seeds no other test uses); the second has
/// files of many blocks, so a flip can land in a block no batch reads.
fn specs() -> Vec<SynthSpec> {
    vec![
        SynthSpec::small(3, 300, 9101),
        SynthSpec {
            rows: vec![2000, 240_000, 160_000, 3000],
            hub_share: 0.2,
            ..SynthSpec::small(4, 0, 9102)
        },
        SynthSpec::small(5, 150, 9103),
    ]
}

fn h(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// What one open-and-sample delivered before its first error.
struct Run {
    /// Batches (and, last, the embedding tables) handed out, described.
    delivered: Vec<Value>,
    /// The first error and whether it came at open (database or sampler).
    error: Option<(Error, bool)>,
    /// Per block of the damaged file: checked by a read?
    verified: Option<Vec<bool>>,
}

/// Open `dir`, make 3 train and 1 val batch, then take the embedding tables
/// the trainer is handed, stopping at the first error.
fn run(dir: &Path, rel: &str) -> Run {
    let fail = |e, at_open, verified| Run {
        delivered: vec![],
        error: Some((e, at_open)),
        verified,
    };
    let db = match Database::open(dir) {
        Ok(db) => Arc::new(db),
        Err(e) => return fail(e, true, None),
    };
    let core = match SamplerCore::with_database(db.clone(), cfg()) {
        Ok(c) => Arc::new(c),
        Err(e) => return fail(e, true, db.verified_blocks(rel)),
    };
    let mut out = Run {
        delivered: vec![],
        error: None,
        verified: None,
    };
    'outer: for (split, n) in [(Split::Train, 3), (Split::Val, 1)] {
        for b in BatchMaker::new(core.clone(), split).take(n) {
            match b {
                Ok(b) => out.delivered.push(describe(&b)),
                Err(e) => {
                    out.error = Some((e, false));
                    break 'outer;
                }
            }
        }
    }
    if out.error.is_none() {
        match (db.column_embeddings(), db.categorical_embeddings()) {
            (Ok(c), Ok(k)) => out.delivered.push(json!({
                "column_embeddings": h(bytemuck::cast_slice(c)),
                "categorical_embeddings": h(bytemuck::cast_slice(k)),
            })),
            (Err(e), _) | (_, Err(e)) => out.error = Some((e, false)),
        }
    }
    out.verified = db.verified_blocks(rel);
    out
}

/// Every `.bin` file of `dir`, relative, sorted.
fn payload_files(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    for sub in ["", "tables", "tasks"] {
        for e in fs::read_dir(dir.join(sub)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if Path::new(&name).extension().is_some_and(|x| x == "bin") {
                out.push(if sub.is_empty() {
                    name
                } else {
                    format!("{sub}/{name}")
                });
            }
        }
    }
    out.sort();
    out
}

/// Where byte `at` of a format-2 file lies: `Some(block)` in the data
/// blocks, `None` in the header or the block table.
fn block_of(bytes: &[u8], at: usize) -> Option<usize> {
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()) as usize;
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap()) as usize;
    let n = u32_at(12);
    let payload = (48 + 16 * n).next_multiple_of(64);
    let table = u64_at(48 + 16 * (n - 1));
    // The block table opens with the file's block shift.
    let shift = u64_at(table);
    (payload..table)
        .contains(&at)
        .then(|| (at - payload) >> shift)
}

/// The harness's tally.
#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    panics: usize,
    hangs: usize,
    at_open: usize,
    before_batch: usize,
    untouched: usize,
    /// Batches or tables delivered that differ from the clean database's,
    /// or delivered after a read of the damaged block: must stay 0.
    bad_deliveries: usize,
    /// Errors that do not name the file (and block, when not at open).
    unnamed: usize,
    failures: Vec<String>,
}

/// One damaged copy: flip a bit (7 in 10) or truncate, run, restore.
fn one_case(dir: &Path, rel: &str, clean: &[Value], rng: &mut Xoshiro256pp, t: &mut Tally) {
    let path = dir.join(rel);
    let orig = fs::read(&path).unwrap();
    let (damaged, block, what) = if rng.below(10) < 7 {
        let at = rng.below(orig.len() as u64) as usize;
        let mut b = orig.clone();
        b[at] ^= 1 << rng.below(8);
        (b, block_of(&orig, at), format!("{rel}: bit flip at {at}"))
    } else {
        let len = rng.below(orig.len() as u64) as usize;
        let what = format!("{rel}: truncated to {len} of {}", orig.len());
        (orig[..len].to_vec(), None, what)
    };
    fs::write(&path, &damaged).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (d, r) = (dir.to_path_buf(), rel.to_string());
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(|| run(&d, &r)));
    });
    let got = rx.recv_timeout(Duration::from_secs(60));
    fs::write(&path, &orig).unwrap();
    t.cases += 1;
    let fail = |t: &mut Tally, why: &str| t.failures.push(format!("{what}: {why}"));
    let run = match got {
        Err(_) => {
            t.hangs += 1;
            return fail(t, "hang");
        }
        Ok(Err(_)) => {
            t.panics += 1;
            return fail(t, "panic");
        }
        Ok(Ok(run)) => run,
    };
    if run.delivered.iter().zip(clean).any(|(a, b)| a != b) {
        t.bad_deliveries += 1;
        fail(
            t,
            "delivered a batch that differs from the clean database's",
        );
    }
    let read_damaged = block.is_some_and(|b| run.verified.as_ref().is_some_and(|v| v[b]));
    if let Some((e, at_open)) = run.error {
        let msg = e.to_string();
        if !(msg.contains(rel) && (at_open || msg.contains("block"))) {
            t.unnamed += 1;
            fail(t, &format!("error does not name file and block: {msg}"));
        }
        if at_open {
            t.at_open += 1;
        } else {
            t.before_batch += 1;
        }
    } else {
        t.untouched += 1;
        if block.is_none() || read_damaged || run.delivered.len() != clean.len() {
            t.bad_deliveries += 1;
            fail(t, "no error, yet the damage was in a block that was read");
        }
    }
}

/// Run `per_db` cases on each harness database (files in turn, so every
/// payload file is damaged), returning the tally.
fn harness(per_db: usize) -> Tally {
    let tmp = scratch_dir();
    let mut t = Tally::default();
    for (i, spec) in specs().iter().enumerate() {
        let dir = tmp.path().join(format!("db{i}"));
        synth_database(&dir, spec).unwrap();
        let files = payload_files(&dir);
        let clean = run(&dir, &files[0]);
        assert!(
            clean.error.is_none(),
            "clean db{i}: {:?}",
            clean.error.map(|e| e.0.to_string())
        );
        let mut rng = Xoshiro256pp::seed_from_u64(7000 + i as u64);
        for c in 0..per_db {
            one_case(
                &dir,
                &files[c % files.len()],
                &clean.delivered,
                &mut rng,
                &mut t,
            );
        }
    }
    t
}

fn assert_clean_tally(t: &Tally) {
    eprintln!("corruption harness: {t:?}");
    assert_eq!(
        (t.panics, t.hangs, t.bad_deliveries, t.unnamed),
        (0, 0, 0, 0),
        "{:#?}",
        t.failures
    );
    assert_eq!(t.cases, t.at_open + t.before_batch + t.untouched);
}

#[test]
fn corruption_harness_sample() {
    let t = harness(10);
    assert_clean_tally(&t);
    assert_eq!(t.cases, 30);
    // The sample reaches sampling, not only header errors.
    assert!(t.before_batch + t.untouched > 0, "{t:?}");
}

#[test]
#[ignore = "600 cases, about 6 s: run by name with --ignored"]
fn corruption_harness_full() {
    let started = Instant::now();
    let t = harness(200);
    assert_clean_tally(&t);
    assert_eq!(t.cases, 600);
    eprintln!("600 cases in {:.1} s", started.elapsed().as_secs_f64());
}

/// A harness-free database with byte `len - at_end` of `rel` flipped.
fn damaged_copy(rel: &str, at_end: usize) -> (tempfile::TempDir, PathBuf) {
    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    synth_database(&dir, &SynthSpec::small(3, 200, 9104)).unwrap();
    let p = dir.join(rel);
    let mut b = fs::read(&p).unwrap();
    let at = b.len() - at_end;
    b[at] ^= 0x10;
    fs::write(&p, &b).unwrap();
    (tmp, dir)
}

#[test]
fn a_corrupt_block_stops_the_batch_that_reads_it() {
    // A byte of graph.bin's first data block (of several: 4 KiB blocks).
    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    synth_database(&dir, &SynthSpec::small(3, 200, 9104)).unwrap();
    let p = dir.join("graph.bin");
    let mut b = fs::read(&p).unwrap();
    let at = (0..b.len()).find(|&i| block_of(&b, i) == Some(0)).unwrap() + 1;
    b[at] ^= 0x10;
    fs::write(&p, &b).unwrap();
    let db = Arc::new(Database::open(&dir).expect("open reads no data byte"));
    let core = Arc::new(SamplerCore::with_database(db.clone(), cfg()).unwrap());
    let e = BatchMaker::new(core.clone(), Split::Train)
        .next()
        .unwrap()
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Format { .. }), "{msg}");
    assert!(
        msg.contains("graph.bin")
            && msg.contains("block 0 of")
            && msg.contains("fails its checksum"),
        "{msg}"
    );
    // Sticky: no later batch of the database is delivered either.
    assert!(BatchMaker::new(core, Split::Val).next().unwrap().is_err());
    // The corrupt block is never marked checked (intact ones may be).
    let marked = db.verified_blocks("graph.bin").unwrap();
    assert!(marked.len() > 1 && !marked[0], "{marked:?}");
    // `headwater verify` is unchanged: it names the file.
    let report = headwater::format::verify_database(&dir, &mut |_, _| {}).unwrap();
    assert!(
        report.errors.iter().any(|e| e.contains("graph.bin")),
        "{report:?}"
    );
}

#[test]
fn a_damaged_block_table_is_refused_at_open() {
    let (_tmp, dir) = damaged_copy("tables/1.bin", 3);
    let e = Database::open(&dir)
        .err()
        .expect("damaged block table opened");
    let msg = e.to_string();
    assert!(
        msg.contains("tables/1.bin") && msg.contains("corrupt block table"),
        "{msg}"
    );
}

#[test]
fn format_2_reads_are_all_checked_and_counted() {
    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    synth_database(&dir, &SynthSpec::small(3, 200, 9105)).unwrap();
    let db = Arc::new(Database::open(&dir).unwrap());
    assert_eq!(db.integrity().blocks_verified(), 0, "open hashes no block");
    let core = Arc::new(SamplerCore::with_database(db.clone(), cfg()).unwrap());
    let b = BatchMaker::new(core, Split::Train).next().unwrap().unwrap();
    let r = b.readings.integrity;
    assert!(r.blocks_verified > 0, "{r:?}");
    assert_eq!(r.unverified_reads, 0);
    assert_eq!(r.blocks_verified, db.integrity().blocks_verified());
    db.integrity().check().unwrap();
}

#[test]
fn format_1_reads_are_counted_unverified_unless_opened_full() {
    let tmp = scratch_dir();
    let dir = tmp.path().join("v1");
    copy_dir(&golden_v1(), &dir);
    for (verify, unverified) in [(Verify::Header, true), (Verify::Full, false)] {
        let db = Arc::new(Database::open_with(&dir, verify).unwrap());
        let core = Arc::new(SamplerCore::with_database(db.clone(), cfg()).unwrap());
        let b = BatchMaker::new(core, Split::Train).next().unwrap().unwrap();
        let r = b.readings.integrity;
        assert_eq!(r.unverified_reads > 0, unverified, "{verify:?}: {r:?}");
        assert_eq!(r.blocks_verified, 0, "format 1 has no block checksums");
    }
}

#[test]
fn a_corrupt_block_no_batch_reads_delivers_and_stays_unchecked() {
    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    synth_database(&dir, &specs()[1]).unwrap();
    let first_batch = |dir: &Path| {
        let db = Arc::new(Database::open(dir).unwrap());
        let core = Arc::new(SamplerCore::with_database(db.clone(), cfg()).unwrap());
        let b = BatchMaker::new(core, Split::Train).next().unwrap();
        (
            b.map(|b| describe(&b)),
            db.verified_blocks("graph.bin").unwrap(),
        )
    };
    let (clean, checked) = first_batch(&dir);
    let clean = clean.unwrap();
    let unread = checked
        .iter()
        .position(|&c| !c)
        .expect("a block the batch did not read");
    let p = dir.join("graph.bin");
    let mut b = fs::read(&p).unwrap();
    let at = (0..b.len())
        .find(|&i| block_of(&b, i) == Some(unread))
        .unwrap()
        + 5;
    b[at] ^= 0x04;
    fs::write(&p, &b).unwrap();
    // Lazy: the same batch reads the same blocks, so it is delivered, the
    // same, and the damaged block stays unchecked ...
    let (again, checked_again) = first_batch(&dir);
    assert_eq!(again.unwrap(), clean);
    assert!(!checked_again[unread]);
    // ... while `verify` and `verify="full"` read it and name the file.
    let report = headwater::format::verify_database(&dir, &mut |_, _| {}).unwrap();
    assert!(
        report.errors.iter().any(|e| e.contains("graph.bin")),
        "{report:?}"
    );
    let e = Database::open_with(&dir, Verify::Full).err().unwrap();
    assert!(e.to_string().contains("graph.bin"), "{e}");
}

#[test]
fn opening_a_sampler_reads_no_seed_and_a_draw_makes_only_its_own_pool() {
    // Two of its task files span many 256 KiB blocks: opening reads at
    // most the first block of each (whether a split has any seed), never
    // every seed, and the first batch reads no other task's seeds.
    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    synth_database(&dir, &specs()[1]).unwrap();
    let db = Arc::new(Database::open(&dir).unwrap());
    let quiet = SamplerConfig {
        telemetry: false,
        ..cfg()
    };
    let core = Arc::new(SamplerCore::with_database(db.clone(), quiet).unwrap());
    let files: Vec<String> = db.metadata().tasks.iter().map(|t| t.file.clone()).collect();
    let checked = |rel: &str| {
        db.verified_blocks(rel)
            .unwrap()
            .iter()
            .filter(|&&c| c)
            .count()
    };
    let big: Vec<usize> = (0..files.len())
        .filter(|&k| db.verified_blocks(&files[k]).unwrap().len() > 8)
        .collect();
    assert!(big.len() >= 2, "too few task files of many blocks to tell");
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    for &k in &big {
        assert!(
            checked(&files[k]) <= 1,
            "{}: {} blocks read at open",
            files[k],
            checked(&files[k])
        );
    }
    assert_eq!(core.seed_lists_made(), 0, "no seed list made at open");
    let drawn = mk.state.pick(0).unwrap();
    mk.next().unwrap().unwrap();
    assert_eq!(
        core.seed_lists_made(),
        1,
        "the first batch makes its own task's list only"
    );
    for &k in big.iter().filter(|&&k| k != drawn) {
        assert!(
            checked(&files[k]) <= 1,
            "{}: read by another task's batch",
            files[k]
        );
    }
}
