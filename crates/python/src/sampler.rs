//! `Sampler`: batches as NumPy arrays that own the Rust buffers (no copy).

use std::sync::Mutex;

use half::f16;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::batch::batch_dict;
use super::{to_py, WAKE};
use headwater::error::Error;
use headwater::sampler::{self, SamplerState};
use headwater::seeds::Split;

fn parse_split(split: &str) -> PyResult<Split> {
    Split::parse(split).ok_or_else(|| {
        PyValueError::new_err(format!(
            "invalid argument `split`: {split:?}, expected \"train\", \"val\" or \"test\""
        ))
    })
}

/// `db_path` as database folders: one path, or a list of them (a mixture).
pub(super) fn db_paths(db_path: &Bound<'_, PyAny>) -> PyResult<Vec<std::path::PathBuf>> {
    if let Ok(p) = db_path.extract::<std::path::PathBuf>() {
        return Ok(vec![p]);
    }
    db_path.extract::<Vec<std::path::PathBuf>>().map_err(|_| {
        PyValueError::new_err(format!(
            "invalid argument `db_path`: expected a database folder or a list of them, got {}",
            db_path
                .get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}

/// An `f16 [N, D]` array copied from `v`.
fn emb_array<'py>(py: Python<'py>, v: &[f16], d: usize) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_slice(py, v)
        .reshape([v.len() / d.max(1), d])?
        .into_any())
}

/// A non-negative integer argument.
fn nonneg(name: &str, v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| {
        PyValueError::new_err(format!("invalid argument `{name}`: must be >= 0, got {v}"))
    })
}

/// A saved state given as a dict (`state_dict()`), JSON str or bytes.
fn parse_state(v: &Bound<'_, PyAny>) -> PyResult<SamplerState> {
    // Whatever is given, a state that cannot be read is a `StateError`
    // naming what it is: one exception for every failed restore.
    let refuse = |what: String| {
        to_py(Error::State {
            field: "state".to_string(),
            what,
        })
    };
    let json = if let Ok(s) = v.extract::<String>() {
        s
    } else if let Ok(b) = v.extract::<Vec<u8>>() {
        String::from_utf8(b)
            .map_err(|e| refuse(format!("bytes are not UTF-8 JSON (a sampler state): {e}")))?
    } else {
        v.py()
            .import("json")?
            .call_method1("dumps", (v,))
            .and_then(|s| s.extract::<String>())
            .map_err(|e| {
                refuse(format!(
                    "a {} is not a sampler state (a dict, JSON str or bytes): {e}",
                    v.get_type()
                        .name()
                        .map_or_else(|_| "?".to_string(), |n| n.to_string())
                ))
            })?
    };
    SamplerState::from_json(&json).map_err(to_py)
}

/// The headwater sampler: prefetching producers for the train and val splits.
/// Shareable between threads: each split's batches go to callers one at a
/// time, each exactly once and in step order (see `sampler`'s module doc).
#[pyclass(module = "headwater._native", frozen)]
pub struct Sampler {
    inner: sampler::Sampler,
    last_pointers: Mutex<Vec<(&'static str, usize)>>,
}

/// Every tensor of a batch dict, in order: `[{"name", "dtype", "shape"}]`
/// (`shape` as symbols: `B`, `S`, `R`, `U`, `D` or a number).
#[pyfunction]
pub(crate) fn batch_tensors(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for t in headwater::batch::TENSORS {
        let d = PyDict::new(py);
        d.set_item("name", t.name)?;
        d.set_item("dtype", t.dtype.name())?;
        d.set_item("shape", t.shape.symbols())?;
        out.append(d)?;
    }
    Ok(out)
}

impl Sampler {
    /// The next batch of `split`: waits (GIL released) for the split's
    /// delivery gate and then the batch, waking every `WAKE` to check
    /// signals; safe from any number of threads (see `sampler`'s doc).
    fn next<'py>(&self, py: Python<'py>, split: Split) -> PyResult<Bound<'py, PyDict>> {
        let ask = self.inner.ask(split).map_err(to_py)?;
        loop {
            let got = py
                .detach(|| self.inner.next_batch_timeout(&ask, Some(WAKE)))
                .map_err(to_py)?;
            match got {
                Some(b) => {
                    let mut ptrs = Vec::with_capacity(16);
                    let d = batch_dict(py, b.batch, &mut ptrs)?;
                    *self.last_pointers.lock().unwrap() = ptrs;
                    return Ok(d);
                }
                None => py.check_signals()?,
            }
        }
    }
}

#[pymethods]
impl Sampler {
    /// Open `db_path` — one database folder, or a list of them (a
    /// mixture: each batch from one database, by `database_weights`) —
    /// with the sampler keys of `config` and `kwargs` (keywords win);
    /// unknown keys and bad values raise `ConfigError`.
    #[new]
    /// `state` (a `state_dict()` value, or its JSON) continues where it
    /// left off; `StateError` names the field when it does not fit.
    #[pyo3(signature = (db_path, config=None, state=None, **kwargs))]
    fn new(
        py: Python<'_>,
        db_path: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyAny>>,
        state: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let paths = db_paths(db_path)?;
        let cfg = super::config::from_py(config, kwargs)?;
        let state = state.map(parse_state).transpose()?;
        let inner = py
            .detach(|| sampler::Sampler::open_mixture(&paths, cfg, state.as_ref()))
            .map_err(to_py)?;
        Ok(Sampler {
            inner,
            last_pointers: Mutex::new(Vec::new()),
        })
    }

    /// The next training batch (blocks, GIL released; Ctrl-C interrupts).
    /// From several threads: each batch to exactly one caller, in step order.
    fn next_train_batch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.next(py, Split::Train)
    }

    /// The next validation batch.
    fn next_val_batch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.next(py, Split::Val)
    }

    /// Column-name embeddings `f16 [C, D]` (for a one-time device upload);
    /// for a mixture the databases' tables concatenated in order.
    fn column_embeddings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.inner.core();
        let v = core.column_embeddings().map_err(to_py)?;
        emb_array(py, &v, core.embedding_dim())
    }

    /// Category embeddings `f16 [Vc, D]` (a mixture's concatenated).
    fn categorical_embeddings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let core = self.inner.core();
        let v = core.categorical_embeddings().map_err(to_py)?;
        emb_array(py, &v, core.embedding_dim())
    }

    /// `metadata.json` as a dict, plus `databases` (one entry per database
    /// of the mixture: name, path, content hash, share, first task, task
    /// count, column and category offsets, its own metadata). For a mixture
    /// the tables, columns and tasks are the databases' concatenated, with
    /// mixture ids and task names `<database>/<task>`.
    fn database_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.inner.core().merged_metadata().to_string();
        py.import("json")?.call_method1("loads", (s,))
    }

    /// The snapshot content hash (for a mixture, the mixture's hash).
    #[getter]
    fn content_hash(&self) -> String {
        self.inner.core().content_hash()
    }

    /// The effective configuration as a dict.
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = serde_json::to_string(&self.inner.core().cfg).expect("serialisable");
        py.import("json")?.call_method1("loads", (s,))
    }

    #[getter]
    fn num_threads(&self) -> usize {
        self.inner.core().num_threads()
    }

    /// Batches waiting in the split's prefetch channel.
    #[pyo3(signature = (split="train"))]
    fn queue_depth(&self, split: &str) -> PyResult<usize> {
        self.inner.queue_depth(parse_split(split)?).map_err(to_py)
    }

    /// Stop producers, drain channels, join threads (idempotent). A later
    /// `next_*_batch()` raises `SamplerShutdown`; a wait blocked in another
    /// thread is woken with it.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.inner.shutdown());
    }

    #[getter]
    fn is_shut_down(&self) -> bool {
        self.inner.is_shut_down()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.shutdown(py);
        false
    }

    /// Step metrics of `split` since the last drain: the latest snapshot
    /// scalars plus counters and histogram buckets accumulated since the
    /// previous drain (which this clears). `{}` if no batch was delivered
    /// since. `split`: `"train"`, `"val"` (the val stream's and val
    /// evaluation passes' batches) or `"test"` (test passes' batches).
    #[pyo3(signature = (split="train"))]
    fn drain_step_metrics<'py>(
        &self,
        py: Python<'py>,
        split: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let values = self
            .inner
            .drain_step_values(parse_split(split)?)
            .map_err(to_py)?;
        let d = PyDict::new(py);
        for (k, v) in self.inner.core().schema.drained_keys.iter().zip(values) {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// The same as one `float64` array in `telemetry_keys()` order (empty when
    /// nothing was delivered since the last drain): one packed structure per
    /// step for the cross-rank reduction.
    #[pyo3(signature = (split="train"))]
    fn drain_step_metrics_packed<'py>(
        &self,
        py: Python<'py>,
        split: &str,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let values = self
            .inner
            .drain_step_values(parse_split(split)?)
            .map_err(to_py)?;
        Ok(PyArray1::from_vec(py, values))
    }

    /// The keys of a drain, in order (histograms expanded).
    fn telemetry_keys(&self) -> Vec<String> {
        self.inner.core().schema.drained_keys.clone()
    }

    /// The ordered telemetry schema: `[{"key", "reduction", "edges",
    /// "quantile", "help", "prometheus", "unit"}]` (`edges` ends with `inf`;
    /// `None` for scalars). Depends only on the database metadata and the
    /// config.
    fn telemetry_schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        super::telemetry::schema_list(py, &self.inner.core().schema)
    }

    /// Rebuild batch number `step` of `split` exactly as it was delivered
    /// (same tensors and `fingerprint`), from a fresh state with this
    /// sampler's configuration; the running producers are not disturbed.
    /// Across resumes and reshards the world size of `step` is the one it
    /// was delivered under; `rank` (default: this sampler's) picks whose
    /// batch to rebuild.
    #[pyo3(signature = (step, split="train", rank=None))]
    fn replay_batch<'py>(
        &self,
        py: Python<'py>,
        step: i64,
        split: &str,
        rank: Option<i64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let split = parse_split(split)?;
        let step = nonneg("step", step)?;
        let rank = rank
            .map(|r| {
                u32::try_from(nonneg("rank", r)?).map_err(|_| {
                    PyValueError::new_err(format!("invalid argument `rank`: {r} is too large"))
                })
            })
            .transpose()?;
        let b = py
            .detach(|| self.inner.replay_batch(split, step, rank))
            .map_err(to_py)?;
        batch_dict(py, b.batch, &mut Vec::new())
    }

    /// A finite, ordered evaluation pass over `split` (`"val"` or
    /// `"test"`): every seed of the split for `task` (all tasks when
    /// `None`), each list capped at its first `max_seeds`, this rank's share
    /// in fixed order; independent of the training stream, usable while the
    /// producers prefetch. Batches carry `seq_valid` (0 = padding, not to be
    /// scored).
    #[pyo3(signature = (split="val", task=None, max_seeds=None))]
    fn eval_batches(
        &self,
        split: &str,
        task: Option<&str>,
        max_seeds: Option<i64>,
    ) -> PyResult<super::eval::EvalPass> {
        super::eval::EvalPass::open(&self.inner, split, task, max_seeds)
    }

    /// Serve the trainer's gauges on this process's Prometheus `/metrics`
    /// (`{"trainer/verdict": 2.0, ...}`; keys from the trainer gauge table,
    /// an unknown key is a `ValueError`); nothing is served without an
    /// exporter.
    fn export_trainer(&self, values: std::collections::HashMap<String, f64>) -> PyResult<()> {
        let v: Vec<(String, f64)> = values.into_iter().collect();
        self.inner.export_trainer(&v).map_err(to_py)
    }

    /// The sampler state as of delivery (batches prefetched but not yet
    /// returned are not consumed): a small JSON-compatible dict, the same on
    /// every rank of a run. Restore it with `Sampler(..., state=...)` or
    /// `load_state_dict()`.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = py.detach(|| self.inner.state().to_json());
        py.import("json")?.call_method1("loads", (s,))
    }

    /// Continue from `state` (a `state_dict()` value, or its JSON as str or
    /// bytes): queued batches are dropped and the producers restarted.
    /// Raises `StateError` naming the field when the state does not fit this
    /// database and configuration.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let st = parse_state(state)?;
        py.detach(|| self.inner.load_state(&st)).map_err(to_py)
    }

    /// Raise `StateError` (naming the field) if `state` cannot be restored
    /// on this sampler, as `load_state_dict()` would; restores nothing and
    /// logs nothing.
    fn check_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let st = parse_state(state)?;
        py.detach(|| self.inner.check_state(&st)).map_err(to_py)
    }

    /// Advance `split`'s stream by `n` batches past the last delivered one
    /// without building them (e.g. to step over a batch that caused a loss
    /// spike); exactly reproducible.
    #[pyo3(signature = (n, split="train"))]
    fn skip(&self, py: Python<'_>, n: i64, split: &str) -> PyResult<()> {
        let split = parse_split(split)?;
        let n = nonneg("n", n)?;
        py.detach(|| self.inner.skip(split, n)).map_err(to_py)
    }

    /// Data addresses of the last batch's Rust buffers, for zero-copy checks.
    fn _last_batch_pointers(&self) -> Vec<(&'static str, usize)> {
        self.last_pointers.lock().unwrap().clone()
    }
}
