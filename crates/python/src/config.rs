//! Sampler config at the Python edge: a mapping (plus keywords) becomes a
//! JSON value and is deserialised once by `SamplerConfig::from_json`; every
//! error is `ConfigError` (a `HeadwaterError` and a `ValueError`).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyMapping, PyString, PyTuple};
use serde_json::{Map, Number, Value};

use super::{json_to_py, to_py};
use headwater::config::{bad, SamplerConfig, FIELDS};
use headwater::error::Error;
use headwater::stream::StreamConfig;

/// A Python value of key `key` as JSON (non-finite floats and integers
/// outside 64 bits are config errors naming the key).
fn to_value(key: &str, obj: &Bound<'_, PyAny>) -> Result<Value, Error> {
    let repr = || {
        obj.repr()
            .map_or_else(|_| "?".to_string(), |r| r.to_string())
    };
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_string()));
    }
    if obj.is_instance_of::<PyInt>()
        || (!obj.is_instance_of::<PyFloat>() && obj.hasattr("__index__").unwrap_or(false))
    {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::Number(i.into()));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::Number(u.into()));
        }
        return Err(bad(key, repr()));
    }
    if let Ok(m) = obj.cast::<PyMapping>() {
        let mut out = Map::new();
        for item in m.items().map_err(|_| bad(key, repr()))?.iter() {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                item.extract().map_err(|_| bad(key, repr()))?;
            let k: String = k.extract().map_err(|_| bad(key, repr()))?;
            out.insert(k, to_value(key, &v)?);
        }
        return Ok(Value::Object(out));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let items: Vec<Bound<'_, PyAny>> = obj.extract().map_err(|_| bad(key, repr()))?;
        return items
            .iter()
            .map(|x| to_value(key, x))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    if let Ok(x) = obj.extract::<f64>() {
        return Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(|| bad(key, repr()));
    }
    if let Ok(items) = obj.extract::<Vec<Bound<'_, PyAny>>>() {
        return items
            .iter()
            .map(|x| to_value(key, x))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    Err(bad(key, repr()))
}

/// `config` merged with `kwargs` (keywords win) as one JSON object.
pub(crate) fn merged(
    config: Option<&Bound<'_, PyAny>>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Value> {
    let mut out = Map::new();
    let mut take = |m: &Bound<'_, PyMapping>| -> PyResult<()> {
        for item in m.items()?.iter() {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
            let k: String = k.extract().map_err(|_| {
                to_py(Error::config(
                    "config",
                    format!("keys must be strings, got {k}"),
                ))
            })?;
            let v = to_value(&k, &v).map_err(to_py)?;
            out.insert(k, v);
        }
        Ok(())
    };
    if let Some(c) = config.filter(|c| !c.is_none()) {
        let m = c.cast::<PyMapping>().map_err(|_| {
            to_py(Error::config(
                "config",
                format!("expected a mapping of sampler keys, got {c}"),
            ))
        })?;
        take(m)?;
    }
    if let Some(k) = kwargs {
        take(k.as_mapping())?;
    }
    Ok(Value::Object(out))
}

/// Deserialise a mapping (plus keywords) into a config, without validating.
pub(crate) fn from_py(
    config: Option<&Bound<'_, PyAny>>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<SamplerConfig> {
    SamplerConfig::from_json(&merged(config, kwargs)?).map_err(to_py)
}

/// Every sampler key: `[{"name", "type", "default", "range", "doc",
/// "stream", "group", "check"}]`; `stream`: the key defines the batch
/// stream (a saved state records it, and every rank must share its
/// value); `group`: what it is for (`debug`: fault injection); `check`: its
/// allowed values as data (`{"kind": "int", "lo", "hi"}`, `{"kind":
/// "number", "lo", "hi", "open_lo"}`, `{"kind": "bool"}`, `{"kind":
/// "choices", "choices"}` or `{"kind": "rule", "text"}`).
#[pyfunction]
pub(crate) fn sampler_config_schema(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let defaults = SamplerConfig::default().to_json();
    let stream = StreamConfig::keys();
    let out = PyList::empty(py);
    for f in FIELDS {
        let d = PyDict::new(py);
        d.set_item("name", f.name)?;
        d.set_item("type", f.ty)?;
        d.set_item("default", json_to_py(py, &defaults[f.name])?)?;
        d.set_item("range", f.range())?;
        d.set_item("group", f.group.name())?;
        d.set_item(
            "check",
            json_to_py(py, &serde_json::to_value(f.check).unwrap_or_default())?,
        )?;
        d.set_item("doc", f.doc)?;
        d.set_item("stream", stream.iter().any(|k| k == f.name))?;
        out.append(d)?;
    }
    Ok(out)
}

/// Deserialise and validate a sampler config without opening a database
/// (task-dependent checks only with `task_names`); the normalised config
/// with every key (task weights as a list when `task_names` is given).
#[pyfunction]
#[pyo3(signature = (config, task_names=None))]
pub(crate) fn validate_sampler_config<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyAny>,
    task_names: Option<Vec<String>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut cfg = from_py(Some(config), None)?;
    cfg.validate(task_names.as_deref()).map_err(to_py)?;
    if let Some(names) = &task_names {
        if cfg.task_weights.is_some() {
            cfg.task_weights = Some(cfg.weights_for(names).map_err(to_py)?.into());
        }
    }
    json_to_py(py, &cfg.to_json())
}

/// The shapes a valid config's steps take, by the core's rule
/// (`SamplerConfig::train_shapes`, `fixed_shape`): `{"train": [{"S", "B"},
/// ...], "eval": {"S", "B"}}`, `B` sequences per rank.
#[pyfunction]
pub(crate) fn step_shapes<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let cfg = from_py(Some(config), None)?;
    cfg.validate(None).map_err(to_py)?;
    let v = serde_json::json!({"train": cfg.train_shapes(), "eval": cfg.fixed_shape()});
    json_to_py(py, &v)
}
