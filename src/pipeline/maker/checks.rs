//! Checks on the databases a sampler is made from, before any plan: one
//! embedder across a mixture, distinct names, every task file intact (tasks
//! are read whole), and errors that name their database.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::Database;

/// A mixture needs at least one database, one embedder (name and
/// dimension), unique database names and intact task files.
pub(super) fn check_mixture(dbs: &[(String, Arc<Database>)]) -> Result<()> {
    let Some((first_name, first)) = dbs.first() else {
        return Err(Error::invalid(
            "databases",
            "a mixture needs at least one database".to_string(),
        ));
    };
    let emb = &first.metadata().embedder;
    for (name, db) in &dbs[1..] {
        let e = &db.metadata().embedder;
        if e != emb {
            return Err(Error::invalid(
                "databases",
                format!(
                    "database `{name}` was embedded with `{}` (dimension {}) but database `{first_name}` with `{}` (dimension {}); a mixture needs one embedder",
                    e.name, e.dim, emb.name, emb.dim
                ),
            ));
        }
    }
    if let Some(i) = (1..dbs.len()).find(|&i| dbs[..i].iter().any(|d| d.0 == dbs[i].0)) {
        return Err(Error::invalid(
            "databases",
            format!("two databases are named `{}`", dbs[i].0),
        ));
    }
    // Tasks are read whole (the seed pools): a corrupt one is named here.
    dbs.iter()
        .try_for_each(|(name, db)| db.check_tasks().map_err(|e| in_database(name, e)))
}

/// `e` with the name of the database it came from in its message.
pub(super) fn in_database(name: &str, e: Error) -> Error {
    match e {
        Error::Io { path, source } => Error::Io {
            path,
            source: std::io::Error::new(source.kind(), format!("database `{name}`: {source}")),
        },
        Error::Format { file, what } => Error::Format {
            file,
            what: format!("database `{name}`: {what}"),
        },
        Error::Version {
            file,
            found,
            min,
            max,
        } => Error::Format {
            file,
            what: format!(
                "database `{name}`: format version {found} is not supported \
                 (this build reads versions {min}..={max})"
            ),
        },
        other => other,
    }
}
