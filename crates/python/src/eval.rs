//! `EvalPass`: a finite evaluation pass as a Python iterator of batch dicts.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::batch::batch_dict;
use super::{to_py, WAKE};
use headwater::sampler;
use headwater::seeds::Split;

/// An ordered pass over every seed of a val/test split on this rank (see
/// `src/sampler/eval.rs` for the shard rule); iterate it for batch dicts
/// whose `seq_valid` marks the sequences to score. Each batch taken is
/// recorded in the split's telemetry (`drain_step_metrics(split)`, the
/// Prometheus series labelled with the split). Threads may share one pass:
/// each batch goes to exactly one caller, in pass order; a caller waiting
/// for another's batch to be built wakes to check signals.
#[pyclass(module = "headwater._native", frozen)]
pub struct EvalPass {
    /// Taken (with a timeout) before `inner`, so waiters can check signals.
    gate: sampler::Gate,
    inner: Mutex<sampler::EvalPass>,
    len: usize,
}

impl EvalPass {
    /// A pass over `split` (`"val"`/`"test"`) of task `task` (a name; all when `None`).
    pub(super) fn open(
        sampler: &sampler::Sampler,
        split: &str,
        task: Option<&str>,
        max_seeds: Option<i64>,
    ) -> PyResult<Self> {
        let Some(split @ (Split::Val | Split::Test)) = Split::parse(split) else {
            return Err(PyValueError::new_err(format!(
                "invalid argument `split`: {split:?}, expected \"val\" or \"test\""
            )));
        };
        let tasks = sampler.core().task_names();
        let task = task
            .map(|name| {
                tasks.iter().position(|t| t == name).ok_or_else(|| {
                    let names: Vec<&str> = tasks.iter().map(String::as_str).collect();
                    PyValueError::new_err(format!(
                        "invalid argument `task`: {name:?}, expected one of {names:?} or None"
                    ))
                })
            })
            .transpose()?;
        let max_seeds = max_seeds
            .map(|m| {
                usize::try_from(m).ok().filter(|&m| m > 0).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "invalid argument `max_seeds`: {m}, expected an integer >= 1 or None"
                    ))
                })
            })
            .transpose()?;
        let pass = sampler.eval_pass(split, task, max_seeds).map_err(to_py)?;
        let len = pass.len();
        Ok(EvalPass {
            gate: sampler::Gate::new(),
            inner: Mutex::new(pass),
            len,
        })
    }
}

#[pymethods]
impl EvalPass {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        loop {
            // `None`: another caller is building its batch; check signals.
            let next = py.detach(|| {
                let turn = self.gate.enter(Some(Instant::now() + WAKE), None).ok()??;
                let b = self
                    .inner
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .next();
                drop(turn);
                Some(b)
            });
            match next {
                None => py.check_signals()?,
                Some(None) => return Ok(None),
                Some(Some(b)) => {
                    return Ok(Some(batch_dict(
                        py,
                        b.map_err(to_py)?.batch,
                        &mut Vec::new(),
                    )?))
                }
            }
        }
    }

    /// Batches the whole pass yields (the same on every rank).
    fn __len__(&self) -> usize {
        self.len
    }

    /// Per task in pass order: `{"task", "seeds", "rank_seeds", "batches"}`
    /// (`seeds` over all ranks, `rank_seeds` this rank's share).
    fn tasks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let pass = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let out = PyList::empty(py);
        let names = pass.core().task_names();
        for t in pass.tasks() {
            let d = PyDict::new(py);
            d.set_item("task", names[t.task].as_str())?;
            d.set_item("seeds", t.list_len)?;
            d.set_item("rank_seeds", t.entries.len())?;
            d.set_item("batches", t.batches)?;
            out.append(d)?;
        }
        Ok(out)
    }
}
