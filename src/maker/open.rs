//! Opening a mixture's databases: the names they go by, the open errors
//! that name the database, and `on_bad_database = "skip"`, which drops a
//! database that fails to open and shares its weight out.
//!
//! A dropped database keeps its place in the naming (the others keep the
//! names they have in the full list, `#2` suffixes included), leaves the
//! config keys that name it (`database_weights`, `task_weights` of its
//! tasks, `telemetry_databases`) and is listed in
//! [`SamplerCore::dropped`], the merged metadata and the saved state; a
//! state that dropped it drops it again on resume, so a database that
//! opens again later does not change what the resumed run delivers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::checks::in_database;
use super::SamplerCore;
use crate::config::{OnBadDatabase, SamplerConfig, TaskWeights};
use crate::error::{Error, Result};
use crate::format::Database;

/// A database of the mixture that was dropped at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedDatabase {
    /// Its name in the mixture.
    pub name: String,
    /// Why (the open error, or that the restored state had dropped it).
    pub reason: String,
}

impl SamplerCore {
    /// Open every database of `paths` (named by their folder names, made
    /// unique with `#2`, `#3`, … when two are equal) and prepare sampling
    /// the mixture with `cfg`. An open error names the database; the
    /// databases opened before it are closed (their maps dropped) before
    /// the error is returned, unless `on_bad_database` is `skip`.
    pub fn open_mixture(paths: &[PathBuf], cfg: SamplerConfig) -> Result<Self> {
        Self::open_mixture_dropping(paths, cfg, &[])
    }

    /// [`open_mixture`](Self::open_mixture), dropping the databases named
    /// in `already` (those a restored state had dropped) without opening
    /// them.
    pub fn open_mixture_dropping(
        paths: &[PathBuf],
        mut cfg: SamplerConfig,
        already: &[String],
    ) -> Result<Self> {
        let t0 = Instant::now();
        if paths.is_empty() {
            return Err(Error::invalid(
                "databases",
                "a mixture needs at least one database".to_string(),
            ));
        }
        let names = database_names(paths);
        if let Some(n) = already.iter().find(|n| !names.contains(n)) {
            return Err(Error::State {
                field: "dropped_databases".into(),
                what: format!("the state dropped `{n}`, which is not in this mixture {names:?}"),
            });
        }
        let mut dbs = Vec::with_capacity(paths.len());
        let mut dropped = Vec::new();
        for (name, path) in names.iter().cloned().zip(paths) {
            if already.contains(&name) {
                let reason = "dropped by the run this state was saved from".to_string();
                dropped.push(DroppedDatabase { name, reason });
                continue;
            }
            match open_one(path, &name, &cfg) {
                Ok(db) => dbs.push((name, Arc::new(db))),
                Err(e) if cfg.on_bad_database == OnBadDatabase::Skip => {
                    let reason = in_database(&name, e).to_string();
                    dropped.push(DroppedDatabase { name, reason });
                }
                Err(e) => return Err(in_database(&name, e)),
            }
        }
        for d in &dropped {
            super::tracing_warn(&format!(
                "database `{}` is dropped from the mixture: {}",
                d.name, d.reason
            ));
        }
        if dbs.is_empty() {
            return Err(Error::invalid(
                "databases",
                format!(
                    "every database of the mixture was dropped ({})",
                    dropped
                        .iter()
                        .map(|d| d.reason.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            ));
        }
        if !dropped.is_empty() {
            let gone: Vec<&str> = dropped.iter().map(|d| d.name.as_str()).collect();
            forget_databases(&mut cfg, &names, &gone)?;
        }
        let mut core = Self::prepare(dbs, cfg, paths.len() > 1)?;
        core.dropped = dropped;
        core.startup_seconds = t0.elapsed().as_secs_f64();
        Ok(core)
    }
}

/// Open one database, staged first when `stage_dir` is set.
fn open_one(path: &Path, name: &str, cfg: &SamplerConfig) -> Result<Database> {
    let path = match &cfg.stage_dir {
        None => path.to_path_buf(),
        Some(dir) => {
            let t0 = Instant::now();
            let staged = crate::format::stage(path, Path::new(dir))?;
            if staged.copied_bytes > 0 {
                super::tracing_info(&format!(
                    "staged database `{name}` ({:.1} MiB, verified) to {} in {:.1} s",
                    staged.copied_bytes as f64 / 1_048_576.0,
                    staged.path.display(),
                    t0.elapsed().as_secs_f64()
                ));
            }
            staged.path
        }
    };
    Database::open_for(&path, cfg.verify, cfg.page_cache)
}

/// Remove the dropped databases `gone` (of the mixture `all`) from the keys
/// that name them, so the rest resolve as if the mixture never held them;
/// a weight list loses their entries (checked against `all` first).
fn forget_databases(cfg: &mut SamplerConfig, all: &[String], gone: &[&str]) -> Result<()> {
    let kept = |n: &str| !gone.contains(&n);
    if matches!(cfg.database_weights, Some(TaskWeights::List(_))) {
        // Checked against the full mixture, so an error names its length.
        cfg.database_weights_for(all)?;
    }
    match &mut cfg.database_weights {
        Some(TaskWeights::List(w)) => {
            let mut i = 0;
            w.retain(|_| {
                i += 1;
                kept(&all[i - 1])
            });
        }
        Some(TaskWeights::ByName(m)) => m.retain(|k, _| kept(k)),
        None => {}
    }
    if let Some(TaskWeights::ByName(m)) = &mut cfg.task_weights {
        m.retain(|k, _| k.split_once('/').is_none_or(|(db, _)| kept(db)));
    }
    cfg.telemetry_databases.retain(|n| kept(n));
    Ok(())
}

/// The mixture names of `paths`: folder names, `#2`, `#3`, … on repeats.
pub(super) fn database_names(paths: &[PathBuf]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        let base = p
            .file_name()
            .map_or_else(|| format!("db{i}"), |n| n.to_string_lossy().into_owned());
        let mut name = base.clone();
        let mut n = 1;
        while out.contains(&name) {
            n += 1;
            name = format!("{base}#{n}");
        }
        out.push(name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_folders_get_numbered_names() {
        let paths: Vec<PathBuf> = ["a/x", "b/y", "c/x", "d/x"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(database_names(&paths), ["x", "y", "x#2", "x#3"]);
    }

    #[test]
    fn a_dropped_database_leaves_the_keys_that_name_it() {
        let all: Vec<String> = ["a", "b", "c"].iter().map(|s| (*s).to_string()).collect();
        let mut cfg = SamplerConfig {
            database_weights: Some(TaskWeights::List(vec![1.0, 5.0, 3.0])),
            task_weights: Some(TaskWeights::ByName(
                [("b/t".to_string(), 2.0), ("c/t".to_string(), 4.0)]
                    .into_iter()
                    .collect(),
            )),
            telemetry_databases: vec!["b".into(), "c".into()],
            ..SamplerConfig::default()
        };
        forget_databases(&mut cfg, &all, &["b"]).unwrap();
        assert_eq!(
            cfg.database_weights,
            Some(TaskWeights::List(vec![1.0, 3.0]))
        );
        let Some(TaskWeights::ByName(m)) = &cfg.task_weights else {
            panic!("by name")
        };
        assert_eq!(m.keys().collect::<Vec<_>>(), ["c/t"]);
        assert_eq!(cfg.telemetry_databases, ["c"]);
        // A list of the wrong length is reported against the full mixture.
        let mut short = SamplerConfig {
            database_weights: Some(TaskWeights::List(vec![1.0, 5.0])),
            ..SamplerConfig::default()
        };
        let e = forget_databases(&mut short, &all, &["b"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 weights for 3 databases"), "{e}");
    }
}
