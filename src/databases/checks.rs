//! Checks on the databases a sampler is made from, before any plan: one
//! embedder across a mixture, distinct names, every task file intact (tasks
//! are read whole), and errors that name their database; a warning where a
//! task target's statistics assumed other split settings than the run's.

use std::sync::{Arc, Mutex, PoisonError};

use crate::config::SamplerConfig;
use crate::error::{Error, Result};
use crate::format::Database;
use crate::say::warn;

/// The databases (content hash) and split seeds [`warn_stats_split`] has
/// warned of in this process: a run that opens a sampler per evaluation
/// says it once.
static WARNED: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

/// Warn (rank 0, once per process, database and split seed) of each
/// database whose hash-split task targets' statistics left out the val/test
/// seeds of other split settings than `cfg`'s: some labels this run scores
/// fed them (docs/preprocessing.md).
pub(crate) fn warn_stats_split(dbs: &[(String, Arc<Database>)], cfg: &SamplerConfig) {
    if cfg.rank != 0 {
        return;
    }
    for (name, db) in dbs {
        let m = db.metadata();
        let tasks = m.targets_split_otherwise(cfg.split_seed, cfg.split_ratios);
        let (Some(rule), false) = (&m.stats_rule, tasks.is_empty()) else {
            continue;
        };
        let key = (db.content_hash().to_string(), cfg.split_seed);
        let mut warned = WARNED.lock().unwrap_or_else(PoisonError::into_inner);
        if warned.contains(&key) {
            continue;
        }
        warned.push(key);
        warn(&format!(
            "database `{name}`: the statistics of task target(s) {} left out the val/test seeds of split_seed {} with split_ratios {:?}; this run splits with split_seed {} and split_ratios {:?}, so some labels it scores fed them (docs/preprocessing.md, \"Statistics from the past only\")",
            tasks.join(", "),
            rule.split_seed,
            rule.split_ratios,
            cfg.split_seed,
            cfg.split_ratios
        ));
    }
}

/// A mixture needs at least one database, one embedder (name and
/// dimension) and unique database names.
pub(crate) fn check_mixture(dbs: &[(String, Arc<Database>)]) -> Result<()> {
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
    // Task files are not read here: a draw checks the blocks it reads, and
    // a seed list the blocks it is made from (`maker/pools.rs`).
    Ok(())
}

/// `e` with the name of the database it came from in its message.
pub(crate) fn in_database(name: &str, e: Error) -> Error {
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
