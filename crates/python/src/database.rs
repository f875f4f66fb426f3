//! `Database`: an opened, validated database for inspection and tests.
//!
//! Accessors copy into fresh NumPy arrays; they are for inspection, checks and
//! one-time uploads, not the sampling hot path.

use half::f16;
use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::to_py;
use headwater::format::{self, ColumnValues, EmbeddingKind};

/// An open, validated headwater database directory.
#[pyclass(module = "headwater._native", frozen)]
pub struct Database {
    inner: format::Database,
}

fn values_to_py<'py>(py: Python<'py>, v: ColumnValues<'_>) -> Bound<'py, PyAny> {
    match v {
        ColumnValues::Numerical(x) => PyArray1::from_slice(py, x).into_any(),
        ColumnValues::Boolean(x) => PyArray1::from_slice(py, x).into_any(),
        ColumnValues::Timestamp(x) => PyArray1::from_slice(py, x).into_any(),
        ColumnValues::Categorical(x) | ColumnValues::Text(x) => {
            PyArray1::from_slice(py, x).into_any()
        }
    }
}

fn unpack_bits(bitmap: &[u8], n: usize) -> Vec<u8> {
    (0..n).map(|i| format::bit(bitmap, i) as u8).collect()
}

fn index(name: &str, v: i64) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| {
        PyValueError::new_err(format!("invalid argument `{name}`: must be >= 0, got {v}"))
    })
}

fn emb_kind(which: &str) -> PyResult<EmbeddingKind> {
    Ok(match which {
        "column" => EmbeddingKind::Column,
        "categorical" => EmbeddingKind::Categorical,
        "text" => EmbeddingKind::Text,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown embedding kind {other:?}: expected column, categorical or text"
            )))
        }
    })
}

/// Full check of the database in `path`: headers, every payload checksum
/// and the graph/task contents. `progress(done_bytes, total_bytes)` is
/// called as payload bytes are hashed (with the GIL held, every 16 MiB).
/// Returns `{"files", "bytes", "errors"}`, one message per problem, each
/// naming its file; a header problem raises instead.
#[pyfunction]
#[pyo3(signature = (path, progress=None))]
pub fn verify_database<'py>(
    py: Python<'py>,
    path: std::path::PathBuf,
    progress: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut callback_error = None;
    let report = format::verify_database(&path, &mut |done, total| {
        if let (Some(cb), None) = (&progress, &callback_error) {
            if let Err(e) = cb.call1((done, total)) {
                callback_error = Some(e);
            }
        }
    })
    .map_err(to_py)?;
    if let Some(e) = callback_error {
        return Err(e);
    }
    let d = PyDict::new(py);
    d.set_item("files", report.files)?;
    d.set_item("bytes", report.bytes)?;
    d.set_item("errors", report.errors)?;
    Ok(d)
}

#[pymethods]
impl Database {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let inner = py.detach(|| format::Database::open(&path)).map_err(to_py)?;
        Ok(Database { inner })
    }

    /// `metadata.json` as a string (parse with `json.loads`).
    fn metadata_json(&self) -> String {
        serde_json::to_string(self.inner.metadata()).expect("serialisable")
    }

    #[getter]
    fn content_hash(&self) -> String {
        self.inner.content_hash().to_string()
    }

    #[getter]
    fn bytes_on_disk(&self) -> u64 {
        self.inner.bytes_on_disk()
    }

    /// `(values, valid)` of a stored column of table `table` (slot order).
    fn column(&self, py: Python<'_>, table: i64, slot: i64) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        let (table, slot) = (index("table", table)?, index("slot", slot)?);
        let t = self.inner.table(table).map_err(to_py)?;
        let c = t.columns.get(slot).ok_or_else(|| {
            PyValueError::new_err(format!(
                "slot {slot} out of range: table {table} stores {} columns",
                t.columns.len()
            ))
        })?;
        let valid = unpack_bits(c.validity, t.num_rows as usize);
        Ok((
            values_to_py(py, c.values).unbind(),
            PyArray1::from_vec(py, valid).into_any().unbind(),
        ))
    }

    /// Graph sections as arrays: `row_table`, `row_time`, fwd/rev offsets and targets, `rev_times`.
    fn graph_arrays<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let g = self.inner.graph();
        let d = PyDict::new(py);
        d.set_item("row_table", PyArray1::from_slice(py, g.row_table))?;
        d.set_item("row_time", PyArray1::from_slice(py, g.row_time))?;
        d.set_item("fwd_offsets", PyArray1::from_slice(py, g.fwd_offsets))?;
        d.set_item("fwd_targets", PyArray1::from_slice(py, g.fwd_targets))?;
        d.set_item("rev_offsets", PyArray1::from_slice(py, g.rev_offsets))?;
        d.set_item("rev_targets", PyArray1::from_slice(py, g.rev_targets))?;
        d.set_item("rev_times", PyArray1::from_slice(py, g.rev_times))?;
        Ok(d)
    }

    /// Task `k` as arrays: `anchor_row`, `obs_time`, `target`, `target_valid`.
    fn task_arrays<'py>(&self, py: Python<'py>, k: i64) -> PyResult<Bound<'py, PyDict>> {
        let t = self.inner.task(index("k", k)?).map_err(to_py)?;
        let d = PyDict::new(py);
        d.set_item("anchor_row", PyArray1::from_slice(py, t.anchor_rows))?;
        d.set_item("obs_time", PyArray1::from_slice(py, t.obs_times))?;
        d.set_item("target", values_to_py(py, t.targets))?;
        d.set_item(
            "target_valid",
            PyArray1::from_vec(py, unpack_bits(t.target_validity, t.anchor_rows.len())),
        )?;
        Ok(d)
    }

    /// Embedding table `which` (column / categorical / text) as `f16 [N, D]`.
    fn embeddings<'py>(&self, py: Python<'py>, which: &str) -> PyResult<Bound<'py, PyArray2<f16>>> {
        let kind = emb_kind(which)?;
        let data = match kind {
            EmbeddingKind::Column => self.inner.column_embeddings(),
            EmbeddingKind::Categorical => self.inner.categorical_embeddings(),
            EmbeddingKind::Text => self.inner.text_embeddings(),
        }
        .map_err(to_py)?;
        let d = self.inner.metadata().embedder.dim as usize;
        PyArray1::from_slice(py, data).reshape([data.len() / d.max(1), d])
    }

    /// The `i`-th string that was embedded into table `which`.
    fn embedded_string(&self, which: &str, i: i64) -> PyResult<String> {
        let i = index("i", i)?;
        Ok(self
            .inner
            .embedded_string(emb_kind(which)?, i)
            .map_err(to_py)?
            .to_string())
    }
}
