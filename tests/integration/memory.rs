//! Reads under a memory budget: a database larger than `memory_budget` is
//! mapped without read-ahead (the kernel's `rr` flag on each random-read
//! map in `/proc/self/smaps`), one that fits keeps the default, and the
//! batches are the same either way.

use std::sync::Arc;

use headwater::format::Database;
use headwater::preprocess::{synth_database, SynthSpec};
use headwater::sampler::{BatchMaker, SamplerCore};
use headwater::{SamplerConfig, Split};

use crate::oracle::scratch_dir;

/// The `VmFlags` of every mapping of a file under `dir`, by path.
fn map_flags(dir: &std::path::Path) -> Vec<(String, String)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let dir = dir.to_string_lossy().into_owned();
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(path) = current.take() {
                out.push((path, flags.trim().to_string()));
            }
        } else if line.split_whitespace().count() >= 6 && line.contains('-') {
            current = line
                .split_whitespace()
                .nth(5)
                .filter(|p| p.starts_with(&dir))
                .map(str::to_string);
        }
    }
    out
}

/// Every tensor of the first three batches, hashed.
fn batches(core: &Arc<SamplerCore>) -> Vec<serde_json::Value> {
    BatchMaker::new(core.clone(), Split::Train)
        .take(3)
        .map(|b| crate::golden_batches::describe(&b.unwrap()))
        .collect()
}

#[test]
fn a_database_over_the_budget_is_read_without_read_ahead() {
    let tmp = scratch_dir();
    let dir = tmp.path().join("db");
    synth_database(&dir, &SynthSpec::small(3, 20_000, 4411)).unwrap();
    let open = |budget: Option<u64>| {
        let db = Arc::new(Database::open(&dir).unwrap());
        let cfg = SamplerConfig {
            default_batch_size: 4,
            default_sequence_length: 64,
            num_threads: Some(1),
            memory_budget: budget,
            ..SamplerConfig::default()
        };
        (
            db.bytes_on_disk(),
            Arc::new(SamplerCore::with_database(db, cfg).unwrap()),
        )
    };
    let (bytes, fits) = open(Some(u64::MAX));
    assert!(bytes > 1 << 21, "the test database is {bytes} bytes");
    assert!(!fits.reads.random_reads && fits.reads.mapped_bytes == bytes);
    let flags = map_flags(&dir);
    assert!(
        flags.iter().any(|(p, _)| p.ends_with("graph.bin")),
        "{flags:?}"
    );
    assert!(
        flags.iter().all(|(_, f)| !f.split(' ').any(|x| x == "rr")),
        "{flags:?}"
    );
    let fits_batches = batches(&fits);
    drop(fits);

    let (_, over) = open(Some(1 << 20));
    assert!(over.reads.random_reads && over.reads.budget_bytes == Some(1 << 20));
    let flags = map_flags(&dir);
    for (path, f) in &flags {
        // Tasks and the small embedding matrices are read whole: default.
        let random = path.ends_with("graph.bin")
            || path.contains("/tables/")
            || path.ends_with("text_embeddings.bin");
        assert_eq!(f.split(' ').any(|x| x == "rr"), random, "{path}: {f}");
    }
    assert_eq!(batches(&over), fits_batches, "the advice changed a batch");
}

#[test]
fn the_walk_graph_of_a_database_over_the_budget_is_read_without_read_ahead() {
    // The in-context tests' database, large enough to exceed a 1 MiB budget.
    let synth = crate::oracle::build(&headwater::preprocess::SynthSpec {
        null_fk: 0.0,
        ..headwater::preprocess::SynthSpec::small(4, 20_000, 21)
    })
    .expect("synthesizes");
    let walk_maps = |budget: u64| {
        let db = Arc::new(Database::open(&synth.dir).unwrap());
        let cfg = SamplerConfig {
            memory_budget: Some(budget),
            ..crate::incontext::cfg()
        };
        let core = SamplerCore::with_database(db, cfg).unwrap();
        let (walks, own): (Vec<_>, Vec<_>) = map_flags(&synth.dir)
            .into_iter()
            .partition(|(p, _)| p.contains("/walks/graph-"));
        (core.reads, walks, own)
    };
    let db_bytes = Database::open(&synth.dir).unwrap().bytes_on_disk();
    // The database alone fits its own size by the margin; with the walk
    // graph beside it, it does not: both are then read without read-ahead.
    for (budget, random) in [(u64::MAX, false), (1 << 20, true), (db_bytes, true)] {
        let (plan, walks, own) = walk_maps(budget);
        assert_eq!(plan.random_reads, random, "budget {budget}: {plan:?}");
        assert!(
            plan.mapped_bytes > db_bytes,
            "the walk graph is counted: {plan:?}"
        );
        assert!(
            !walks.is_empty() && !own.is_empty(),
            "the walk graph is not mapped from the database's folder"
        );
        for (path, f) in &walks {
            assert_eq!(f.split(' ').any(|x| x == "rr"), random, "{path}: {f}");
        }
        // The sampler's map of the database's graph (the oracle holds one too).
        let own_rr = own
            .iter()
            .filter(|(p, _)| p.ends_with("/graph.bin"))
            .any(|(_, f)| f.split(' ').any(|x| x == "rr"));
        assert_eq!(own_rr, random, "budget {budget}: {own:?}");
    }
}
