//! The drain recorder: accumulates delivered batches of one split between
//! drains, one accumulator per schema entry, each fed by its table row's
//! [`Measure`].

use super::hist::FixedHistogram;
use super::report::BatchReport;
use super::schema::TelemetrySchema;
use super::table::{ratio, Measure};
use super::Recorder;

/// The accumulator of one schema entry.
#[derive(Debug, Clone)]
enum Slot {
    /// Snapshot, running minimum, or running sum (by the entry's measure).
    Scalar(f64),
    /// A [`Measure::Ratio`]'s two running sums.
    Ratio(f64, f64),
    Hist(FixedHistogram),
}

/// How one entry is fed: its measure, the task it is restricted to (per-task
/// rows), the (database, slot) it is restricted to (per-database rows) and
/// the task kind it counts (per-kind rows).
type Feed = (
    Measure,
    Option<usize>,
    Option<(usize, usize)>,
    Option<usize>,
);

/// Accumulates delivered batches of one split between drains.
#[derive(Debug, Clone)]
pub struct StepRecorder {
    delivered: u64,
    measures: Vec<Feed>,
    slots: Vec<Slot>,
}

fn initial(m: Measure) -> f64 {
    match m {
        Measure::Least(_) => f64::INFINITY,
        _ => 0.0,
    }
}

impl StepRecorder {
    /// A recorder with one accumulator per entry of `schema`.
    pub fn new(schema: &TelemetrySchema) -> Self {
        let mut measures = Vec::with_capacity(schema.entries.len());
        let mut slots = Vec::with_capacity(schema.entries.len());
        for e in &schema.entries {
            let m = e.def.measure;
            measures.push((m, e.task, e.database, e.kind));
            slots.push(match (&e.edges, e.quantile) {
                (Some(edges), Some(rule)) => Slot::Hist(FixedHistogram::new(edges.clone(), rule)),
                _ if matches!(m, Measure::Ratio(..)) => Slot::Ratio(0.0, 0.0),
                _ => Slot::Scalar(initial(m)),
            });
        }
        StepRecorder {
            delivered: 0,
            measures,
            slots,
        }
    }

    /// Batches recorded since the last drain.
    pub fn pending(&self) -> u64 {
        self.delivered
    }

    /// The snapshot + accumulated values, one per `schema.drained_keys`
    /// (histograms expanded into buckets and p50/p95/max), then clear the
    /// accumulators. Empty when nothing was delivered since the last drain.
    pub fn drain_values(&mut self, schema: &TelemetrySchema, out: &mut Vec<f64>) {
        out.clear();
        if self.delivered == 0 {
            return;
        }
        for ((m, ..), slot) in self.measures.iter().zip(&self.slots) {
            match slot {
                Slot::Scalar(v) => out.push(*v),
                Slot::Ratio(num, den) => {
                    let empty = if let Measure::Ratio(_, _, e) = m {
                        *e
                    } else {
                        0.0
                    };
                    out.push(ratio(*num, *den, empty));
                }
                Slot::Hist(h) => {
                    #[allow(clippy::cast_precision_loss)]
                    out.extend(h.counts().iter().map(|&c| c as f64));
                    out.extend([h.quantile(0.5), h.quantile(0.95), h.max()]);
                }
            }
        }
        debug_assert_eq!(out.len(), schema.drained_keys.len());
        self.clear();
    }

    /// [`drain_values`](Self::drain_values) paired with the keys.
    pub fn drain(&mut self, schema: &TelemetrySchema, out: &mut Vec<(String, f64)>) {
        let mut values = Vec::with_capacity(schema.drained_keys.len());
        self.drain_values(schema, &mut values);
        out.clear();
        out.extend(schema.drained_keys.iter().cloned().zip(values));
    }

    fn clear(&mut self) {
        self.delivered = 0;
        for ((m, ..), slot) in self.measures.iter().zip(&mut self.slots) {
            match slot {
                Slot::Scalar(v) => *v = initial(*m),
                Slot::Ratio(num, den) => (*num, *den) = (0.0, 0.0),
                Slot::Hist(h) => h.clear(),
            }
        }
    }
}

impl Recorder for StepRecorder {
    fn record(&mut self, r: &BatchReport) {
        self.delivered += 1;
        for (&(m, task, database, kind), slot) in self.measures.iter().zip(&mut self.slots) {
            match slot {
                Slot::Hist(h) => m.samples(r, |v| h.record(v)),
                Slot::Ratio(num, den) => {
                    if let Measure::Ratio(f, g, _) = m {
                        *num += f(r);
                        *den += g(r);
                    }
                }
                Slot::Scalar(v) => match m {
                    Measure::DatabaseSeeds | Measure::DatabaseExhausts => {
                        if let Some(x) = database.and_then(|(d, s)| m.per_database(r, d, s)) {
                            *v += x;
                        }
                    }
                    Measure::DatabaseLast(_) => {
                        if let Some(x) = database.and_then(|(d, s)| m.per_database(r, d, s)) {
                            *v = x;
                        }
                    }
                    Measure::KindSeeds => *v += kind.map_or(0.0, |i| m.per_kind(r, i)),
                    Measure::Last(f) => *v = f(r),
                    Measure::Least(f) => *v = v.min(f(r)),
                    Measure::TaskSeeds => match task {
                        Some(t) if !r.batch.task_seeds.is_empty() => {
                            let n = r.batch.task_seeds.iter().filter(|s| s.0 as usize == t);
                            *v += n.map(|s| f64::from(s.1)).sum::<f64>();
                        }
                        Some(t) if t == r.task() => *v += r.seeds(),
                        _ => {}
                    },
                    other => *v += other.per_batch(r),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::BatchReport;
    use super::super::schema::{TelemetrySchema, PREFIX};
    use super::super::Recorder;
    use super::StepRecorder;
    use headwater_common::readings::{BatchReadings, DeliveryReadings};

    fn drained(batches: &[BatchReadings]) -> std::collections::HashMap<String, f64> {
        let schema = TelemetrySchema::new(&["t".into()], 3, 64);
        let mut rec = StepRecorder::new(&schema);
        for b in batches {
            rec.record(&BatchReport {
                batch: b,
                delivery: DeliveryReadings::default(),
            });
        }
        let mut out = vec![];
        rec.drain(&schema, &mut out);
        out.into_iter()
            .map(|(k, v)| (k.trim_start_matches(PREFIX).to_owned(), v))
            .collect()
    }

    /// A per-kind row drains its kind's contexts summed over the batches,
    /// every kind keyed whether or not a batch had it.
    #[test]
    fn a_per_kind_row_drains_each_kinds_contexts() {
        let mut a = BatchReadings {
            seeds: 5,
            ..BatchReadings::default()
        };
        a.kind_seeds[..2].copy_from_slice(&[3, 2]);
        let mut b = BatchReadings {
            seeds: 4,
            ..BatchReadings::default()
        };
        b.kind_seeds[1] = 4;
        let got = drained(&[a, b]);
        let kinds: Vec<f64> = ["cell", "sql", "relbench", "link", "other"]
            .iter()
            .map(|k| got[&format!("task_kinds/{k}")])
            .collect();
        assert_eq!(kinds, [3.0, 6.0, 0.0, 0.0, 0.0]);
    }

    /// A ratio row drains the ratio of its two sums over the batches (not
    /// the mean of the batches' ratios), and its stated value when nothing
    /// was counted below the line.
    #[test]
    fn a_ratio_row_drains_the_ratio_of_its_sums() {
        let a = BatchReadings {
            read_bytes: 9_000,
            useful_bytes: 1_000,
            pages_probed: 4,
            pages_resident: 1,
            ..BatchReadings::default()
        };
        let b = BatchReadings {
            read_bytes: 0,
            useful_bytes: 3_000,
            pages_probed: 4,
            pages_resident: 4,
            ..BatchReadings::default()
        };
        let got = drained(&[a.clone(), b.clone()]);
        assert_eq!(got["io/read_amplification"], 9_000.0 / 4_000.0);
        assert_eq!(got["io/working_set_resident"], 5.0 / 8.0);
        let nothing = drained(&[BatchReadings::default()]);
        assert_eq!(nothing["io/read_amplification"], 0.0);
        assert_eq!(nothing["io/working_set_resident"], 1.0);
        // The sums start over after a drain.
        let schema = TelemetrySchema::new(&["t".into()], 3, 64);
        let mut rec = StepRecorder::new(&schema);
        let mut out = vec![];
        for x in [&a, &b] {
            rec.record(&BatchReport {
                batch: x,
                delivery: DeliveryReadings::default(),
            });
            rec.drain(&schema, &mut out);
        }
        let key = format!("{PREFIX}io/working_set_resident");
        assert_eq!(out.iter().find(|e| e.0 == key).unwrap().1, 1.0);
    }
}
