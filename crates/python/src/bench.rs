//! `bench_sampler`: one `headwater bench` run, as a dict.

use pyo3::prelude::*;

use super::to_py;
use headwater::bench;
use headwater::config::SamplerConfig;

/// Steady-state train-batch production on `threads` threads (GIL released);
/// with `window` (Unix start and stop seconds), the batches finished inside
/// it instead of `steps`; with `seconds`, the batches until that many
/// seconds have passed after the warm-up. `sampler_overrides`: a JSON object of sampler
/// keys set over the run's config (e.g. an in-context recipe), read
/// through the config table.
#[pyfunction]
#[pyo3(signature = (db_path, threads, steps, warmup=10, batch_size=32, sequence_length=1024, seed=0, bfs_child_width=16, max_hops=3, telemetry=true, pack=false, pack_factor=0, database_weights=None, page_cache="lazy", window=None, sampler_overrides=None, seconds=None))]
#[allow(clippy::too_many_arguments)]
pub fn bench_sampler<'py>(
    py: Python<'py>,
    db_path: &Bound<'_, PyAny>,
    threads: usize,
    steps: u64,
    warmup: u64,
    batch_size: usize,
    sequence_length: usize,
    seed: u64,
    bfs_child_width: usize,
    max_hops: usize,
    telemetry: bool,
    pack: bool,
    pack_factor: usize,
    database_weights: Option<Vec<f64>>,
    page_cache: &str,
    window: Option<(f64, f64)>,
    sampler_overrides: Option<&str>,
    seconds: Option<f64>,
) -> PyResult<Bound<'py, PyAny>> {
    let paths = super::sampler::db_paths(db_path)?;
    // Read through the config table, so a bad value gets its one error.
    let page_cache = SamplerConfig::from_json(&serde_json::json!({ "page_cache": page_cache }))
        .map_err(to_py)?
        .page_cache;
    let cfg = SamplerConfig {
        database_weights: database_weights.map(headwater::config::TaskWeights::List),
        seed,
        default_batch_size: batch_size,
        default_sequence_length: sequence_length,
        bfs_child_width,
        max_hops,
        telemetry,
        pack,
        pack_factor,
        page_cache,
        ..SamplerConfig::default()
    };
    let cfg = match sampler_overrides {
        None => cfg,
        Some(text) => with_overrides(cfg, text).map_err(to_py)?,
    };
    let run = py
        .detach(|| {
            let timed = match (window, seconds) {
                (Some((start, stop)), _) => bench::Timed::Window(bench::Window { start, stop }),
                (None, Some(s)) => bench::Timed::Seconds(s),
                (None, None) => bench::Timed::Steps(steps),
            };
            bench::bench_run(&paths, cfg, threads, warmup, timed)
        })
        .map_err(to_py)?;
    let s = serde_json::to_string(&run).expect("serialisable");
    py.import("json")?.call_method1("loads", (s,))
}

/// `cfg` with the keys of the JSON object `text` set over it.
fn with_overrides(cfg: SamplerConfig, text: &str) -> headwater::error::Result<SamplerConfig> {
    let bad = |what: String| headwater::error::Error::config("sampler_overrides", what);
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON ({e}): {text}")))?;
    let serde_json::Value::Object(over) = v else {
        return Err(bad(format!("not a mapping of sampler keys: {text}")));
    };
    cfg.with_keys(&over)
}

/// Peak RSS of this process in bytes (`VmHWM`), or None off Linux.
#[pyfunction]
pub fn peak_rss_bytes() -> Option<u64> {
    bench::peak_rss_bytes()
}

/// `headwater bench --ranker-recall`: per task with examples, recall@k of
/// `ranker` (`"expected"`, `"adaptive"`, `"walks"`, or `"shuffled"`, a broken ranker for
/// tests) against the `walks` ranker, the ceiling (an independent `walks`
/// run) and each one's contexts per CPU-second, over `seeds` seeds
/// (`headwater::sampler::SamplerCore::ranker_recall`, one thread, GIL
/// released). `sampler_overrides`: a JSON object of sampler keys (the
/// recipe; `examples` must be on).
#[pyfunction]
#[pyo3(signature = (db_path, seeds=1000, ranker="adaptive", same_key=false, sampler_overrides=None))]
pub fn ranker_recall<'py>(
    py: Python<'py>,
    db_path: &Bound<'_, PyAny>,
    seeds: usize,
    ranker: &str,
    same_key: bool,
    sampler_overrides: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    use headwater::ranking::rankers::Ranker;
    let paths = super::sampler::db_paths(db_path)?;
    let ranker = match ranker {
        "walks" => Ranker::Walks,
        "adaptive" => Ranker::Adaptive,
        "expected" => Ranker::Expected,
        "shuffled" => Ranker::Shuffled,
        other => {
            return Err(to_py(headwater::error::Error::InvalidArgument {
                name: "ranker".into(),
                what: format!(
                    "got {other:?}, allowed: \"walks\", \"adaptive\", \"expected\" or \"shuffled\""
                ),
            }))
        }
    };
    let cfg = SamplerConfig {
        num_threads: Some(1),
        telemetry: false,
        ..SamplerConfig::default()
    };
    let cfg = match sampler_overrides {
        None => cfg,
        Some(text) => with_overrides(cfg, text).map_err(to_py)?,
    };
    let rows = py
        .detach(|| {
            let core = headwater::sampler::SamplerCore::open_mixture(&paths, cfg)?;
            core.ranker_recall(seeds, ranker, same_key)
        })
        .map_err(to_py)?;
    let s = serde_json::to_string(&rows).expect("serialisable");
    py.import("json")?.call_method1("loads", (s,))
}
