//! Per-batch measurements (made by the producer) and the per-split recorder
//! (fed at delivery, drained by the consumer).

use std::collections::VecDeque;

use super::hist::FixedHistogram;
use super::schema::{Reduction, TelemetrySchema};
use crate::batch::Batch;

/// What the producer knew when it made a batch (pool state after the draw).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchTelemetry {
    pub remaining_min: f64,
    pub remaining_max: f64,
    pub remaining_fraction_min: f64,
    pub remaining_fraction_max: f64,
    pub steps_since_pick_max: f64,
    pub steps_to_exhaust_min: f64,
    pub tv_distance: f64,
    /// Hash of the producer's RNG state before the draw and the drawn seeds.
    pub fingerprint: u64,
}

/// Sliding window of recent task picks, for the realised mix.
#[derive(Debug, Clone)]
pub struct MixWindow {
    picks: VecDeque<u32>,
    counts: Vec<u64>,
    cap: usize,
}

impl MixWindow {
    pub fn new(num_tasks: usize, cap: usize) -> Self {
        MixWindow {
            picks: VecDeque::with_capacity(cap),
            counts: vec![0; num_tasks],
            cap,
        }
    }

    pub fn push(&mut self, task: u32) {
        if self.picks.len() == self.cap {
            if let Some(old) = self.picks.pop_front() {
                self.counts[old as usize] -= 1;
            }
        }
        self.picks.push_back(task);
        self.counts[task as usize] += 1;
    }

    pub fn len(&self) -> usize {
        self.picks.len()
    }
    pub fn is_empty(&self) -> bool {
        self.picks.is_empty()
    }
    /// The picks in the window, oldest first (for the sampler state).
    pub fn picks(&self) -> impl Iterator<Item = u32> + '_ {
        self.picks.iter().copied()
    }
    /// Picks of `task` in the window.
    pub fn count(&self, task: usize) -> u64 {
        self.counts[task]
    }

    /// Total-variation distance between the window's mix and `weights`
    /// (normalised over the tasks with weight > 0).
    pub fn tv_distance(&self, weights: &[f64]) -> f64 {
        let total_w: f64 = weights.iter().filter(|w| **w > 0.0).sum();
        let n = self.picks.len() as f64;
        if n == 0.0 || total_w <= 0.0 {
            return 0.0;
        }
        0.5 * weights
            .iter()
            .zip(&self.counts)
            .map(|(&w, &c)| (c as f64 / n - w.max(0.0) / total_w).abs())
            .sum::<f64>()
    }
}

/// Accumulates delivered batches of one split between drains.
#[derive(Debug, Clone)]
pub struct StepRecorder {
    delivered: u64,
    last: BatchTelemetry,
    exhaust_events: u64,
    tasks_drawn: Vec<u64>,
    cells_dropped: u64,
    children_capped: u64,
    temporal_filtered: u64,
    duplicate_seeds: u64,
    temporal_leaks: u64,
    resumes: u64,
    queue_depth_min: f64,
    wait_seconds: f64,
    depth: FixedHistogram,
    rows: FixedHistogram,
    padding: FixedHistogram,
    stages: [FixedHistogram; 4],
}

impl StepRecorder {
    pub fn new(schema: &TelemetrySchema) -> Self {
        let h = |key: &str| {
            let e = schema
                .entry(&format!("{}{key}", super::PREFIX))
                .expect("schema has the key");
            FixedHistogram::new(e.edges.clone().expect("histogram"))
        };
        StepRecorder {
            delivered: 0,
            last: BatchTelemetry::default(),
            exhaust_events: 0,
            tasks_drawn: vec![0; schema.task_names.len()],
            cells_dropped: 0,
            children_capped: 0,
            temporal_filtered: 0,
            duplicate_seeds: 0,
            temporal_leaks: 0,
            resumes: 0,
            queue_depth_min: f64::INFINITY,
            wait_seconds: 0.0,
            depth: h("bfs/depth"),
            rows: h("bfs/rows"),
            padding: h("padding/fraction"),
            stages: [
                h("stage/bfs_seconds"),
                h("stage/assemble_seconds"),
                h("stage/collate_seconds"),
                h("stage/total_seconds"),
            ],
        }
    }

    /// Record a delivered batch; `queue_depth` is what the consumer saw in
    /// the channel when it asked, `wait_seconds` how long it blocked.
    pub fn record(&mut self, b: &Batch, queue_depth: usize, wait_seconds: f64) {
        self.delivered += 1;
        self.last = b.telemetry.clone();
        self.exhaust_events += b.exhaust_events as u64;
        self.duplicate_seeds += b.duplicate_seeds as u64;
        if let Some(t) = self.tasks_drawn.get_mut(b.task_idx as usize) {
            *t += b.batch_size as u64;
        }
        let s = b.seq_len as f64;
        for q in &b.seq_stats {
            self.depth.record(q.depth as f64);
            self.rows.record(q.rows as f64);
            self.padding.record(1.0 - q.cells as f64 / s);
            self.cells_dropped += q.cells_dropped;
            self.children_capped += q.children_capped;
            self.temporal_filtered += q.temporal_filtered;
            self.temporal_leaks += q.temporal_leaks;
        }
        for (h, ns) in self.stages.iter_mut().zip(b.stage_ns) {
            h.record(ns as f64 * 1e-9);
        }
        self.queue_depth_min = self.queue_depth_min.min(queue_depth as f64);
        self.wait_seconds += wait_seconds;
    }

    /// The sampler was restored from a saved state (counted in the next
    /// drain that has a batch).
    pub fn note_resume(&mut self) {
        self.resumes += 1;
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
        let mut task_i = 0;
        for e in &schema.entries {
            let name = &e.key[super::PREFIX.len()..];
            let v = match name {
                "pool/remaining_min" => self.last.remaining_min,
                "pool/remaining_max" => self.last.remaining_max,
                "pool/remaining_fraction_min" => self.last.remaining_fraction_min,
                "pool/remaining_fraction_max" => self.last.remaining_fraction_max,
                "pool/steps_since_pick_max" => self.last.steps_since_pick_max,
                "pool/steps_to_exhaust_min" => self.last.steps_to_exhaust_min,
                "pool/exhaust_events" => self.exhaust_events as f64,
                "mix/tv_distance" => self.last.tv_distance,
                "truncation/cells_dropped" => self.cells_dropped as f64,
                "bfs/children_capped" => self.children_capped as f64,
                "bfs/temporal_filtered" => self.temporal_filtered as f64,
                "queue/depth_min" => self.queue_depth_min,
                "queue/wait_seconds" => self.wait_seconds,
                "invariants/duplicate_seeds" => self.duplicate_seeds as f64,
                "invariants/temporal_leaks" => self.temporal_leaks as f64,
                "batches" => self.delivered as f64,
                "resumes" => self.resumes as f64,
                _ if name.starts_with("tasks/") => {
                    task_i += 1;
                    self.tasks_drawn[task_i - 1] as f64
                }
                _ => {
                    debug_assert_eq!(e.reduction, Reduction::Histogram);
                    let h = match name {
                        "bfs/depth" => &self.depth,
                        "bfs/rows" => &self.rows,
                        "padding/fraction" => &self.padding,
                        "stage/bfs_seconds" => &self.stages[0],
                        "stage/assemble_seconds" => &self.stages[1],
                        "stage/collate_seconds" => &self.stages[2],
                        "stage/total_seconds" => &self.stages[3],
                        other => unreachable!("no recorder for {other}"),
                    };
                    out.extend(h.counts().iter().map(|&c| c as f64));
                    out.extend([h.quantile(0.5), h.quantile(0.95), h.max()]);
                    continue;
                }
            };
            out.push(v);
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
        self.exhaust_events = 0;
        self.tasks_drawn.iter_mut().for_each(|t| *t = 0);
        self.cells_dropped = 0;
        self.children_capped = 0;
        self.temporal_filtered = 0;
        self.duplicate_seeds = 0;
        self.temporal_leaks = 0;
        self.resumes = 0;
        self.queue_depth_min = f64::INFINITY;
        self.wait_seconds = 0.0;
        self.depth.clear();
        self.rows.clear();
        self.padding.clear();
        self.stages.iter_mut().for_each(|h| h.clear());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tv_distance_of_matching_and_skewed_mixes() {
        let mut w = MixWindow::new(3, 4);
        for t in [0, 1, 0, 1] {
            w.push(t);
        }
        assert!((w.tv_distance(&[1.0, 1.0, 0.0]) - 0.0).abs() < 1e-12);
        // Task 2 configured but never picked.
        assert!((w.tv_distance(&[1.0, 1.0, 2.0]) - 0.5).abs() < 1e-12);
        // The window slides.
        for _ in 0..4 {
            w.push(2);
        }
        assert_eq!((w.count(0), w.count(2)), (0, 4));
    }
}
