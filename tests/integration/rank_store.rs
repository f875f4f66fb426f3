//! The `expected` ranker's stored rankings (`expected_store`): contexts
//! built from a store, complete or cut to a few rows per head, equal the
//! live ranker's context by context (both the stored path and the live
//! redo taken); the sampler writes the store once, reads it back, refuses
//! a foreign file or a damaged index naming it and computes it again, fails
//! the batch that reads a damaged item block, and its batches equal the
//! live ranker's; the key is refused without the ranker.

use headwater::config::ExampleRanker;
use headwater::context::{
    build_in_context, BfsScratch, ExampleParams, ExampleScratch, SeqRecipe, Subgraph,
};
use headwater::format::Database;
use headwater::ranking::rank_store::{RankStore, StoreParams};
use headwater::ranking::rankers::Ranker;
use headwater::sampler::{MadeBatch, SamplerCore};
use headwater::{Error, SamplerConfig};

use crate::incontext::{self, db, run, with_task_params};
use crate::oracle::{same_batch, SynthDb};

/// What a context is, for comparing two builds.
fn shape(s: &Subgraph) -> impl PartialEq + std::fmt::Debug {
    (
        s.rows.clone(),
        s.tables.clone(),
        s.edges.clone(),
        s.example_rows.clone(),
        s.tier_cells,
        s.cells,
    )
}

/// Caps of the stores compared (the last holds every row).
const CAPS: [usize; 5] = [1, 2, 3, 5, 100_000];

#[test]
fn stored_rankings_build_the_live_expected_contexts() {
    let sdb = db();
    // Per cap: contexts read from the store, contexts redone live.
    let mut served = [(0, 0); CAPS.len()];
    // The cell tasks of an untimed and of a timed table.
    for k in [0, 1, 3] {
        for (s, t) in served.iter_mut().zip(compare_task(&sdb.db, k)) {
            (s.0, s.1) = (s.0 + t.0, s.1 + t.1);
        }
    }
    let (short, complete) = served.split_at(CAPS.len() - 1);
    let (all, none) = complete[0];
    assert!(
        all > 0 && none == 0,
        "a complete store redid contexts: {served:?}"
    );
    assert!(
        short.iter().any(|s| s.1 > 0) && short.iter().any(|s| s.0 > 0),
        "the short caps never took both paths: {served:?}"
    );
}

/// Build every seed of cell task `k` live and from stores of each cap:
/// the same contexts; per cap, the contexts read from the store and those
/// redone live.
fn compare_task(db: &Database, k: usize) -> Vec<(usize, usize)> {
    let task = db.task(k).unwrap();
    with_task_params(db, k, true, Ranker::Expected, |g, p| {
        let live = ExampleParams {
            seq_len: 256,
            num_walks: 20000,
            walk_length: 12,
            ..*p
        };
        let mut keys: Vec<(u32, i64)> = task
            .anchor_rows
            .iter()
            .zip(task.obs_times)
            .map(|(&r, &o)| (r, o))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let (mut bs, mut ex) = (BfsScratch::default(), ExampleScratch::default());
        let (mut a, mut b) = (Subgraph::default(), Subgraph::default());
        let mut served = Vec::new();
        for cap in CAPS {
            let p = StoreParams {
                num_walks: 20000,
                walk_length: 12,
                prune: 0.25,
                cap,
            };
            let store = RankStore::compute(g, live.walk_graph, &keys, &p, 0);
            assert_eq!(store.len(), keys.len());
            let stored = ExampleParams {
                store: Some(&store),
                ..live
            };
            let (mut from_store, mut redone) = (0, 0);
            for (i, (&seed, &obs)) in task.anchor_rows.iter().zip(task.obs_times).enumerate() {
                let r = SeqRecipe {
                    local_size: [64, 96, 128][i % 3],
                    bfs_width: 4,
                    prefer_latest: i % 2 == 1,
                };
                let key = i as u64 * 7 + 1;
                build_in_context(g, seed, obs, key, &r, &live, 4, &mut bs, &mut ex, &mut a);
                build_in_context(g, seed, obs, key, &r, &stored, 4, &mut bs, &mut ex, &mut b);
                assert_eq!(
                    shape(&a),
                    shape(&b),
                    "cap {cap}, seed {seed}: stored ≠ live"
                );
                // A stored build reads (0 updates) unless it was redone live,
                // which it counts.
                assert_eq!(b.walk_steps, a.walk_steps * u64::from(b.store_misses));
                assert_eq!(a.store_misses, 0);
                if b.store_misses == 1 {
                    redone += 1;
                } else if a.walk_steps > 0 {
                    from_store += 1;
                }
            }
            served.push((from_store, redone));
        }
        served
    })
}

/// The in-context tests' config, with the expected ranker and more walks.
fn cfg(store: bool) -> SamplerConfig {
    SamplerConfig {
        num_walks: 2000,
        example_ranker: ExampleRanker::Expected,
        expected_store: store,
        ..incontext::cfg()
    }
}

/// The one store file of the database (beside it, its build lock).
fn store_file(sdb: &SynthDb) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(sdb.dir.join("rankings"))
        .expect("rankings/ written")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    assert_eq!(files[1], files[0].with_extension("lock"), "{files:?}");
    files[0].clone()
}

#[test]
fn the_sampler_writes_reads_and_rebuilds_its_store_with_the_live_batches() {
    let sdb = db();
    let live = run(&sdb.db, &cfg(false), 3);
    assert!(
        !sdb.dir.join("rankings").exists(),
        "written without the key"
    );
    // The same batches; only the walk-step readings differ (a stored
    // context makes no neighbour updates).
    let same = |got: Vec<MadeBatch>, what: &str| {
        let steps = |b: &[MadeBatch]| -> u64 {
            b.iter()
                .flat_map(|b| b.readings.seqs.iter().map(|s| s.walk_steps))
                .sum()
        };
        assert!(
            steps(&got) < steps(&live) / 2,
            "{what}: the store was not read"
        );
        // Only a context the store could not rank spreads, and counts.
        for s in got.iter().flat_map(|b| &b.readings.seqs) {
            assert_eq!(s.walk_steps > 0, s.store_misses == 1, "{what}: {s:?}");
        }
        for (a, mut b) in live.iter().zip(got) {
            for (x, y) in b.readings.seqs.iter_mut().zip(&a.readings.seqs) {
                x.walk_steps = y.walk_steps;
            }
            assert!(
                same_batch(a, &b),
                "{what}: batches differ from the live ranker's"
            );
        }
    };
    same(run(&sdb.db, &cfg(true), 3), "first (computed) store");
    let path = store_file(&sdb);
    let written = std::fs::read(&path).unwrap();
    same(run(&sdb.db, &cfg(true), 3), "store read back");
    assert_eq!(std::fs::read(&path).unwrap(), written);
    let word = |at: usize| u64::from_le_bytes(written[at..at + 8].try_into().unwrap());
    let (key, items) = (word(16), word(written.len() - 24) as usize);
    // Damaged items: the open hashes the header, the index and the block
    // table, not the items; the first read of a damaged block fails the
    // batch, naming the file, the block and how to compute it again.
    let mut bad = written.clone();
    for at in (4096..4096 + items).step_by(4096) {
        bad[at + 7] ^= 0x40;
    }
    std::fs::write(&path, &bad).unwrap();
    assert!(RankStore::open(&path, key).is_ok(), "items hashed at open");
    let fresh = std::sync::Arc::new(Database::open(&sdb.dir).unwrap());
    let mut mk = incontext::maker(&fresh, &cfg(true));
    let e = (0..3)
        .find_map(|_| mk.next().unwrap().err())
        .expect("a batch read a damaged block")
        .to_string();
    assert!(
        e.contains(&path.display().to_string())
            && e.contains("fails its checksum")
            && e.contains("rankings/"),
        "{e}"
    );
    // A damaged index byte: refused naming the file, computed and written again.
    let mut bad = written.clone();
    let index = (4096 + items).next_multiple_of(8) + 3;
    bad[index] ^= 0x40;
    std::fs::write(&path, &bad).unwrap();
    match RankStore::open(&path, key) {
        Err(Error::Format { file, what }) => {
            assert_eq!(file, path);
            assert!(what.contains("checksum"), "{what}");
        }
        other => panic!("a damaged store was read: {other:?}"),
    }
    same(run(&sdb.db, &cfg(true), 3), "rebuilt store");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        written,
        "not rewritten whole"
    );
    // Another key (other settings): refused naming both keys.
    match RankStore::open(&path, 7) {
        Err(Error::Format { what, .. }) => assert!(what.contains("key"), "{what}"),
        other => panic!("a foreign store was read: {other:?}"),
    }
    // A truncated file.
    std::fs::write(&path, &written[..written.len() / 3]).unwrap();
    assert!(matches!(
        RankStore::open(&path, 0),
        Err(Error::Format { .. })
    ));
}

#[test]
fn the_store_key_needs_the_expected_ranker() {
    let sdb = db();
    let c = SamplerConfig {
        example_ranker: ExampleRanker::Walks,
        ..cfg(true)
    };
    match SamplerCore::with_database(sdb.db.clone(), c) {
        Err(Error::Config { key, what, .. }) => {
            assert_eq!(key, "expected_store");
            assert!(what.contains("expected"), "{what}");
        }
        other => panic!("accepted: {:?}", other.err()),
    }
}
