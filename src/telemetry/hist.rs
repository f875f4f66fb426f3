//! Fixed-edge histograms: bucket counts merge exactly by summation, so a
//! cluster percentile computed from summed buckets is exact to the bucket.

use std::sync::Arc;

/// Counts of values per bucket; bucket `i` holds `edges[i-1] < v <= edges[i]`
/// (Prometheus `le` semantics); the last edge is `+inf`.
#[derive(Debug, Clone, PartialEq)]
pub struct FixedHistogram {
    edges: Arc<[f64]>,
    counts: Vec<u64>,
    max: f64,
    total: u64,
}

impl FixedHistogram {
    pub fn new(edges: Arc<[f64]>) -> Self {
        debug_assert!(edges.last() == Some(&f64::INFINITY));
        let n = edges.len();
        FixedHistogram {
            edges,
            counts: vec![0; n],
            max: f64::NEG_INFINITY,
            total: 0,
        }
    }

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

    pub fn edges(&self) -> &[f64] {
        &self.edges
    }
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }
    pub fn total(&self) -> u64 {
        self.total
    }
    pub fn max(&self) -> f64 {
        self.max
    }

    pub fn clear(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.max = f64::NEG_INFINITY;
        self.total = 0;
    }

    /// The `q`-quantile from the buckets: the upper edge of the bucket that
    /// holds it (the observed max for the `+inf` bucket).
    pub fn quantile(&self, q: f64) -> f64 {
        quantile_from_buckets(&self.edges, &self.counts, q, self.max)
    }
}

/// The same rule on raw counts (used for merged cluster buckets too).
pub fn quantile_from_buckets(edges: &[f64], counts: &[u64], q: f64, max: f64) -> f64 {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return f64::NAN;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut acc = 0;
    for (i, &c) in counts.iter().enumerate() {
        acc += c;
        if acc >= rank {
            let e = edges[i];
            return if e.is_finite() { e.min(max) } else { max };
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_use_le_semantics_and_quantiles_are_bucket_edges() {
        let mut h = FixedHistogram::new(vec![1.0, 2.0, 4.0, f64::INFINITY].into());
        for v in [0.5, 1.0, 1.5, 2.0, 3.0, 9.0] {
            h.record(v);
        }
        assert_eq!(h.counts(), &[2, 2, 1, 1]);
        assert_eq!(h.quantile(0.5), 2.0);
        assert_eq!(h.quantile(1.0), 9.0);
        assert_eq!(h.quantile(0.1), 1.0);
    }
}
