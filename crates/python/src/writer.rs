//! `DatabaseWriter` and `hash_embed` for the Python preprocessing front end.

use half::f16;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyAny;

use super::to_py;
use headwater::format::SemanticType;
use headwater::preprocess::{
    self, ColumnData, ColumnInput, ForeignKeyInput, TableSpec, TaskInput, TaskTarget,
};

fn stype(s: &str) -> PyResult<SemanticType> {
    SemanticType::parse(s).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown semantic type {s:?}: expected one of identifier, numerical, timestamp, boolean, categorical, text, ignored"
        ))
    })
}

/// Arrays borrowed from Python for one column; kept alive while the core runs.
enum Held<'py> {
    None,
    F64(PyReadonlyArray1<'py, f64>, PyReadonlyArray1<'py, u8>),
    U8(PyReadonlyArray1<'py, u8>, PyReadonlyArray1<'py, u8>),
    I64(PyReadonlyArray1<'py, i64>, PyReadonlyArray1<'py, u8>),
    Cat(
        PyReadonlyArray1<'py, u32>,
        PyReadonlyArray1<'py, u8>,
        Vec<String>,
    ),
    TextIds(PyReadonlyArray1<'py, u32>, PyReadonlyArray1<'py, u8>),
}

fn slice<'a, T: numpy::Element>(a: &'a PyReadonlyArray1<'_, T>, what: &str) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|_| PyValueError::new_err(format!("{what}: array must be C-contiguous")))
}

fn hold<'py>(
    st: SemanticType,
    values: Option<Bound<'py, PyAny>>,
    valid: Option<Bound<'py, PyAny>>,
    extra: Option<Bound<'py, PyAny>>,
    what: &str,
) -> PyResult<Held<'py>> {
    if !st.is_stored() {
        return Ok(Held::None);
    }
    let values = values.ok_or_else(|| PyValueError::new_err(format!("{what}: values missing")))?;
    let valid: PyReadonlyArray1<u8> = valid
        .ok_or_else(|| PyValueError::new_err(format!("{what}: validity missing")))?
        .extract()?;
    Ok(match st {
        SemanticType::Numerical => Held::F64(values.extract()?, valid),
        SemanticType::Boolean => Held::U8(values.extract()?, valid),
        SemanticType::Timestamp => Held::I64(values.extract()?, valid),
        SemanticType::Categorical => {
            let cats: Vec<String> = extra
                .ok_or_else(|| PyValueError::new_err(format!("{what}: categories missing")))?
                .extract()?;
            Held::Cat(values.extract()?, valid, cats)
        }
        // Text values are interned a chunk at a time (`intern_texts`); the
        // column then carries their ids.
        SemanticType::Text => {
            if extra.is_some() {
                return Err(PyValueError::new_err(format!(
                    "{what}: a text column takes ids from intern_texts, not a dictionary"
                )));
            }
            Held::TextIds(values.extract()?, valid)
        }
        _ => unreachable!(),
    })
}

fn data<'a>(h: &'a Held<'_>, what: &str) -> PyResult<ColumnData<'a>> {
    Ok(match h {
        Held::None => ColumnData::Unstored,
        Held::F64(v, ok) => ColumnData::Numerical {
            values: slice(v, what)?,
            valid: slice(ok, what)?,
        },
        Held::U8(v, ok) => ColumnData::Boolean {
            values: slice(v, what)?,
            valid: slice(ok, what)?,
        },
        Held::I64(v, ok) => ColumnData::Timestamp {
            values: slice(v, what)?,
            valid: slice(ok, what)?,
        },
        Held::Cat(v, ok, cats) => ColumnData::Categorical {
            codes: slice(v, what)?,
            valid: slice(ok, what)?,
            categories: cats.clone(),
        },
        Held::TextIds(v, ok) => ColumnData::TextIds {
            ids: slice(v, what)?,
            valid: slice(ok, what)?,
        },
    })
}

type FkTuple<'py> = (String, String, PyReadonlyArray1<'py, i64>, u64, u64);

/// Builds a database directory from typed column arrays.
#[pyclass(module = "headwater._native")]
pub struct DatabaseWriter {
    inner: Option<preprocess::DatabaseWriter>,
}

impl DatabaseWriter {
    fn w(&mut self) -> PyResult<&mut preprocess::DatabaseWriter> {
        self.inner
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("DatabaseWriter already finished"))
    }
}

#[pymethods]
impl DatabaseWriter {
    #[new]
    fn new(
        py: Python<'_>,
        out_dir: std::path::PathBuf,
        source: String,
        embedder: String,
        dim: u32,
    ) -> PyResult<Self> {
        let w = py
            .detach(|| preprocess::DatabaseWriter::new(&out_dir, &source, &embedder, dim))
            .map_err(to_py)?;
        Ok(DatabaseWriter { inner: Some(w) })
    }

    /// Reuse the next table from an interrupted run when its fingerprint matches.
    fn resume_table(&mut self, py: Python<'_>, fingerprint: &str) -> PyResult<bool> {
        let w = self.w()?;
        py.detach(|| w.resume_table(fingerprint)).map_err(to_py)
    }

    /// Start the next table; its columns follow one at a time.
    #[pyo3(signature = (name, num_rows, primary_key, time_column, fingerprint, num_stored))]
    #[allow(clippy::too_many_arguments)]
    fn begin_table(
        &mut self,
        py: Python<'_>,
        name: String,
        num_rows: usize,
        primary_key: Option<String>,
        time_column: Option<String>,
        fingerprint: String,
        num_stored: usize,
    ) -> PyResult<()> {
        let spec = TableSpec {
            name,
            num_rows,
            primary_key,
            time_column,
            fingerprint,
            num_stored,
        };
        let w = self.w()?;
        py.detach(|| w.begin_table(spec)).map_err(to_py)
    }

    /// Leave the rows dated after `cutoff_us` (µs since the epoch: the
    /// validation cutoff) out of every statistic; before the first table.
    fn set_stats_cutoff(&mut self, cutoff_us: i64) -> PyResult<()> {
        self.w()?.set_stats_cutoff(cutoff_us).map_err(to_py)
    }

    /// The open table's row times, before its first column (with a
    /// statistics cutoff they pick the rows its statistics come from).
    fn set_row_times<'py>(
        &mut self,
        py: Python<'py>,
        row_time: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<()> {
        let row_time = slice(&row_time, "row_time")?;
        let w = self.w()?;
        py.detach(|| w.set_row_times(row_time)).map_err(to_py)
    }

    /// Encode and write one column of the open table.
    #[pyo3(signature = (name, stype, source_type, inferred, values=None, valid=None, extra=None))]
    #[allow(clippy::too_many_arguments)]
    fn add_column<'py>(
        &mut self,
        py: Python<'py>,
        name: String,
        stype: &str,
        source_type: String,
        inferred: bool,
        values: Option<Bound<'py, PyAny>>,
        valid: Option<Bound<'py, PyAny>>,
        extra: Option<Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let st = self::stype(stype)?;
        let h = hold(st, values, valid, extra, &name)?;
        let input = ColumnInput {
            data: data(&h, &name)?,
            name,
            stype: st,
            source_type,
            inferred,
        };
        let w = self.w()?;
        py.detach(|| w.add_column(input)).map_err(to_py)
    }

    /// Finish the open table with its row times and foreign keys.
    fn end_table<'py>(
        &mut self,
        py: Python<'py>,
        row_time: PyReadonlyArray1<'py, i64>,
        foreign_keys: Vec<FkTuple<'py>>,
    ) -> PyResult<()> {
        let mut fks = Vec::with_capacity(foreign_keys.len());
        for (column, references, parents, num_null, num_dangling) in &foreign_keys {
            fks.push(ForeignKeyInput {
                column: column.clone(),
                references: references.clone(),
                parents: slice(parents, column)?,
                num_null: *num_null,
                num_dangling: *num_dangling,
            });
        }
        let row_time = slice(&row_time, "row_time")?;
        let w = self.w()?;
        py.detach(|| w.end_table(row_time, &fks)).map_err(to_py)
    }

    #[pyo3(signature = (name, table, column, description=None))]
    fn add_cell_task(
        &mut self,
        py: Python<'_>,
        name: &str,
        table: &str,
        column: &str,
        description: Option<String>,
    ) -> PyResult<()> {
        let w = self.w()?;
        py.detach(|| w.add_cell_task(name, table, column, description))
            .map_err(to_py)
    }

    #[pyo3(signature = (name, label_time_column=None, label_columns=Vec::new()))]
    fn set_label_rule(
        &mut self,
        py: Python<'_>,
        name: &str,
        label_time_column: Option<String>,
        label_columns: Vec<String>,
    ) -> PyResult<()> {
        let w = self.w()?;
        let cols: Vec<&str> = label_columns.iter().map(String::as_str).collect();
        py.detach(|| w.set_label_rule(name, label_time_column.as_deref(), &cols))
            .map_err(to_py)
    }

    fn set_window(&mut self, py: Python<'_>, name: &str, window_us: i64) -> PyResult<()> {
        let w = self.w()?;
        py.detach(|| w.set_window(name, window_us)).map_err(to_py)
    }

    /// Link task `name`'s share of its training positives the candidate
    /// generator found.
    fn set_candidate_recall(&mut self, name: &str, share: f64) -> PyResult<()> {
        self.w()?.set_candidate_recall(name, share).map_err(to_py)
    }

    /// Table `name` (added) is reached only as a seed: no reverse edge
    /// leads into its rows.
    fn set_seed_only(&mut self, name: &str) -> PyResult<()> {
        self.w()?.set_seed_only(name).map_err(to_py)
    }

    #[pyo3(signature = (name, kind, anchor_table, anchor_rows, obs_time, target_stype, values, valid, categories=None, query=None, description=None, splits=None))]
    #[allow(clippy::too_many_arguments)]
    fn add_task<'py>(
        &mut self,
        py: Python<'py>,
        name: String,
        kind: String,
        anchor_table: String,
        anchor_rows: PyReadonlyArray1<'py, u32>,
        obs_time: PyReadonlyArray1<'py, i64>,
        target_stype: &str,
        values: Bound<'py, PyAny>,
        valid: Bound<'py, PyAny>,
        categories: Option<Bound<'py, PyAny>>,
        query: Option<String>,
        description: Option<String>,
        splits: Option<PyReadonlyArray1<'py, u8>>,
    ) -> PyResult<()> {
        let st = stype(target_stype)?;
        let what = format!("task `{name}` target");
        let h = hold(st, Some(values), Some(valid), categories, &what)?;
        let input = TaskInput {
            name,
            kind,
            anchor_table,
            anchor_rows: slice(&anchor_rows, "anchor_rows")?,
            obs_time: slice(&obs_time, "obs_time")?,
            target: TaskTarget::Values {
                stype: st,
                data: data(&h, &what)?,
            },
            query,
            description,
            splits: match &splits {
                Some(a) => Some(slice(a, "splits")?),
                None => None,
            },
        };
        let w = self.w()?;
        py.detach(|| w.add_task(input)).map_err(to_py)
    }

    fn num_tables(&mut self) -> PyResult<usize> {
        Ok(self.w()?.num_tables())
    }
    fn num_resumed(&mut self) -> PyResult<usize> {
        Ok(self.w()?.num_resumed())
    }
    fn column_texts(&mut self) -> PyResult<Vec<String>> {
        Ok(self.w()?.column_texts())
    }
    fn category_texts(&mut self) -> PyResult<Vec<String>> {
        Ok(self.w()?.category_texts().to_vec())
    }
    /// Global ids of a chunk's text dictionary (Arrow `large_string`
    /// offsets and bytes), interned for the open table's next column.
    fn intern_texts<'py>(
        &mut self,
        py: Python<'py>,
        offsets: PyReadonlyArray1<'_, i64>,
        bytes: PyReadonlyArray1<'_, u8>,
    ) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
        let ids = self
            .w()?
            .intern_texts(slice(&offsets, "offsets")?, slice(&bytes, "bytes")?)
            .map_err(to_py)?;
        Ok(numpy::PyArray1::from_vec(py, ids))
    }
    fn num_text_values(&mut self) -> PyResult<usize> {
        Ok(self.w()?.num_text_values())
    }
    /// Distinct text values `start..stop` (clamped), in embedding order: the
    /// embedding loop takes them a chunk at a time, never the whole list.
    fn text_values(&mut self, start: usize, stop: usize) -> PyResult<Vec<String>> {
        Ok(self
            .w()?
            .text_values(start, stop)
            .map(str::to_owned)
            .collect())
    }
    /// Metadata of the columns added so far, as JSON (for the front end's report).
    fn columns_json(&mut self) -> PyResult<String> {
        Ok(serde_json::to_string(self.w()?.columns()).expect("serialisable"))
    }

    /// Write graph, embeddings and metadata; publish. Returns metadata JSON.
    #[pyo3(signature = (column_embeddings, categorical_embeddings, text_embeddings, overwrite=false))]
    fn finish(
        &mut self,
        py: Python<'_>,
        column_embeddings: PyReadonlyArray2<'_, f16>,
        categorical_embeddings: PyReadonlyArray2<'_, f16>,
        text_embeddings: PyReadonlyArray2<'_, f16>,
        overwrite: bool,
    ) -> PyResult<String> {
        let w = self
            .inner
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("DatabaseWriter already finished"))?;
        let c = column_embeddings
            .as_slice()
            .map_err(|_| PyValueError::new_err("column_embeddings must be C-contiguous"))?;
        let k = categorical_embeddings
            .as_slice()
            .map_err(|_| PyValueError::new_err("categorical_embeddings must be C-contiguous"))?;
        let t = text_embeddings
            .as_slice()
            .map_err(|_| PyValueError::new_err("text_embeddings must be C-contiguous"))?;
        let meta = py.detach(|| w.finish(c, k, t, overwrite)).map_err(to_py)?;
        Ok(serde_json::to_string(&meta).expect("serialisable"))
    }
}

/// Deterministic offline embeddings: `f16 [len(texts), dim]`.
#[pyfunction]
pub fn hash_embed(
    py: Python<'_>,
    texts: Vec<String>,
    dim: usize,
) -> PyResult<Bound<'_, PyArray2<f16>>> {
    if dim == 0 || dim > 65_536 {
        return Err(PyValueError::new_err(format!(
            "dim must be in 1..=65536, got {dim}"
        )));
    }
    let n = texts.len();
    let flat = py.detach(|| preprocess::hash_embed(&texts, dim));
    PyArray1::from_vec(py, flat).reshape([n, dim])
}
