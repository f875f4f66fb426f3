//! Criterion benches: BFS per seed and whole-batch assembly on a synthetic
//! database (set `HEADWATER_BENCH_DB` to bench a real one, e.g. TPC-H SF1).

// Tests and benches spell out their cases in line; the 80-line bound on
// functions (clippy.toml) is for the library.
#![allow(clippy::too_many_lines)]

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use headwater::context::{bfs, BfsParams, BfsScratch, Subgraph};
use headwater::preprocess::{synth_database, SynthSpec};
use headwater::rng::Xoshiro256pp;
use headwater::sampler::SplitTelemetry;
use headwater::sampler::{BatchMaker, EvalPass, SamplerCore, SamplerState};
use headwater::{Database, Sampler, SamplerConfig, Split};

fn database() -> (Option<tempfile::TempDir>, PathBuf) {
    if let Ok(p) = std::env::var("HEADWATER_BENCH_DB") {
        return (None, PathBuf::from(p));
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("db");
    let mut spec = SynthSpec::small(6, 20_000, 7);
    spec.fks_per_table = 2;
    synth_database(&path, &spec).unwrap();
    (Some(tmp), path)
}

fn benches(c: &mut Criterion) {
    let (_tmp, path) = database();
    let db = Database::open(&path).unwrap();
    let g = db.graph();
    let m = db.metadata();
    let row_cells: Vec<u16> = m.tables.iter().map(|t| t.columns.len() as u16).collect();
    let task = db.task(0).unwrap();
    let params = BfsParams {
        max_cells: 1024,
        max_hops: 3,
        child_width: 16,
        temporal_filter: true,
    };
    let mut scratch = BfsScratch::default();
    let mut out = Subgraph::default();
    let mut rng = Xoshiro256pp::seed_from_u64(1);
    let mut i = 0usize;
    c.bench_function("bfs_per_seed", |b| {
        b.iter(|| {
            i = (i + 1) % task.anchor_rows.len();
            bfs(
                &g,
                &row_cells,
                task.anchor_rows[i],
                8,
                task.obs_times[i],
                &params,
                &mut rng,
                &mut scratch,
                &mut out,
            );
            black_box(out.rows.len())
        });
    });
    let cfg = SamplerConfig {
        num_threads: Some(1),
        ..SamplerConfig::default()
    };
    let core = Arc::new(SamplerCore::new(&path, cfg).unwrap());
    let mut maker = BatchMaker::new(core, Split::Train);
    c.bench_function("make_batch_b32_s1024_1thread", |b| {
        b.iter(|| black_box(maker.core.make_batch(&mut maker.state).unwrap().batch_size));
    });
    // The telemetry cost per batch: record a delivered batch, and drain.
    let batch = maker.core.make_batch(&mut maker.state).unwrap();
    let schema = &maker.core.schema;
    let mut rec = SplitTelemetry::new(schema, Vec::new());
    c.bench_function("telemetry_record_per_batch_b32", |b| {
        b.iter(|| rec.deliver(black_box(&batch.readings), 2, 0.001));
    });
    // The same for a batch of an evaluation pass (pass pool readings, no
    // queue): what a pass records per batch it yields.
    let pass_batch = EvalPass::new(maker.core.clone(), Split::Val, None, None)
        .unwrap()
        .next()
        .expect("the val split has seeds")
        .unwrap();
    let mut pass_rec = SplitTelemetry::new(schema, Vec::new());
    c.bench_function("telemetry_record_per_eval_pass_batch_b32", |b| {
        b.iter(|| pass_rec.deliver(black_box(&pass_batch.readings), 0, 0.001));
    });
    let mut out = Vec::new();
    c.bench_function("telemetry_record_and_drain_per_batch_b32", |b| {
        b.iter(|| {
            rec.deliver(black_box(&batch.readings), 2, 0.001);
            rec.drain.drain(schema, &mut out);
            black_box(out.len())
        });
    });
    // What the Python binding does per step: the values only, no key strings.
    let mut values = Vec::new();
    c.bench_function("telemetry_record_and_drain_values_per_batch_b32", |b| {
        b.iter(|| {
            rec.deliver(black_box(&batch.readings), 2, 0.001);
            rec.drain.drain_values(schema, &mut values);
            black_box(values.len())
        });
    });
    // The sampler state: O(tasks), taken from the delivered copies while the
    // producers run (budget: < 1 ms).
    let cfg = SamplerConfig {
        num_threads: Some(1),
        num_prefetch: 2,
        default_batch_size: 8,
        default_sequence_length: 128,
        ..SamplerConfig::default()
    };
    let running = Sampler::new(&path, cfg.clone()).unwrap();
    for _ in 0..3 {
        running.next_batch(Split::Train).unwrap();
    }
    c.bench_function("state_dict_json", |b| {
        b.iter(|| black_box(running.state().to_json().len()));
    });
    let json = running.state().to_json();
    println!(
        "state_dict: {} bytes for {} tasks",
        json.len(),
        db.metadata().tasks.len()
    );
    let mine = running.core().stream_config();
    let names = &running.core().schema.task_names;
    let records = running.core().database_records();
    c.bench_function("state_parse_and_check", |b| {
        b.iter(|| {
            let st = SamplerState::from_json(black_box(&json)).unwrap();
            st.check(db.content_hash(), &records, &mine, names).unwrap();
        });
    });
}

/// A mixture of 500 tiny synthetic databases (the mixture scale target):
/// time to open it (every database's headers and metadata, warm page
/// cache) and to make its first batch, its RSS, and the per-step cost of
/// recording a batch and draining the bounded telemetry vector.
/// With `HEADWATER_BENCH_COLD=1`, write the dirty pages and drop the page
/// cache (needs root: `/proc/sys/vm/drop_caches`), so the next open reads
/// from disk. Returns which cache the first open will meet.
fn page_cache_for_first_open() -> &'static str {
    if std::env::var("HEADWATER_BENCH_COLD").as_deref() != Ok("1") {
        return "warm";
    }
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    match std::fs::write("/proc/sys/vm/drop_caches", "3") {
        Ok(()) if synced => "cold",
        Ok(()) => panic!("HEADWATER_BENCH_COLD=1: sync failed, the dropped cache kept dirty pages"),
        Err(e) => panic!("HEADWATER_BENCH_COLD=1: cannot drop the page cache (root needed): {e}"),
    }
}

fn mixture_500(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..500)
        .map(|i| {
            let p = tmp.path().join(format!("db{i}"));
            synth_database(&p, &SynthSpec::small(2 + i % 2, 6, 100 + i as u64)).unwrap();
            p
        })
        .collect();
    let cache = page_cache_for_first_open();
    let cfg = SamplerConfig {
        num_threads: Some(1),
        default_batch_size: 32,
        default_sequence_length: 1024,
        ..SamplerConfig::default()
    };
    let rss0 = headwater::sampler::current_rss_bytes().unwrap_or(0);
    let t0 = std::time::Instant::now();
    let core = Arc::new(SamplerCore::open_mixture(&paths, cfg.clone()).unwrap());
    let opened = t0.elapsed();
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    let batch = mk.next().unwrap().unwrap();
    let first = t0.elapsed();
    let rss1 = headwater::sampler::current_rss_bytes().unwrap_or(0);
    let tasks = core.task_names().len();
    println!(
        "mixture of 500: {tasks} tasks; {cache} page cache: open {:.1} ms, first batch {:.1} ms from open; RSS +{:.1} MiB; {} drained values",
        opened.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        (rss1.saturating_sub(rss0)) as f64 / f64::from(1 << 20),
        core.schema.drained_keys.len()
    );
    c.bench_function("mixture_500_open", |b| {
        b.iter(|| {
            black_box(
                SamplerCore::open_mixture(&paths, cfg.clone())
                    .unwrap()
                    .dbs
                    .len(),
            )
        });
    });
    let mut rec = SplitTelemetry::new(&core.schema, Vec::new());
    let mut values = Vec::new();
    c.bench_function("mixture_500_record_and_drain_values_per_batch_b32", |b| {
        b.iter(|| {
            rec.deliver(black_box(&batch.readings), 2, 0.001);
            rec.drain.drain_values(&core.schema, &mut values);
            black_box(values.len())
        });
    });
}

criterion_group!(sampler, benches, mixture_500);
criterion_main!(sampler);
