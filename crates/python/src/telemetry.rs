//! The metric table and telemetry schemas as Python lists of dicts.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use headwater::telemetry::{BucketRule, QuantileRule, TelemetrySchema, METRICS};

/// `telemetry_schema()`'s list: `[{"key", "reduction", "edges", "quantile",
/// "help", "prometheus", "unit"}]` (`edges`/`quantile` `None` for scalars).
pub(crate) fn schema_list<'py>(
    py: Python<'py>,
    schema: &TelemetrySchema,
) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for e in &schema.entries {
        let d = PyDict::new(py);
        d.set_item("key", &e.key)?;
        d.set_item("reduction", e.reduction.name())?;
        d.set_item("edges", e.edges.as_deref().map(<[f64]>::to_vec))?;
        d.set_item("quantile", e.quantile.map(QuantileRule::name))?;
        d.set_item("help", e.help)?;
        d.set_item("prometheus", e.def.prometheus)?;
        d.set_item("unit", e.def.unit)?;
        out.append(d)?;
    }
    Ok(out)
}

/// The metric table: one dict per row (`key` without the prefix, per-task
/// rows as `tasks/{task}`, per-kind rows as `…/{kind}`), with its reduction, Prometheus name and type,
/// unit, help, bucket rule and health (`healthy`: `{"what", "unit", "lo",
/// "hi"}`, `hi` None for no upper bound; None for a metric not judged).
#[pyfunction]
pub(crate) fn metric_table(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for m in METRICS {
        let d = PyDict::new(py);
        d.set_item("key", m.key)?;
        d.set_item("reduction", m.reduction.name())?;
        d.set_item("per_task", m.per_task)?;
        d.set_item("per_database", m.per_database)?;
        d.set_item("per_kind", m.per_kind())?;
        d.set_item("prometheus", m.prometheus)?;
        d.set_item("prometheus_type", m.prometheus_type.name())?;
        d.set_item("unit", m.unit)?;
        d.set_item("help", m.help)?;
        d.set_item("buckets", m.buckets.map(BucketRule::name))?;
        d.set_item("quantile", m.buckets.map(|b| b.quantile_rule().name()))?;
        let healthy = serde_json::to_value(m.healthy).unwrap_or_default();
        d.set_item("healthy", super::json_to_py(py, &healthy)?)?;
        out.append(d)?;
    }
    Ok(out)
}

/// The trainer gauges the exporter serves: one dict per row (`key`,
/// `prometheus`, `unit`, `help`).
#[pyfunction]
pub(crate) fn trainer_gauges(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for g in headwater::telemetry::TRAINER_GAUGES {
        let d = PyDict::new(py);
        d.set_item("key", g.key)?;
        d.set_item("prometheus", g.prometheus)?;
        d.set_item("unit", g.unit)?;
        d.set_item("help", g.help)?;
        out.append(d)?;
    }
    Ok(out)
}

/// Exactly what `Sampler.telemetry_schema()` returns for a database with
/// these tasks sampled with `max_hops` and `sequence_length`.
#[pyfunction]
pub(crate) fn telemetry_schema_for(
    py: Python<'_>,
    task_names: Vec<String>,
    max_hops: usize,
    sequence_length: usize,
) -> PyResult<Bound<'_, PyList>> {
    schema_list(
        py,
        &TelemetrySchema::new(&task_names, max_hops, sequence_length),
    )
}
