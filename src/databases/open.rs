//! Opening a mixture's databases: the names they go by, opening one
//! (staged first when `stage_dir` is set), and what `on_bad_database =
//! "skip"` needs to drop a database that fails to open and share its weight
//! out. The open of a whole mixture into a sampler core is the maker's
//! (`SamplerCore::open_mixture`, `crate::maker`'s `open.rs`).
//!
//! A dropped database keeps its place in the naming (the others keep the
//! names they have in the full list, `#2` suffixes included) and leaves the
//! config keys that name it (`database_weights`, `task_weights` of its
//! tasks, `telemetry_databases`: [`forget_databases`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::{SamplerConfig, TaskWeights};
use crate::error::Result;
use crate::format::Database;
use crate::say::info;

/// A database of the mixture that was dropped at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedDatabase {
    /// Its name in the mixture.
    pub name: String,
    /// Why (the open error, or that the restored state had dropped it).
    pub reason: String,
}

/// Open one database, staged first when `stage_dir` is set.
pub(crate) fn open_one(path: &Path, name: &str, cfg: &SamplerConfig) -> Result<Database> {
    let path = match &cfg.stage_dir {
        None => path.to_path_buf(),
        Some(dir) => {
            let t0 = Instant::now();
            let staged = crate::format::stage(path, Path::new(dir))?;
            if staged.copied_bytes > 0 {
                info(&format!(
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
pub(crate) fn forget_databases(
    cfg: &mut SamplerConfig,
    all: &[String],
    gone: &[&str],
) -> Result<()> {
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
pub(crate) fn database_names(paths: &[PathBuf]) -> Vec<String> {
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
