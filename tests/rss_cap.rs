//! `max_rss_bytes` counts private memory, not the mapped database, and is
//! checked before a batch is built. Its own test binary (one process, no
//! other tests allocating beside it), so the process's memory is this test's.

// Tests spell out their cases in line; the 80-line bound on functions
// (clippy.toml) is for the library.
#![allow(clippy::too_many_lines)]

use std::time::{Duration, Instant};

use headwater::format::{PageCache, Verify};
use headwater::preprocess::{synth_database, SynthSpec};
use headwater::sampler::{current_private_bytes, current_rss_bytes};
use headwater::{Error, Sampler, SamplerConfig, Split};

const MIB: u64 = 1 << 20;

fn config(cap: u64) -> SamplerConfig {
    SamplerConfig {
        num_threads: Some(1),
        default_batch_size: 8,
        default_sequence_length: 256,
        num_prefetch: 2,
        max_rss_bytes: Some(cap),
        telemetry: false,
        ..SamplerConfig::default()
    }
}

/// Wait until the train queue stops growing (the producer is blocked on a
/// full queue or has stopped).
fn wait_for_producer(s: &Sampler) {
    let t0 = Instant::now();
    let (mut last, mut still) = (usize::MAX, 0);
    while still < 5 && t0.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(200));
        let d = s.queue_depth(Split::Train).unwrap_or(0);
        still = if d == last { still + 1 } else { 0 };
        last = d;
    }
}

#[test]
fn cap_counts_private_memory_not_mapped_data_and_trips_on_a_queue_that_cannot_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("db");
    synth_database(&db, &SynthSpec::small(4, 250_000, 7)).unwrap();
    let db_bytes: u64 = walk_bytes(&db);
    assert!(
        db_bytes > 48 * MIB,
        "database too small to tell: {db_bytes}"
    );

    // 1. Mapped data alone: `page_cache = populate` faults every page of the
    //    sampler's own maps in, so VmRSS holds the whole database, yet a cap
    //    far below VmRSS is not tripped. (`verify = full` reads every byte
    //    too, but drops what it has hashed from the resident set.)
    let cap = current_private_bytes().unwrap() + 64 * MIB;
    let s = Sampler::new(
        &db,
        SamplerConfig {
            verify: Verify::Full,
            page_cache: PageCache::Populate,
            ..config(cap)
        },
    )
    .unwrap();
    let rss = current_rss_bytes().unwrap();
    assert!(
        rss > cap,
        "precondition: VmRSS {rss} must exceed the cap {cap} (mapped pages resident)"
    );
    for _ in 0..20 {
        s.next_batch(Split::Train)
            .expect("mapped pages must not count");
    }
    s.shutdown();
    drop(s);

    // 2. A prefetch queue that cannot fit: 1024 batches of ~6 MiB per split.
    let private = current_private_bytes().unwrap();
    let cap = private + 96 * MIB;
    let cfg = SamplerConfig {
        default_batch_size: 64,
        default_sequence_length: 1024,
        num_prefetch: 1024,
        ..config(cap)
    };
    let s = Sampler::new(&db, cfg).unwrap();
    wait_for_producer(&s);
    let peak = current_private_bytes().unwrap();
    let batch = 64 * 1024 * 90;
    assert!(
        peak <= cap + 4 * batch,
        "checked before building: private {peak} stays near the cap {cap}"
    );
    let err = loop {
        match s.next_batch(Split::Train) {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    let msg = err.to_string();
    assert!(matches!(err, Error::Resource(_)), "{msg}");
    for what in [
        "RssAnon",
        "max_rss_bytes",
        "Prefetch queues",
        "num_prefetch",
        "not counted",
    ] {
        assert!(msg.contains(what), "{what} missing from: {msg}");
    }
    s.shutdown();
}

fn walk_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk_bytes(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}
