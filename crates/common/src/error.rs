//! The crate's one error type.
//!
//! Every failure class has its own variant so callers (and the Python binding,
//! which maps variants onto an exception hierarchy) can tell them apart.
//! Messages name the offending value, what was expected, and the file.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every way a headwater operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        #[source]
        /// The OS error.
        source: std::io::Error,
    },
    /// A file exists but is not a valid headwater file (truncated, corrupt,
    /// wrong magic, unsupported version, inconsistent with metadata).
    #[error("{}: {what}", file.display())]
    Format {
        /// The file.
        file: PathBuf,
        /// What is wrong with it (with the offset when known).
        what: String,
    },
    /// The preprocessed database was written by a format version this build
    /// cannot read.
    #[error("{}: format version {found} is not supported (this build reads versions {min}..={max})", file.display())]
    Version {
        /// The file.
        file: PathBuf,
        /// The version it declares.
        found: u32,
        /// Oldest version this build reads.
        min: u32,
        /// Newest version this build reads.
        max: u32,
    },
    /// A configuration key has a bad value or is unknown.
    #[error("config `{key}`: {what}")]
    Config {
        /// The key.
        key: String,
        /// The offending value as given (JSON for a value read from a
        /// mapping), when one value is at fault; `None` for an unknown key
        /// or a failure of the setting as a whole.
        value: Option<String>,
        /// What is wrong: the value and the allowed range.
        what: String,
    },
    /// Several configuration keys are bad: one [`Error::Config`] per key, in
    /// key order (a config is checked whole, so every bad key is reported
    /// at once).
    #[error("{} bad config keys: {}", .0.len(), list_errors(.0))]
    Configs(Vec<Error>),
    /// A saved sampler state cannot be restored here: another format or
    /// version, another snapshot, or a config that changes the stream.
    #[error("sampler state `{field}`: {what}")]
    State {
        /// The state field that does not fit (`version`, `content_hash`,
        /// a stream config key, `splits.<split>.<field>`).
        field: String,
        /// What differs: the saved and the current value.
        what: String,
    },
    /// A function argument is outside its allowed range.
    #[error("invalid argument `{name}`: {what}")]
    InvalidArgument {
        /// The argument.
        name: String,
        /// What is wrong with it.
        what: String,
    },
    /// The relational input cannot be turned into a database (schema or data
    /// problem), naming table/column.
    #[error("{0}")]
    Preprocess(String),
    /// The sampler was shut down; no more batches.
    #[error("the sampler has been shut down")]
    Shutdown,
    /// A producer thread panicked or failed; the message says where.
    #[error("sampler worker failed: {0}")]
    Worker(String),
    /// A resource limit (e.g. `max_rss_bytes`) would be exceeded.
    #[error("resource limit: {0}")]
    Resource(String),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A malformed file: `what` is wrong with `file`.
    pub fn format(file: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Error::Format {
            file: file.into(),
            what: what.into(),
        }
    }

    /// A config error about `key` as a whole (an unknown key, a setting
    /// that cannot work here), naming no single value.
    pub fn config(key: impl Into<String>, what: impl Into<String>) -> Self {
        Error::Config {
            key: key.into(),
            value: None,
            what: what.into(),
        }
    }

    /// A config error about the value `value` of `key`.
    pub fn config_value(
        key: impl Into<String>,
        value: impl Into<String>,
        what: impl Into<String>,
    ) -> Self {
        Error::Config {
            key: key.into(),
            value: Some(value.into()),
            what: what.into(),
        }
    }

    /// `Ok` for no errors, the error for one, [`Error::Configs`] for several.
    pub fn all(mut errors: Vec<Error>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Configs(errors)),
        }
    }

    /// An invalid argument `name`: `what` is wrong with it.
    pub fn invalid(name: &str, what: impl Into<String>) -> Self {
        Error::InvalidArgument {
            name: name.to_string(),
            what: what.into(),
        }
    }
}

/// The errors of [`Error::Configs`], one per line.
fn list_errors(errors: &[Error]) -> String {
    use std::fmt::Write as _;
    errors.iter().fold(String::new(), |mut out, e| {
        let _ = write!(out, "\n  {e}");
        out
    })
}
