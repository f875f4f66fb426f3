//! Opening a sampler core from a mixture's folders: each database opened
//! by its name in the mixture (`crate::databases`), a failing one dropped
//! with `on_bad_database = "skip"` (and those a restored state had dropped
//! left closed), then the plan prepared from what opened.
//!
//! A dropped database keeps its place in the naming, leaves the config keys
//! that name it and is listed in [`SamplerCore::dropped`], the merged
//! metadata and the saved state; a state that dropped it drops it again on
//! resume, so a database that opens again later does not change what the
//! resumed run delivers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::SamplerCore;
use crate::config::{OnBadDatabase, SamplerConfig};
use crate::databases::{database_names, forget_databases, in_database, open_one, DroppedDatabase};
use crate::error::{Error, Result};
use crate::say::warn;

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
            warn(&format!(
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
