//! The PyO3 binding layer: the only place pyo3 appears.
//!
//! Each method converts its arguments, calls one core function with the GIL
//! released, and converts the result. No domain logic lives here. Errors map
//! onto a Python exception hierarchy rooted at `HeadwaterError`.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};

use headwater::error::Error;

/// How long a blocked wait (for a batch, or for a split's or a pass's turn)
/// sleeps with the GIL released between checks for Ctrl-C.
pub(crate) const WAKE: std::time::Duration = std::time::Duration::from_millis(50);

/// The extension's allocator. A batch's tensors (a few MB) are allocated by
/// the sampler's worker threads and freed by whoever drops the NumPy arrays;
/// glibc returns such memory to the kernel once a thread's free space passes
/// its trim threshold, so every batch paid page faults and kernel zeroing of
/// fresh pages on top of its own writes (about 10 % of a batch's time on two
/// threads, measured with `perf`). mimalloc keeps freed pages for reuse.
/// Only the extension sets it: the Rust library leaves the choice to its
/// users.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod batch;
mod bench;
mod config;
mod database;
mod eval;
mod sampler;
mod telemetry;
mod writer;

create_exception!(
    headwater.errors,
    HeadwaterError,
    PyException,
    "Base class of every headwater error."
);
create_exception!(
    headwater.errors,
    FormatError,
    HeadwaterError,
    "A database file is truncated, corrupt, or of an unsupported version."
);
create_exception!(
    headwater.errors,
    SchemaError,
    HeadwaterError,
    "The relational input cannot become a database (schema or data problem)."
);
/// `ConfigError(HeadwaterError, ValueError)`: two bases, so it is made with
/// Python's `type()` once, at first use.
static CONFIG_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn config_error(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    CONFIG_ERROR
        .get_or_try_init(py, || {
            let ns = PyDict::new(py);
            ns.set_item("__module__", "headwater.errors")?;
            ns.set_item(
                "__doc__",
                "A configuration key is unknown or has a bad value (names the key, \
                 the value and the allowed range). Raised by the core, it carries \
                 them as attributes: `key`, `value` (the offending value as given, \
                 or None for an unknown key or a failure of the setting as a whole) \
                 and `what` (the message after the key); all None when raised by \
                 Python code that names no key. When several keys are bad, \
                 `errors` lists one ConfigError per key (the attributes above are \
                 the first's); else it is None.",
            )?;
            for field in ["key", "value", "what", "errors"] {
                ns.set_item(field, py.None())?;
            }
            let bases = PyTuple::new(
                py,
                [
                    py.get_type::<HeadwaterError>().into_any(),
                    py.get_type::<PyValueError>().into_any(),
                ],
            )?;
            let t = py
                .import("builtins")?
                .getattr("type")?
                .call1(("ConfigError", bases, ns))?;
            Ok(t.cast_into::<PyType>()?.unbind())
        })
        .map(|t| t.bind(py))
}

/// A Python object from a JSON value (via `json.loads`, once per call).
pub(crate) fn json_to_py<'py>(
    py: Python<'py>,
    v: &serde_json::Value,
) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (v.to_string(),))
}

create_exception!(
    headwater.errors,
    StateError,
    HeadwaterError,
    "A saved sampler state cannot be restored (other snapshot, config or version); \
     `field` names the state field that does not fit and `what` says how."
);
create_exception!(
    headwater.errors,
    SamplerShutdown,
    HeadwaterError,
    "The sampler was shut down; no more batches."
);
create_exception!(
    headwater.errors,
    WorkerError,
    HeadwaterError,
    "A sampler producer thread failed or panicked."
);
create_exception!(
    headwater.errors,
    ResourceError,
    HeadwaterError,
    "A resource limit such as max_rss_bytes would be exceeded."
);

/// `t(msg)` with `fields` set as attributes of the instance: an error
/// carries its fields, so nobody parses its message.
fn with_fields(t: &Bound<'_, PyType>, msg: String, fields: &[(&str, Option<&str>)]) -> PyErr {
    let make = || -> PyResult<PyErr> {
        let exc = t.call1((msg,))?;
        for (name, v) in fields {
            exc.setattr(*name, *v)?;
        }
        Ok(PyErr::from_value(exc))
    };
    make().unwrap_or_else(|e| e)
}

/// [`Error::Configs`] as one `ConfigError`: the first key's `key`, `value`
/// and `what`, and `errors`, one `ConfigError` per bad key.
fn configs_error(py: Python<'_>, msg: String, errors: Vec<Error>) -> PyErr {
    let make = || -> PyResult<PyErr> {
        let each: Vec<Py<PyAny>> = errors
            .into_iter()
            .map(|e| to_py(e).into_value(py).into_any())
            .collect();
        let first = each[0].bind(py);
        let exc = config_error(py)?.call1((msg,))?;
        for field in ["key", "value", "what"] {
            exc.setattr(field, first.getattr(field)?)?;
        }
        exc.setattr("errors", PyList::new(py, each)?)?;
        Ok(PyErr::from_value(exc))
    };
    make().unwrap_or_else(|e| e)
}

/// Convert a core error into the matching Python exception.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        Error::Io { .. } => PyOSError::new_err(msg),
        Error::Format { .. } | Error::Version { .. } => FormatError::new_err(msg),
        Error::Config { key, value, what } => Python::attach(|py| match config_error(py) {
            Ok(t) => with_fields(
                t,
                msg,
                &[
                    ("key", Some(&key)),
                    ("value", value.as_deref()),
                    ("what", Some(&what)),
                ],
            ),
            Err(e) => e,
        }),
        Error::Configs(errors) => Python::attach(|py| configs_error(py, msg, errors)),
        Error::State { field, what } => Python::attach(|py| {
            let t = py.get_type::<StateError>();
            with_fields(&t, msg, &[("field", Some(&field)), ("what", Some(&what))])
        }),
        Error::InvalidArgument { .. } => PyValueError::new_err(msg),
        Error::Preprocess(_) => SchemaError::new_err(msg),
        Error::Shutdown => SamplerShutdown::new_err(msg),
        Error::Worker(_) => WorkerError::new_err(msg),
        Error::Resource(_) => ResourceError::new_err(msg),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("HeadwaterError", py.get_type::<HeadwaterError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("SchemaError", py.get_type::<SchemaError>())?;
    m.add("ConfigError", config_error(py)?)?;
    let state_error = py.get_type::<StateError>();
    for field in ["field", "what"] {
        state_error.setattr(field, py.None())?;
    }
    m.add("StateError", state_error)?;
    m.add("SamplerShutdown", py.get_type::<SamplerShutdown>())?;
    m.add("WorkerError", py.get_type::<WorkerError>())?;
    m.add("ResourceError", py.get_type::<ResourceError>())?;
    m.add("BATCH_KEYS", headwater::batch::batch_keys())?;
    m.add("FORMAT_VERSION", headwater::format::FORMAT_VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<database::Database>()?;
    m.add_class::<writer::DatabaseWriter>()?;
    m.add_class::<sampler::Sampler>()?;
    m.add_class::<eval::EvalPass>()?;
    m.add("TELEMETRY_PREFIX", headwater::telemetry::PREFIX)?;
    m.add_function(wrap_pyfunction!(sampler::batch_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(telemetry::metric_table, m)?)?;
    m.add_function(wrap_pyfunction!(telemetry::trainer_gauges, m)?)?;
    m.add_function(wrap_pyfunction!(config::sampler_config_schema, m)?)?;
    m.add_function(wrap_pyfunction!(config::validate_sampler_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::step_shapes, m)?)?;
    m.add_function(wrap_pyfunction!(telemetry::telemetry_schema_for, m)?)?;
    m.add_function(wrap_pyfunction!(writer::hash_embed, m)?)?;
    m.add_function(wrap_pyfunction!(bench::bench_sampler, m)?)?;
    m.add_function(wrap_pyfunction!(bench::ranker_recall, m)?)?;
    m.add_function(wrap_pyfunction!(bench::peak_rss_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(database::verify_database, m)?)?;
    Ok(())
}
