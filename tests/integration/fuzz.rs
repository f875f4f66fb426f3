//! Fuzzing the format readers and the sampler on corrupted payloads (a
//! proptest harness: cargo-fuzz needs a nightly toolchain).
//!
//! Opening checks headers and sizes only, so a database whose payload bytes
//! were changed after it was written opens; sampling from it must then give
//! named errors or wrong-but-safe batches, never a panic or an out-of-bounds
//! read, and `verify_database` must name the damaged file. The number of
//! cases is `HEADWATER_FUZZ_CASES` (default 64 per target, what CI runs);
//! `HEADWATER_FUZZ_SEED` picks the proptest seed for long runs split over
//! several processes.

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use headwater::config::SamplerConfig;
use headwater::format::{verify_database, Database, FileKind, MappedFile};
use headwater::sampler::{BatchMaker, SamplerCore};
use headwater::seeds::Split;
use headwater::Error;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::support::golden_copy;

const FILES: [&str; 10] = [
    "graph.bin",
    "tables/0.bin",
    "tables/1.bin",
    "tables/2.bin",
    "tasks/0.bin",
    "tasks/1.bin",
    "column_embeddings.bin",
    "categorical_embeddings.bin",
    "text_embeddings.bin",
    "graph.bin",
];

fn runner() -> TestRunner {
    let cases = std::env::var("HEADWATER_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    match std::env::var("HEADWATER_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(seed) => {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&seed.to_le_bytes());
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key))
        }
        None => TestRunner::new(config),
    }
}

/// One change to a file: where (`in_payload` maps the index into the bytes
/// after the section table), how (0 xor a byte, 1 write a u32, 2 a u64, 3 an
/// extreme value), and the value.
type Mutation = (Index, bool, u8, u64);

fn payload_start(b: &[u8]) -> usize {
    let n = b
        .get(12..16)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap()) as usize);
    (48 + 16 * n.min(1 << 20)).div_ceil(64) * 64
}

fn mutate(orig: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = orig.to_vec();
    let start = payload_start(orig).min(b.len());
    for &(at, in_payload, how, v) in muts {
        let pos = if in_payload && start < b.len() {
            start + at.index(b.len() - start)
        } else {
            at.index(b.len())
        };
        let write = |b: &mut Vec<u8>, pos: usize, bytes: &[u8]| {
            let pos = pos & !(bytes.len() - 1);
            let end = (pos + bytes.len()).min(b.len());
            b[pos..end].copy_from_slice(&bytes[..end - pos]);
        };
        match how {
            0 => b[pos] ^= (v as u8) | 1,
            1 => write(&mut b, pos, &(v as u32).to_le_bytes()),
            2 => write(&mut b, pos, &v.to_le_bytes()),
            _ => {
                let extreme = [0u64, u64::MAX, u64::from(u32::MAX), 1 << 63, 1 << 31];
                write(&mut b, pos, &extreme[v as usize % 5].to_le_bytes());
            }
        }
    }
    b
}

/// Open and sample the (corrupt) database in `dir`; every error must be a
/// named one.
fn open_and_sample(dir: &Path, rel: &str) -> Result<(), TestCaseError> {
    let db = match Database::open(dir) {
        Ok(db) => Arc::new(db),
        Err(Error::Format { file, .. }) => {
            prop_assert!(file.ends_with(rel), "{rel}: blamed {file:?}");
            return Ok(());
        }
        Err(Error::Version { .. }) => return Ok(()),
        Err(other) => return Err(TestCaseError::fail(format!("{rel}: {other}"))),
    };
    let cfg = SamplerConfig {
        num_threads: Some(1),
        default_batch_size: 8,
        default_sequence_length: 96,
        telemetry: false,
        ..SamplerConfig::default()
    };
    let Ok(core) = SamplerCore::with_database(db, cfg) else {
        return Ok(());
    };
    let core = Arc::new(core);
    for split in [Split::Train, Split::Val] {
        for r in BatchMaker::new(core.clone(), split).take(3) {
            match r {
                Ok(_) | Err(Error::InvalidArgument { .. }) => {}
                Err(e @ Error::Format { .. }) => {
                    // The file named, or named in the message (a seed row
                    // that the graph's row table disowns names both).
                    prop_assert!(e.to_string().contains(rel), "{rel}: {e}");
                }
                Err(other) => return Err(TestCaseError::fail(format!("{rel}: {other}"))),
            }
        }
    }
    Ok(())
}

#[test]
fn corrupt_payloads_never_panic_and_verify_names_the_file() {
    let (_tmp, dir) = golden_copy();
    let originals: Vec<Vec<u8>> = FILES
        .iter()
        .map(|f| fs::read(dir.join(f)).unwrap())
        .collect();
    let muts = proptest::collection::vec(
        (
            any::<Index>(),
            prop::bool::weighted(0.8),
            0u8..4,
            any::<u64>(),
        ),
        1..6,
    );
    let opened = std::cell::Cell::new(0u64);
    runner()
        .run(&(0..FILES.len(), muts), |(f, muts)| {
            let rel = FILES[f];
            let bytes = mutate(&originals[f], &muts);
            fs::write(dir.join(rel), &bytes).unwrap();
            let outcome = catch_unwind(AssertUnwindSafe(|| open_and_sample(&dir, rel)));
            let verdict = catch_unwind(AssertUnwindSafe(|| verify_database(&dir, &mut |_, _| {})));
            fs::write(dir.join(rel), &originals[f]).unwrap();
            match outcome {
                Ok(r) => r?,
                Err(_) => return Err(TestCaseError::fail(format!("{rel}: sampling panicked"))),
            }
            match verdict {
                Err(_) => return Err(TestCaseError::fail(format!("{rel}: verify panicked"))),
                Ok(Err(_)) => {}
                Ok(Ok(report)) => {
                    opened.set(opened.get() + 1);
                    let changed = bytes != originals[f];
                    prop_assert_eq!(
                        !report.errors.is_empty(),
                        changed,
                        "{}: verify reported {:?}",
                        rel,
                        report.errors
                    );
                    prop_assert!(
                        report.errors.iter().all(|e| e.contains(rel)),
                        "{:?}",
                        report.errors
                    );
                }
            }
            Ok(())
        })
        .unwrap();
    // The harness must reach sampling, not only header errors.
    assert!(
        opened.get() > 0,
        "no corrupted database opened: the harness tests nothing"
    );
}

#[test]
fn format_readers_never_panic_on_arbitrary_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("x.bin");
    let kinds = [
        FileKind::Graph,
        FileKind::Table,
        FileKind::Task,
        FileKind::Embeddings,
    ];
    let bytes = (
        0..4usize,
        proptest::collection::vec(any::<u8>(), 0..400),
        any::<bool>(),
    );
    runner()
        .run(&bytes, |(k, mut b, with_magic)| {
            if with_magic && b.len() >= 16 {
                b[..8].copy_from_slice(kinds[k].magic());
                b[8..12].copy_from_slice(&1u32.to_le_bytes());
                let n = u32::from(b[12]) % 4;
                b[12..16].copy_from_slice(&n.to_le_bytes());
            }
            fs::write(&p, &b).unwrap();
            let r = catch_unwind(|| match MappedFile::open(&p, kinds[k], None) {
                Ok(f) => {
                    for i in 0..=f.num_sections() {
                        let _ = f.section::<u8>(i, None);
                        let _ = f.section::<u64>(i, Some(3));
                        let _ = f.section::<half::f16>(i, None);
                    }
                    let _ = f.verify_payload(&mut |_| {});
                    true
                }
                Err(Error::Format { .. } | Error::Version { .. }) => true,
                Err(_) => false,
            });
            prop_assert_eq!(r.ok(), Some(true), "{} bytes", b.len());
            Ok(())
        })
        .unwrap();
}
