//! Prometheus: the same measurements as the drain API, as cumulative series
//! on `/metrics` (via `metrics` + `metrics-exporter-prometheus`).
//!
//! Every name, type, unit, help text and bucket layout comes from the metric
//! table ([`METRICS`]); this module only registers handles and implements
//! [`Recorder`]. Names are `headwater_<subsystem>_<quantity>_<unit>` in base
//! units, counters end in `_total`, histograms are bucketed (so PromQL can
//! sum them across ranks); labels are only `rank`, `split`, `task`, `kind`
//! (the task-kind counters) and (for a mixture's reported databases)
//! `database`.
//!
//! Series per process: 3 splits (`train`; `val`, fed by the val stream and
//! val evaluation passes; `test`, fed by test passes: the sampler's
//! `TELEMETRY_SPLITS`) × (G gauges + C counters + one counter per task kind
//! (`readings::TASK_KINDS`) + T task counters + Σ over
//! the H histograms of (buckets + 2)), where buckets counts the `+Inf`
//! bucket and the 2 are `_sum` and `_count`; G, C and H are the table's
//! (`docs/telemetry.md` gives today's figures, which a test checks against
//! the table). It grows with the number of tasks `T` only, never with rows,
//! seeds, steps or passes. A mixture of any number of databases registers
//! task counters only for the `T_K` tasks of its `K` reported databases
//! (`telemetry_databases`, else `telemetry_top_databases`) plus 4 series per
//! reported database (2 counters, 2 gauges); the six mixture aggregates are
//! always there. Handles are registered once per
//! sampler and cached; recording is atomic increments, and scrapes read
//! them on the exporter's own thread, never blocking the sampler.

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

#[cfg(feature = "prometheus")]
use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics::{Counter, Gauge, Histogram};
#[cfg(feature = "prometheus")]
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::{BatchReport, MetricDef, PromType, Recorder, TelemetrySchema, METRICS, TRAINER_GAUGES};
use headwater_common::error::{Error, Result};
use headwater_common::readings::TASK_KINDS;

#[cfg(feature = "prometheus")]
fn unit(def: &MetricDef) -> Unit {
    match def.unit {
        "seconds" => Unit::Seconds,
        "ratio" => Unit::Percent,
        _ => Unit::Count,
    }
}

static INSTALLED: OnceLock<Mutex<Option<SocketAddr>>> = OnceLock::new();

#[cfg(feature = "prometheus")]
/// Install the process-wide exporter listening on `addr` (once per
/// process; a second call with the same address is a no-op).
pub fn install(addr: SocketAddr, schema: &TelemetrySchema) -> Result<()> {
    let slot = INSTALLED.get_or_init(|| Mutex::new(None));
    let mut g = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(existing) = *g {
        if existing == addr {
            return Ok(());
        }
        return Err(Error::Config {
            key: "prometheus_port".into(),
            value: None,
            what: format!("this process already exports on {existing}; one exporter per process (asked for {addr})"),
        });
    }
    let mut b = PrometheusBuilder::new().with_http_listener(addr);
    for def in METRICS
        .iter()
        .filter(|d| d.prometheus_type == PromType::Histogram)
    {
        let edges: Vec<f64> = schema
            .edges_of(def)
            .expect("the table gives every histogram a bucket rule")
            .iter()
            .copied()
            .filter(|e| e.is_finite())
            .collect();
        b = b
            .set_buckets_for_metric(Matcher::Full(def.prometheus.to_string()), &edges)
            .map_err(|e| Error::Config {
                key: "prometheus".into(),
                value: None,
                what: e.to_string(),
            })?;
    }
    b.install().map_err(|e| Error::Config {
        key: "prometheus_port".into(),
        value: None,
        what: format!("cannot serve /metrics on {addr}: {e}"),
    })?;
    for g in TRAINER_GAUGES {
        describe_gauge!(g.prometheus, Unit::Count, g.help);
    }
    for def in METRICS {
        match def.prometheus_type {
            PromType::Gauge => describe_gauge!(def.prometheus, unit(def), def.help),
            PromType::Counter => describe_counter!(def.prometheus, unit(def), def.help),
            PromType::Histogram => describe_histogram!(def.prometheus, unit(def), def.help),
        }
    }
    *g = Some(addr);
    Ok(())
}

/// Refuses: a build without the `prometheus` feature serves no `/metrics`.
#[cfg(not(feature = "prometheus"))]
pub fn install(addr: SocketAddr, _schema: &TelemetrySchema) -> Result<()> {
    Err(Error::Config {
        key: "prometheus_port".into(),
        value: Some(addr.port().to_string()),
        what: "this build of headwater has no Prometheus exporter: build headwater-telemetry \
               with its `prometheus` feature (the Python wheel has it)"
            .into(),
    })
}

/// Whether this process serves `/metrics` (an exporter was installed).
pub fn installed() -> bool {
    INSTALLED.get().is_some_and(|m| {
        m.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    })
}

/// Set the trainer gauges ([`TRAINER_GAUGES`]) of `rank` from `(key,
/// value)` pairs; an unknown key is an error naming the known ones. A no-op
/// (after the key check) when this process serves no `/metrics`.
pub fn set_trainer_gauges(rank: u32, values: &[(String, f64)]) -> Result<()> {
    let mut found = Vec::with_capacity(values.len());
    for (key, v) in values {
        let Some(g) = TRAINER_GAUGES.iter().find(|g| g.key == key) else {
            let known: Vec<&str> = TRAINER_GAUGES.iter().map(|g| g.key).collect();
            return Err(Error::InvalidArgument {
                name: "values".into(),
                what: format!("unknown trainer gauge {key:?}; known: {}", known.join(", ")),
            });
        };
        found.push((g, *v));
    }
    if installed() {
        let rank = rank.to_string();
        for (g, v) in found {
            metrics::gauge!(g.prometheus, "rank" => rank.clone()).set(v);
        }
    }
    Ok(())
}

/// A cached handle of one table row.
enum Handle {
    Gauge(Gauge),
    Counter(Counter),
    /// One counter per reported task, indexed by mixture task index.
    Tasks(Vec<Option<Counter>>),
    /// One counter per task kind (`readings::TASK_KINDS` order).
    Kinds(Vec<Counter>),
    /// One counter per reported database, by mixture index.
    DatabaseCounters(Vec<Option<(usize, Counter)>>),
    /// One gauge per reported database, by mixture index.
    DatabaseGauges(Vec<Option<(usize, Gauge)>>),
    Histogram(Histogram),
}

/// Cached handles for one split of one sampler; a [`Recorder`].
pub struct PromSplit {
    handles: Vec<(&'static MetricDef, Handle)>,
}

impl PromSplit {
    /// Register every table row's series for `rank` and `split`.
    pub fn register(schema: &TelemetrySchema, rank: u32, split: &'static str) -> Self {
        let rank = rank.to_string();
        let labels = || vec![("rank", rank.clone()), ("split", split.to_string())];
        let handles = METRICS
            .iter()
            .map(|def| {
                let n = def.prometheus;
                let h = match def.prometheus_type {
                    _ if def.per_database => {
                        let size = schema.database_ids.iter().max().map_or(0, |m| m + 1);
                        let l = |name: &String| {
                            let mut l = labels();
                            l.push(("database", name.clone()));
                            l
                        };
                        let reported = schema.database_ids.iter().zip(&schema.database_names);
                        if def.prometheus_type == PromType::Counter {
                            let mut cs: Vec<_> = (0..size).map(|_| None).collect();
                            for (slot, (&d, name)) in reported.enumerate() {
                                cs[d] = Some((slot, metrics::counter!(n, &l(name))));
                            }
                            Handle::DatabaseCounters(cs)
                        } else {
                            let mut gs: Vec<_> = (0..size).map(|_| None).collect();
                            for (slot, (&d, name)) in reported.enumerate() {
                                gs[d] = Some((slot, metrics::gauge!(n, &l(name))));
                            }
                            Handle::DatabaseGauges(gs)
                        }
                    }
                    PromType::Gauge => Handle::Gauge(metrics::gauge!(n, &labels())),
                    PromType::Counter if def.per_task => {
                        let size = schema.task_ids.iter().max().map_or(0, |m| m + 1);
                        let mut cs: Vec<Option<Counter>> = (0..size).map(|_| None).collect();
                        for (&k, t) in schema.task_ids.iter().zip(&schema.task_names) {
                            let mut l = labels();
                            l.push(("task", t.clone()));
                            cs[k] = Some(metrics::counter!(n, &l));
                        }
                        Handle::Tasks(cs)
                    }
                    PromType::Counter if def.per_kind() => Handle::Kinds(
                        TASK_KINDS
                            .iter()
                            .map(|kind| {
                                let mut l = labels();
                                l.push(("kind", (*kind).to_string()));
                                metrics::counter!(n, &l)
                            })
                            .collect(),
                    ),
                    PromType::Counter => Handle::Counter(metrics::counter!(n, &labels())),
                    PromType::Histogram => Handle::Histogram(metrics::histogram!(n, &labels())),
                };
                (def, h)
            })
            .collect();
        PromSplit { handles }
    }
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn count(v: f64) -> u64 {
    v as u64
}

impl Recorder for PromSplit {
    fn record(&mut self, r: &BatchReport) {
        for (def, h) in &self.handles {
            match h {
                Handle::Gauge(g) => g.set(def.measure.per_batch(r)),
                Handle::Counter(c) => c.increment(count(def.measure.per_batch(r))),
                Handle::Tasks(cs) => {
                    if let Some(Some(c)) = cs.get(r.task()) {
                        c.increment(count(def.measure.per_batch(r)));
                    }
                }
                Handle::Kinds(cs) => {
                    for (i, c) in cs.iter().enumerate() {
                        c.increment(count(def.measure.per_kind(r, i)));
                    }
                }
                Handle::DatabaseCounters(cs) => {
                    if let Some(Some((slot, c))) = cs.get(r.db()) {
                        if let Some(x) = def.measure.per_database(r, r.db(), *slot) {
                            c.increment(count(x));
                        }
                    }
                }
                Handle::DatabaseGauges(gs) => {
                    for (d, g) in gs.iter().enumerate() {
                        if let Some((slot, g)) = g {
                            if let Some(x) = def.measure.per_database(r, d, *slot) {
                                g.set(x);
                            }
                        }
                    }
                }
                Handle::Histogram(hist) => def.measure.samples(r, |v| hist.record(v)),
            }
        }
    }
}

#[cfg(all(test, not(feature = "prometheus")))]
mod tests_without_the_exporter {
    #[test]
    fn asking_for_a_port_names_the_missing_feature() {
        let schema = crate::TelemetrySchema::new(&[], 3, 1024);
        let addr = "127.0.0.1:9464".parse().unwrap();
        let text = super::install(addr, &schema).unwrap_err().to_string();
        assert!(
            text.contains("prometheus_port") && text.contains("`prometheus` feature"),
            "{text}"
        );
        assert!(!super::installed());
    }
}
