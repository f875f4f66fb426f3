//! Opening a sampler core from a mixture's folders: each database opened
//! by its name in the mixture (`crate::databases`), a failing one dropped
//! with `on_bad_database = "skip"` (and those a restored state had dropped
//! left closed), then the plan prepared from what opened.
//!
//! A dropped database keeps its place in the naming, leaves the config keys
//! that name it and is listed in [`SamplerCore::dropped`], the merged
//! metadata and the saved state; a state that dropped it drops it again on
//! resume, so a database that opens again later does not change what the
//! resumed run delivers. A database the run dropped mid-run (`drops.rs`)
//! kept its place in the numbering, and the state lists it among its
//! databases: the resume opens it (headers only: no payload of it is read)
//! and drops it in place again.

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
        Self::open_mixture_dropping(paths, cfg, &[], &[])
    }

    /// [`open_mixture`](Self::open_mixture), dropping the databases named
    /// in `already` (those a restored state had dropped): those also in
    /// `in_place` (dropped mid-run, so kept in the numbering) are opened
    /// and dropped in place, the others are not opened.
    pub fn open_mixture_dropping(
        paths: &[PathBuf],
        mut cfg: SamplerConfig,
        already: &[String],
        in_place: &[String],
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
            if in_place.contains(&name) {
                dbs.push((name.clone(), Arc::new(open_kept(path, &name, &cfg)?)));
                continue;
            }
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
        core.drop_kept(already, in_place)?;
        core.startup_seconds = t0.elapsed().as_secs_f64();
        Ok(core)
    }

    /// Drop in place the databases of `in_place`, in the order `already`
    /// (the state's list) names them.
    fn drop_kept(&self, already: &[String], in_place: &[String]) -> Result<()> {
        for name in already.iter().filter(|n| in_place.contains(n)) {
            let reason = "dropped mid-run by the run this state was saved from".to_string();
            warn(&format!(
                "database `{name}` is dropped from the mixture: {reason}"
            ));
            let d = self.dbs.iter().position(|d| &d.name == name);
            if !d.is_some_and(|d| self.drop_in_place(d, reason, false)) {
                return Err(Error::State {
                    field: "dropped_databases".into(),
                    what: format!(
                        "the state dropped `{name}` mid-run; this mixture cannot drop it"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Open database `name`, which the run a state was saved from dropped
/// mid-run: it keeps its place in the mixture's numbering, so it must open
/// (its headers only, whatever `verify` says: its payload is never read).
fn open_kept(
    path: &std::path::Path,
    name: &str,
    cfg: &SamplerConfig,
) -> Result<crate::format::Database> {
    let mut headers = cfg.clone();
    headers.verify = crate::format::Verify::Header;
    open_one(path, name, &headers).map_err(|e| Error::State {
        field: "dropped_databases".into(),
        what: format!(
            "the state dropped `{name}` mid-run, keeping its place in the mixture's numbering, \
             so it must still open to resume that run: {}",
            in_database(name, e)
        ),
    })
}
