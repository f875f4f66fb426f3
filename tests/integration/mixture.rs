//! Mixtures of databases: the realised database mix against the weights
//! (chi-square), splits and rank shards disjoint and complete per database,
//! ids into the concatenated tables, exact resume and the refusals, open
//! errors naming the database, and a 500-database mixture.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use headwater::config::TaskWeights;
use headwater::preprocess::{synth_database, SynthSpec};
use headwater::sampler::{BatchMaker, SamplerCore};
use headwater::seeds::split_seeds;
use headwater::{Error, SamplerConfig, Split};

use crate::oracle::scratch_dir;

/// `n` tiny synthetic databases under one temporary folder, named `db<i>`.
fn tiny_dbs(n: usize, rows: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
    let tmp = scratch_dir();
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| {
            let p = tmp.path().join(format!("db{i}"));
            synth_database(&p, &SynthSpec::small(2 + i % 2, rows, 100 + i as u64)).unwrap();
            p
        })
        .collect();
    (tmp, paths)
}

fn cfg() -> SamplerConfig {
    SamplerConfig {
        default_batch_size: 4,
        default_sequence_length: 48,
        num_threads: Some(2),
        telemetry: true,
        ..SamplerConfig::default()
    }
}

fn open(paths: &[PathBuf], cfg: SamplerConfig) -> Arc<SamplerCore> {
    Arc::new(SamplerCore::open_mixture(paths, cfg).unwrap())
}

#[test]
fn database_mix_follows_the_weights_within_a_chi_square_bound() {
    let (_tmp, paths) = tiny_dbs(3, 30);
    let weights = [1.0, 2.0, 5.0];
    let core = open(
        &paths,
        SamplerConfig {
            database_weights: Some(TaskWeights::List(weights.to_vec())),
            ..cfg()
        },
    );
    let state = core.split_state(Split::Train);
    let steps = 20_000u64;
    let mut seen = [0f64; 3];
    for step in 0..steps {
        seen[core.task_database(state.pick(step).unwrap())] += 1.0;
    }
    let total: f64 = weights.iter().sum();
    let chi2: f64 = seen
        .iter()
        .zip(weights)
        .map(|(&o, w)| {
            let e = steps as f64 * w / total;
            (o - e).powi(2) / e
        })
        .sum();
    // 2 degrees of freedom: P(chi2 > 13.82) = 0.001.
    assert!(chi2 < 13.82, "chi2 {chi2} for {seen:?} against {weights:?}");
    // Batches say which database they came from, as the pick does.
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    for step in 0..12 {
        let b = mk.next().unwrap().unwrap();
        let k = state.pick(step).unwrap();
        assert_eq!(
            (b.task_idx as usize, b.db_idx as usize),
            (k, core.task_database(k))
        );
    }
}

#[test]
fn splits_and_shards_are_disjoint_and_complete_per_database() {
    let (_tmp, paths) = tiny_dbs(2, 24);
    let world = 2u32;
    let cores: Vec<_> = (0..world)
        .map(|rank| {
            open(
                &paths,
                SamplerConfig {
                    rank,
                    world_size: world,
                    ..cfg()
                },
            )
        })
        .collect();
    let mut makers: Vec<_> = cores
        .iter()
        .map(|c| BatchMaker::new(c.clone(), Split::Train))
        .collect();
    let core = &cores[0];
    let n = core.task_names().len();
    // Mixture task -> seeds in consumption order (rank 0's slice, then 1's).
    let mut order: Vec<Vec<u32>> = vec![Vec::new(); n];
    for _ in 0..400 {
        let bs: Vec<_> = makers
            .iter_mut()
            .map(|m| m.next().unwrap().unwrap())
            .collect();
        assert_eq!(bs[0].task_idx, bs[1].task_idx, "ranks pick the same task");
        for b in &bs {
            order[b.task_idx as usize].extend(&b.seeds);
        }
    }
    let c = cfg();
    let mut checked = 0;
    for (k, drawn) in order.iter().enumerate() {
        let d = core.task_database(k);
        let alone = headwater::Database::open(&paths[d]).unwrap();
        let local = core.task_local(k);
        let view = alone.task(local).unwrap();
        // The split is the database's own, as if it were sampled alone.
        let mut pool = split_seeds(
            local as u32,
            view.anchor_rows,
            Split::Train,
            c.split_seed,
            c.split_ratios,
        );
        let others: Vec<Vec<u32>> = [Split::Val, Split::Test]
            .iter()
            .map(|&s| {
                split_seeds(
                    local as u32,
                    view.anchor_rows,
                    s,
                    c.split_seed,
                    c.split_ratios,
                )
            })
            .collect();
        let all = pool.len() + others.iter().map(Vec::len).sum::<usize>();
        assert_eq!(all, view.anchor_rows.len(), "splits cover task {k}");
        assert!(
            others.iter().flatten().all(|s| !pool.contains(s)),
            "disjoint"
        );
        if drawn.len() < pool.len() {
            continue;
        }
        // The first epoch across both ranks is exactly the pool, once each.
        let mut first: Vec<u32> = drawn[..pool.len()].to_vec();
        first.sort_unstable();
        pool.sort_unstable();
        assert_eq!(first, pool, "task {} epoch 0", core.task_names()[k]);
        checked += 1;
    }
    assert!(checked >= 2, "only {checked} tasks completed an epoch");
}

#[test]
fn ids_index_the_concatenated_tables() {
    let (_tmp, paths) = tiny_dbs(2, 20);
    let core = open(&paths, cfg());
    let cols = [0, 1].map(|d| core.dbs[d].db.metadata().columns.len() as i32);
    assert_eq!(core.dbs[1].column_offset as i32, cols[0]);
    let dim = core.embedding_dim();
    assert_eq!(
        core.column_embeddings().unwrap().len(),
        (cols[0] + cols[1]) as usize * dim
    );
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    let mut seen = [false; 2];
    for _ in 0..40 {
        let b = mk.next().unwrap().unwrap();
        let d = b.db_idx as usize;
        seen[d] = true;
        let lo = core.dbs[d].column_offset as i32;
        for (i, &c) in b.column_ids.iter().enumerate() {
            if b.is_padding[i] == 0 {
                assert!(
                    (lo..lo + cols[d]).contains(&c),
                    "column id {c} of database {d}"
                );
            }
        }
        let off = core.dbs[d].categorical_offset;
        let n = core.dbs[d].db.metadata().num_categorical_embeddings as u32;
        for (i, &c) in b.categorical_embed_ids.iter().enumerate() {
            if b.is_padding[i] == 0 && b.is_null[i] == 0 && c != 0 {
                assert!((off..off + n).contains(&c), "category {c} of database {d}");
            }
        }
    }
    assert_eq!(seen, [true, true]);
}

#[test]
fn mixture_resume_is_exact_and_other_mixtures_are_refused() {
    let (_tmp, paths) = tiny_dbs(3, 24);
    let core = open(&paths, cfg());
    let straight: Vec<u64> = BatchMaker::new(core.clone(), Split::Train)
        .take(9)
        .map(|b| b.unwrap().fingerprint)
        .collect();
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    for _ in 0..5 {
        mk.next().unwrap().unwrap();
    }
    let lens = mk.state.pool_lens();
    let saved = core.capture(&[(Split::Train, &mk.state.stream, &lens)]);
    let json = saved.to_json();
    let back = headwater::sampler::SamplerState::from_json(&json).unwrap();
    assert_eq!(back.databases.len(), 3);
    let again = open(&paths, cfg());
    let fresh = again.split_state(Split::Train);
    let stream = again.restore(&back, std::slice::from_ref(&fresh)).unwrap();
    let mut state = fresh;
    state.stream = stream.into_iter().next().unwrap();
    let rest: Vec<u64> = (0..4)
        .map(|_| again.make_batch(&mut state).unwrap().fingerprint)
        .collect();
    assert_eq!(rest, straight[5..]);
    // Another order of the same databases, or fewer of them: refused by name.
    let swapped = open(
        &[paths[1].clone(), paths[0].clone(), paths[2].clone()],
        cfg(),
    );
    let f = swapped.split_state(Split::Train);
    match swapped.restore(&back, std::slice::from_ref(&f)) {
        Err(Error::State { field, .. }) => assert_eq!(field, "databases"),
        other => panic!("expected a databases refusal, got {:?}", other.map(|_| ())),
    }
    // Other database weights change the stream: refused naming the key.
    let reweighted = open(
        &paths,
        SamplerConfig {
            database_weights: Some(TaskWeights::List(vec![1.0, 1.0, 3.0])),
            ..cfg()
        },
    );
    let f = reweighted.split_state(Split::Train);
    match reweighted.restore(&back, std::slice::from_ref(&f)) {
        Err(Error::State { field, .. }) => assert_eq!(field, "database_weights"),
        other => panic!("expected a weights refusal, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn open_errors_name_the_database() {
    let (tmp, mut paths) = tiny_dbs(2, 12);
    paths.push(tmp.path().join("missing"));
    match SamplerCore::open_mixture(&paths, cfg()) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("database `missing`"), "{e}"),
        other => panic!("expected an io error, got {:?}", other.map(|_| ())),
    }
    // The golden database was embedded at dimension 384, the synthetic ones at 8.
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_v1");
    match SamplerCore::open_mixture(&[paths[0].clone(), golden], cfg()) {
        Err(e @ Error::InvalidArgument { .. }) => {
            let m = e.to_string();
            assert!(m.contains("`golden_v1`") && m.contains("`db0`"), "{m}");
        }
        other => panic!("expected an embedder mismatch, got {:?}", other.map(|_| ())),
    }
    match SamplerCore::open_mixture(
        &paths[..2],
        SamplerConfig {
            database_weights: Some(TaskWeights::ByName(BTreeMap::from([(
                "nope".to_string(),
                1.0,
            )]))),
            ..cfg()
        },
    ) {
        Err(Error::Config { key, .. }) => assert_eq!(key, "database_weights"),
        other => panic!("expected a config error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn five_hundred_tiny_databases_open_sample_and_report_bounded_telemetry() {
    let (_tmp, paths) = tiny_dbs(500, 6);
    let k = 8;
    let core = open(
        &paths,
        SamplerConfig {
            telemetry_top_databases: k,
            ..cfg()
        },
    );
    assert_eq!(core.dbs.len(), 500);
    let s = &core.schema;
    assert_eq!(s.database_ids.len(), k);
    // Per-task rows only for the reported databases' tasks.
    let reported_tasks: usize = s
        .database_ids
        .iter()
        .map(|&d| core.dbs[d].db.metadata().tasks.len())
        .sum();
    assert_eq!(s.task_ids.len(), reported_tasks);
    let single = SamplerCore::open_mixture(&paths[..1], cfg()).unwrap();
    let fixed = single.schema.drained_keys.len() - single.task_names().len();
    assert_eq!(s.drained_keys.len(), fixed + reported_tasks + 4 * k);
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    let mut dbs = std::collections::HashSet::new();
    for _ in 0..30 {
        let b = mk.next().unwrap().unwrap();
        dbs.insert(b.db_idx);
        assert!(b.readings.draw.database_steps_since_pick_max >= 0.0);
        assert_eq!(b.readings.draw.databases.len(), k);
    }
    assert!(
        dbs.len() > 20,
        "30 batches came from only {} databases",
        dbs.len()
    );
}

/// `telemetry_databases` gives exactly the listed databases their own
/// series, in the order listed, even the smallest share (which the top-K
/// rule would never pick); the other databases' seeds are folded into
/// `databases/other_seeds`. Unknown and repeated names are refused naming
/// the key.
#[test]
fn listed_databases_get_their_own_series_and_the_rest_are_folded() {
    let (_tmp, paths) = tiny_dbs(4, 30);
    let listed = ["db3".to_string(), "db1".to_string()];
    let b = 4;
    let listed_cfg = || SamplerConfig {
        database_weights: Some(TaskWeights::List(vec![4.0, 3.0, 2.0, 1.0])),
        telemetry_top_databases: 2,
        telemetry_databases: listed.to_vec(),
        num_threads: Some(1),
        ..cfg()
    };
    let s = headwater::sampler::Sampler::open_mixture(&paths, listed_cfg(), None).unwrap();
    let core = s.core().clone();
    let schema = &core.schema;
    assert_eq!(schema.database_names, listed);
    assert_eq!(schema.database_ids, vec![3, 1]);
    let listed_tasks: Vec<usize> = (0..core.task_names().len())
        .filter(|&k| [1, 3].contains(&core.task_database(k)))
        .collect();
    assert_eq!(schema.task_ids, listed_tasks);
    // The top 2 by weight (db0, db1) would have been reported without the list.
    let top = SamplerCore::open_mixture(
        &paths,
        SamplerConfig {
            telemetry_databases: Vec::new(),
            ..listed_cfg()
        },
    )
    .unwrap();
    assert_eq!(top.schema.database_ids, vec![0, 1]);
    // K = the list's length: the same drain size formula as top-K.
    let k = listed.len();
    let fixed = top.schema.drained_keys.len() - top.schema.task_ids.len() - 4 * k;
    assert_eq!(
        schema.drained_keys.len(),
        fixed + listed_tasks.len() + 4 * k
    );

    let steps = 60;
    let mut from = [0usize; 4];
    for _ in 0..steps {
        from[s.next_batch(Split::Train).unwrap().db_idx as usize] += 1;
    }
    assert!(
        from.iter().all(|&n| n > 0),
        "every database drawn: {from:?}"
    );
    let drain = s.drain_step_metrics(Split::Train).unwrap();
    let value = |key: &str| {
        drain
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("{key} not drained"))
            .1
    };
    #[allow(clippy::cast_precision_loss)]
    let seeds = |n: usize| (n * b) as f64;
    assert_eq!(value("sampler/databases/db3/seeds"), seeds(from[3]));
    assert_eq!(value("sampler/databases/db1/seeds"), seeds(from[1]));
    assert_eq!(
        value("sampler/databases/other_seeds"),
        seeds(from[0] + from[2])
    );
    for folded in ["db0", "db2"] {
        assert!(
            !drain
                .iter()
                .any(|(k, _)| k.contains(&format!("/{folded}/"))),
            "{folded} has no series of its own"
        );
    }
    s.shutdown();

    let refused = |names: &[&str]| -> String {
        let cfg = SamplerConfig {
            telemetry_databases: names.iter().map(|n| (*n).to_string()).collect(),
            ..listed_cfg()
        };
        match SamplerCore::open_mixture(&paths, cfg) {
            Err(e @ Error::Config { .. }) => e.to_string(),
            other => panic!(
                "{names:?}: expected a config error, got {:?}",
                other.map(|_| ())
            ),
        }
    };
    let m = refused(&["db1", "nope"]);
    assert!(
        m.contains("`telemetry_databases`")
            && m.contains("unknown database \"nope\"")
            && m.contains(r#"["db0", "db1", "db2", "db3"]"#),
        "{m}"
    );
    let m = refused(&["db1", "db2", "db1"]);
    assert!(
        m.contains("`telemetry_databases`") && m.contains("\"db1\" listed twice"),
        "{m}"
    );
}

/// A task whose anchor rows are not rows of its anchor table (its metadata
/// re-hashed, every block sound: a fault no checksum finds) fails the run
/// by default, naming the task file, and under `on_bad_database = "skip"`
/// drops its database as a corrupt block does, the others delivering.
#[test]
fn a_task_whose_anchors_lie_outside_its_table_is_a_bad_database() {
    use headwater::config::OnBadDatabase;
    use headwater::sampler::Sampler;
    use headwater::Metadata;

    let (_tmp, paths) = tiny_dbs(2, 40);
    let meta_path = paths[0].join("metadata.json");
    let mut meta: Metadata = serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    let tables = meta.tables.len() as u32;
    for t in &mut meta.tasks {
        t.anchor_table = (t.anchor_table + 1) % tables;
    }
    meta.content_hash = meta.compute_content_hash();
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();

    let s = Sampler::open_mixture(&paths, cfg(), None).unwrap();
    let err = (0..40)
        .find_map(|_| s.next_batch(Split::Train).err())
        .expect("a batch of db0's tasks fails");
    let text = err.to_string();
    assert!(
        text.contains("is not a row of the anchor table") && text.contains("db0"),
        "{text}"
    );

    let skip = SamplerConfig {
        on_bad_database: OnBadDatabase::Skip,
        ..cfg()
    };
    let s = Sampler::open_mixture(&paths, skip, None).unwrap();
    for _ in 0..40 {
        let b = s.next_batch(Split::Train).unwrap();
        assert_eq!(b.readings.db, 1, "a batch of the dropped database");
    }
    let dropped = s.core().dropped_databases();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert!(
        dropped[0].name == "db0" && dropped[0].reason.contains("anchor"),
        "{dropped:?}"
    );
}
