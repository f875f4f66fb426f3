//! The PyO3 binding layer: the only place pyo3 appears.
//!
//! Each method converts its arguments, calls one core function with the GIL
//! released, and converts the result. No domain logic lives here. Errors map
//! onto a Python exception hierarchy rooted at `HeadwaterError`.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::error::Error;

mod bench;
mod database;
mod sampler;
mod writer;

create_exception!(
    _native,
    HeadwaterError,
    PyException,
    "Base class of every headwater error."
);
create_exception!(
    _native,
    FormatError,
    HeadwaterError,
    "A database file is truncated, corrupt, or of an unsupported version."
);
create_exception!(
    _native,
    SchemaError,
    HeadwaterError,
    "The relational input cannot become a database (schema or data problem)."
);
create_exception!(
    _native,
    ConfigError,
    HeadwaterError,
    "A configuration key is unknown or has a bad value."
);

create_exception!(
    _native,
    StateError,
    HeadwaterError,
    "A saved sampler state cannot be restored (other snapshot, config or version)."
);
create_exception!(
    _native,
    SamplerShutdown,
    HeadwaterError,
    "The sampler was shut down; no more batches."
);
create_exception!(
    _native,
    WorkerError,
    HeadwaterError,
    "A sampler producer thread failed or panicked."
);
create_exception!(
    _native,
    ResourceError,
    HeadwaterError,
    "A resource limit such as max_rss_bytes would be exceeded."
);

/// Convert a core error into the matching Python exception.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        Error::Io { .. } => PyOSError::new_err(msg),
        Error::Format { .. } | Error::Version { .. } => FormatError::new_err(msg),
        Error::Config { .. } => ConfigError::new_err(msg),
        Error::State { .. } => StateError::new_err(msg),
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
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("StateError", py.get_type::<StateError>())?;
    m.add("SamplerShutdown", py.get_type::<SamplerShutdown>())?;
    m.add("WorkerError", py.get_type::<WorkerError>())?;
    m.add("ResourceError", py.get_type::<ResourceError>())?;
    m.add("BATCH_KEYS", crate::batch::BATCH_KEYS.to_vec())?;
    m.add("FORMAT_VERSION", crate::format::FORMAT_VERSION)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<database::Database>()?;
    m.add_class::<writer::DatabaseWriter>()?;
    m.add_class::<sampler::Sampler>()?;
    m.add_function(wrap_pyfunction!(writer::hash_embed, m)?)?;
    m.add_function(wrap_pyfunction!(bench::bench_sampler, m)?)?;
    m.add_function(wrap_pyfunction!(bench::peak_rss_bytes, m)?)?;
    Ok(())
}
