//! Fixed-edge histograms and the one quantile rule.
//!
//! Bucket counts of a fixed layout merge exactly by summation, so a cluster
//! percentile computed from summed buckets is as exact as one rank's. The
//! layouts themselves are rules of the metric table ([`BucketRule`]); this
//! module only counts and reads quantiles.
//!
//! Quantile rule (the Python reducer implements the same, see
//! `python/headwater/telemetry/schema.py`): the target rank is
//! `max(ceil(q * total), 1)`; the quantile lies in the first bucket whose
//! cumulative count reaches it. [`QuantileRule::UpperEdge`] reads that
//! bucket's upper edge, [`QuantileRule::Midpoint`] the midpoint of its lower
//! and upper edges (lower edge 0 for the first bucket); either is capped by
//! the observed max, and the `+inf` bucket reads the max. Latency histograms
//! use the log-linear layout of [`latency_edges`] with the midpoint rule:
//! every bucket spans at most 1/8 of its lower edge, so a quantile inside the
//! layout's range is within 1/16 (6.25 %) of the exact order statistic.
//!
//! [`BucketRule`]: super::BucketRule

use std::sync::Arc;

use serde::Serialize;

/// Sub-buckets per octave of the latency layout.
pub const LATENCY_SUB_BUCKETS: u32 = 8;
/// The latency layout starts at `2^LATENCY_MIN_EXP` seconds (~0.95 µs).
pub const LATENCY_MIN_EXP: i32 = -20;
/// ... and covers this many octaves (up to 2^4 = 16 s; slower goes to `+inf`).
pub const LATENCY_OCTAVES: i32 = 24;

/// Log-linear latency edges in seconds: `2^-20`, then each octave
/// `[2^k, 2^(k+1)]` for `k` in `-20..4` cut into 8 equal buckets, then
/// `+inf` — 194 buckets.
pub fn latency_edges() -> Arc<[f64]> {
    let mut e = vec![f64::powi(2.0, LATENCY_MIN_EXP)];
    for k in LATENCY_MIN_EXP..LATENCY_MIN_EXP + LATENCY_OCTAVES {
        let base = f64::powi(2.0, k);
        for j in 1..=LATENCY_SUB_BUCKETS {
            e.push(base * (1.0 + f64::from(j) / f64::from(LATENCY_SUB_BUCKETS)));
        }
    }
    e.push(f64::INFINITY);
    e.into()
}

/// How a quantile is read from the bucket that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantileRule {
    /// The bucket's upper edge (counts, ratios: exact on integer layouts).
    UpperEdge,
    /// The midpoint of the bucket's lower and upper edges (latencies).
    Midpoint,
}

impl QuantileRule {
    /// The name Python reads from `telemetry_schema()` (`"quantile"`).
    pub fn name(self) -> &'static str {
        match self {
            QuantileRule::UpperEdge => "upper_edge",
            QuantileRule::Midpoint => "midpoint",
        }
    }
}

/// Counts of values per bucket; bucket `i` holds `edges[i-1] < v <= edges[i]`
/// (Prometheus `le` semantics); the last edge is `+inf`.
#[derive(Debug, Clone, PartialEq)]
pub struct FixedHistogram {
    edges: Arc<[f64]>,
    counts: Vec<u64>,
    max: f64,
    total: u64,
    rule: QuantileRule,
}

impl FixedHistogram {
    /// An empty histogram over `edges` (ending with `+inf`), read with `rule`.
    pub fn new(edges: Arc<[f64]>, rule: QuantileRule) -> Self {
        debug_assert!(edges.last() == Some(&f64::INFINITY));
        let n = edges.len();
        FixedHistogram {
            edges,
            counts: vec![0; n],
            max: f64::NEG_INFINITY,
            total: 0,
            rule,
        }
    }

    /// Count one value.
    #[inline]
    pub fn record(&mut self, v: f64) {
        let i = self.edges.partition_point(|&e| e < v);
        let last = self.counts.len() - 1;
        self.counts[i.min(last)] += 1;
        self.total += 1;
        if v > self.max {
            self.max = v;
        }
    }

    /// Bucket upper bounds, the last `+inf`.
    pub fn edges(&self) -> &[f64] {
        &self.edges
    }
    /// Values per bucket.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }
    /// Values recorded.
    pub fn total(&self) -> u64 {
        self.total
    }
    /// The largest value recorded (`-inf` when empty).
    pub fn max(&self) -> f64 {
        self.max
    }

    /// Forget every value.
    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.max = f64::NEG_INFINITY;
        self.total = 0;
    }

    /// The `q`-quantile by this histogram's rule (NaN when empty).
    pub fn quantile(&self, q: f64) -> f64 {
        quantile_from_buckets(&self.edges, &self.counts, q, self.max, self.rule)
    }
}

/// The quantile rule on raw counts (merged cluster buckets too).
pub fn quantile_from_buckets(
    edges: &[f64],
    counts: &[u64],
    q: f64,
    max: f64,
    rule: QuantileRule,
) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return f64::NAN;
    }
    #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut acc = 0;
    for (i, &c) in counts.iter().enumerate() {
        acc += c;
        if acc >= rank {
            let hi = edges[i];
            if !hi.is_finite() {
                return max;
            }
            let v = match rule {
                QuantileRule::UpperEdge => hi,
                QuantileRule::Midpoint => {
                    let lo = if i == 0 { 0.0 } else { edges[i - 1] };
                    // The Python reducer computes exactly this expression.
                    #[allow(clippy::manual_midpoint)]
                    let mid = (lo + hi) / 2.0;
                    mid
                }
            };
            return v.min(max);
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_use_le_semantics_and_quantiles_are_bucket_edges() {
        let mut h = FixedHistogram::new(
            vec![1.0, 2.0, 4.0, f64::INFINITY].into(),
            QuantileRule::UpperEdge,
        );
        for v in [0.5, 1.0, 1.5, 2.0, 3.0, 9.0] {
            h.record(v);
        }
        assert_eq!(h.counts(), &[2, 2, 1, 1]);
        assert_eq!(h.quantile(0.5), 2.0);
        assert_eq!(h.quantile(1.0), 9.0);
        assert_eq!(h.quantile(0.1), 1.0);
    }

    #[test]
    fn midpoint_rule_reads_the_middle_of_the_bucket_capped_by_max() {
        let mut h = FixedHistogram::new(
            vec![1.0, 2.0, 4.0, f64::INFINITY].into(),
            QuantileRule::Midpoint,
        );
        for v in [0.5, 1.5, 3.9, 3.9] {
            h.record(v);
        }
        assert_eq!(h.quantile(0.25), 0.5); // [0, 1] -> 0.5
        assert_eq!(h.quantile(0.5), 1.5); // [1, 2] -> 1.5
        assert_eq!(h.quantile(1.0), 3.0); // [2, 4] -> 3, max 3.9
        let mut one = FixedHistogram::new(latency_edges(), QuantileRule::Midpoint);
        one.record(1e-3);
        assert_eq!(one.quantile(0.5), 1e-3_f64.min(one.quantile(0.5)));
        assert!((one.quantile(0.5) / 1e-3 - 1.0).abs() <= 1.0 / 16.0);
    }

    /// Lognormal latencies around `median` seconds.
    fn lognormal(
        rng: &mut headwater_common::rng::Xoshiro256pp,
        median: f64,
        sigma: f64,
        n: usize,
    ) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let (u1, u2) = (rng.next_f64().max(1e-300), rng.next_f64());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                median * (sigma * z).exp()
            })
            .collect()
    }

    /// The exact `q`-quantile by the same rank rule (inverted CDF).
    fn exact(xs: &mut [f64], q: f64) -> f64 {
        xs.sort_by(f64::total_cmp);
        let rank = (q * xs.len() as f64).ceil().max(1.0) as usize;
        xs[rank - 1]
    }

    #[test]
    fn latency_quantiles_are_within_ten_percent_single_and_merged_over_four_ranks() {
        let mut rng = headwater_common::rng::Xoshiro256pp::seed_from_u64(3);
        for trial in 0..20 {
            let median = 1.2e-3 * 1.37f64.powi(trial);
            let ranks: Vec<Vec<f64>> = (0..4)
                .map(|r| lognormal(&mut rng, median * (1.0 + 0.4 * f64::from(r)), 0.7, 3000))
                .collect();
            let hists: Vec<FixedHistogram> = ranks
                .iter()
                .map(|xs| {
                    let mut h = FixedHistogram::new(latency_edges(), QuantileRule::Midpoint);
                    for &x in xs {
                        h.record(x);
                    }
                    h
                })
                .collect();
            // Single rank.
            let mut one = ranks[0].clone();
            for q in [0.5, 0.95] {
                let err = hists[0].quantile(q) / exact(&mut one, q) - 1.0;
                assert!(
                    err.abs() <= 0.10,
                    "trial {trial} q {q}: single rank off by {err}"
                );
            }
            // Four ranks merged by summing bucket counts.
            let edges = latency_edges();
            let merged: Vec<u64> = (0..edges.len())
                .map(|i| hists.iter().map(|h| h.counts()[i]).sum())
                .collect();
            let mx = hists
                .iter()
                .map(FixedHistogram::max)
                .fold(f64::NEG_INFINITY, f64::max);
            let mut all: Vec<f64> = ranks.concat();
            for q in [0.5, 0.95] {
                let got = quantile_from_buckets(&edges, &merged, q, mx, QuantileRule::Midpoint);
                let err = got / exact(&mut all, q) - 1.0;
                assert!(
                    err.abs() <= 0.10,
                    "trial {trial} q {q}: merged off by {err}"
                );
            }
        }
    }

    #[test]
    fn latency_layout_is_log_linear_with_eight_sub_buckets() {
        let e = latency_edges();
        assert_eq!(e.len(), 1 + 24 * 8 + 1);
        for w in e[..e.len() - 1].windows(2) {
            assert!(w[1] > w[0]);
            assert!(w[1] / w[0] <= 1.0 + 1.0 / 8.0 + 1e-12, "{w:?}");
        }
        assert_eq!(e[0], 2f64.powi(-20));
        assert_eq!(e[e.len() - 2], 16.0);
    }
}
