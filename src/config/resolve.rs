//! Sampler values resolved against a database or a mixture: task weights
//! (a list, or by name with unlisted tasks at 1), database weights and the
//! telemetry databases by name.
//!
//! Invariants: a name that is not a task or database of what is sampled is
//! an [`Error::Config`] naming the key, the name and what exists. Never:
//! accept a weight list whose length does not match.

use super::{bad, SamplerConfig, TaskWeights};
use crate::error::{Error, Result};

impl SamplerConfig {
    /// The task weights in metadata order for a database with `task_names`
    /// (uniform when unset); an unknown task name is a config error.
    pub fn weights_for(&self, task_names: &[String]) -> Result<Vec<f64>> {
        match &self.task_weights {
            None => Ok(vec![1.0; task_names.len()]),
            Some(TaskWeights::List(w)) => Ok(w.clone()),
            Some(TaskWeights::ByName(m)) => {
                if let Some(k) = m.keys().find(|k| !task_names.contains(k)) {
                    return Err(Error::config(
                        "task_weights",
                        format!("unknown task {k:?}; the database's tasks are {task_names:?}"),
                    ));
                }
                Ok(task_names
                    .iter()
                    .map(|t| m.get(t).copied().unwrap_or(1.0))
                    .collect())
            }
        }
    }

    /// The effective database weights of a mixture of `db_names` (uniform
    /// when unset): a list must have one weight per database, names must be
    /// databases of the mixture, and at least one weight must be > 0.
    pub fn database_weights_for(&self, db_names: &[String]) -> Result<Vec<f64>> {
        let w = match &self.database_weights {
            None => vec![1.0; db_names.len()],
            Some(TaskWeights::List(w)) => {
                if w.len() != db_names.len() {
                    return Err(bad(
                        "database_weights",
                        format!(
                            "{} weights for {} databases {db_names:?}",
                            w.len(),
                            db_names.len()
                        ),
                    ));
                }
                w.clone()
            }
            Some(TaskWeights::ByName(m)) => {
                if let Some(k) = m.keys().find(|k| !db_names.contains(k)) {
                    return Err(Error::config(
                        "database_weights",
                        format!("unknown database {k:?}; the mixture's databases are {db_names:?}"),
                    ));
                }
                db_names
                    .iter()
                    .map(|d| m.get(d).copied().unwrap_or(1.0))
                    .collect()
            }
        };
        if let Some(x) = w.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(bad("database_weights", format!("a weight of {x}")));
        }
        if w.iter().all(|&x| x == 0.0) {
            return Err(bad("database_weights", "all weights 0"));
        }
        Ok(w)
    }

    /// The mixture indices of the `telemetry_databases` of a mixture of
    /// `db_names`, in the order listed; `None` when the list is empty (the
    /// top `telemetry_top_databases` by weight report instead). A name that
    /// is not a database of the mixture is a config error naming it and
    /// the mixture's databases.
    pub fn telemetry_databases_for(&self, db_names: &[String]) -> Result<Option<Vec<usize>>> {
        if self.telemetry_databases.is_empty() {
            return Ok(None);
        }
        self.telemetry_databases
            .iter()
            .map(|name| {
                db_names.iter().position(|d| d == name).ok_or_else(|| {
                    Error::config(
                        "telemetry_databases",
                        format!(
                            "unknown database {name:?}; the mixture's databases are {db_names:?}"
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    #[test]
    fn weights_by_name_fill_unlisted_tasks_and_name_unknown_ones() {
        let c =
            SamplerConfig::from_json(&serde_json::json!({"task_weights": {"t1": 3.0}})).unwrap();
        assert_eq!(c.weights_for(&names(3)).unwrap(), vec![1.0, 3.0, 1.0]);
        let c =
            SamplerConfig::from_json(&serde_json::json!({"task_weights": {"nope": 3.0}})).unwrap();
        let e = c.validate(Some(&names(2))).unwrap_err().to_string();
        assert!(e.contains("nope") && e.contains("task_weights"), "{e}");
    }
}
