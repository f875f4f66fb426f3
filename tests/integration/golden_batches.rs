//! Golden batches: the bytes of every tensor, the fingerprint and the
//! per-batch telemetry inputs of a fixed config on the committed golden v1
//! (and, the same data in format 2, v2)
//! database, pinned in `tests/data/golden_batches.json`. Refactors must keep
//! them bit-identical (re-bless only for a deliberate format change with
//! `HEADWATER_BLESS=1 cargo test golden_batches`).

use std::path::Path;
use std::sync::Arc;

use headwater::sampler::{BatchMaker, MadeBatch, SamplerCore};
use headwater::{SamplerConfig, Split};
use serde_json::{json, Value};

use crate::support::{golden_v1, golden_v2};

fn h(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// Every tensor's bytes hashed, in `BATCH_KEYS` order, plus what telemetry
/// reads from the batch.
pub(crate) fn describe(b: &MadeBatch) -> Value {
    let tensors = json!({
        "semantic_types": h(bytemuck::cast_slice(&b.semantic_types)),
        "column_ids": h(bytemuck::cast_slice(&b.column_ids)),
        "seq_row_ids": h(bytemuck::cast_slice(&b.seq_row_ids)),
        "numeric_values": h(bytemuck::cast_slice(&b.numeric_values)),
        "timestamp_values": h(bytemuck::cast_slice(&b.timestamp_values)),
        "bool_values": h(&b.bool_values),
        "categorical_embed_ids": h(bytemuck::cast_slice(&b.categorical_embed_ids)),
        "text_embed_ids": h(bytemuck::cast_slice(&b.text_embed_ids)),
        "is_null": h(&b.is_null),
        "is_target": h(&b.is_target),
        "is_padding": h(&b.is_padding),
        "fk_adj": h(&b.fk_adj),
        "col_perm": h(bytemuck::cast_slice(&b.col_perm)),
        "out_perm": h(bytemuck::cast_slice(&b.out_perm)),
        "in_perm": h(bytemuck::cast_slice(&b.in_perm)),
        "text_batch_embeddings": h(bytemuck::cast_slice(&b.text_batch_embeddings)),
        "target_stype": b.target_stype,
        "task_idx": b.task_idx,
        "cat_emb_start": b.cat_emb_start,
        "cat_emb_count": b.cat_emb_count,
    });
    let stats: Vec<Value> = b
        .readings
        .seqs
        .iter()
        .map(|q| {
            json!([
                q.depth,
                q.rows,
                q.cells,
                q.cells_dropped,
                q.children_capped,
                q.temporal_filtered,
                q.temporal_leaks
            ])
        })
        .collect();
    json!({
        "shape": [b.batch_size, b.seq_len, b.max_rows, b.num_text, b.text_dim],
        "tensors": tensors,
        "fingerprint": format!("{:016x}", golden_fingerprint(b)),
        "seeds": b.seeds,
        "seq_stats": stats,
        "exhaust_events": b.readings.exhaust_events,
        "duplicate_seeds": b.readings.duplicate_seeds,
        "pool": golden_pool(b),
    })
}

fn golden_fingerprint(b: &MadeBatch) -> u64 {
    b.fingerprint
}

fn golden_pool(b: &MadeBatch) -> Value {
    let t = &b.readings.draw;
    json!([
        t.remaining_min,
        t.remaining_max,
        t.remaining_fraction_min,
        t.remaining_fraction_max,
        t.steps_since_pick_max,
        t.steps_to_exhaust_min,
        t.tv_distance
    ])
}

fn configs() -> Vec<(&'static str, SamplerConfig)> {
    let base = SamplerConfig {
        default_batch_size: 8,
        default_sequence_length: 64,
        bfs_child_width: 4,
        max_hops: 3,
        num_threads: Some(2),
        seed: 7,
        ..SamplerConfig::default()
    };
    vec![
        ("base", base.clone()),
        (
            "round_robin_weighted_no_filter",
            SamplerConfig {
                task_pick: headwater::config::TaskPick::RoundRobin,
                temporal_filter: false,
                default_batch_size: 5,
                default_sequence_length: 48,
                max_hops: 2,
                pool_fraction: 0.3,
                ..base.clone()
            },
        ),
        (
            "weights",
            SamplerConfig {
                task_weights: Some(vec![1.0, 3.0].into()),
                default_batch_size: 16,
                default_sequence_length: 128,
                ..base
            },
        ),
    ]
}

fn run_all(dir: &Path) -> Value {
    let db = Arc::new(headwater::Database::open(dir).unwrap());
    let mut out = serde_json::Map::new();
    for (name, cfg) in configs() {
        let core = Arc::new(SamplerCore::with_database(db.clone(), cfg).unwrap());
        let mut per_split = serde_json::Map::new();
        for (split, n) in [(Split::Train, 12), (Split::Val, 4)] {
            let batches: Vec<Value> = BatchMaker::new(core.clone(), split)
                .take(n)
                .map(|b| describe(&b.unwrap()))
                .collect();
            per_split.insert(split.name().to_string(), Value::Array(batches));
        }
        out.insert(name.to_string(), Value::Object(per_split));
    }
    Value::Object(out)
}

#[test]
fn golden_batches_are_bit_identical() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_batches.json");
    let got = run_all(&golden_v1());
    if std::env::var_os("HEADWATER_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&got).unwrap()).unwrap();
    }
    let want: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for (cfg, splits) in want.as_object().unwrap() {
        for (split, batches) in splits.as_object().unwrap() {
            for (i, b) in batches.as_array().unwrap().iter().enumerate() {
                assert_eq!(
                    &got[cfg][split][i], b,
                    "config {cfg}, split {split}, batch {i} changed"
                );
            }
        }
    }
    assert_eq!(got, want);
}

/// The golden v2 database holds the same data with block checksums: its
/// batches (every block read checked) are the pinned v1 batches, bit for bit.
#[test]
fn golden_v2_batches_are_the_pinned_ones() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_batches.json");
    let want: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(run_all(&golden_v2()), want);
}
