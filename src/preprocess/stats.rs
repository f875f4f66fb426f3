//! Column statistics, merged exactly across chunks (Chan et al.).

use crate::format::ColumnStats;

/// Count / mean / M2 accumulator that merges without loss of precision.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunningStats {
    /// Values seen.
    pub count: u64,
    /// Running mean.
    pub mean: f64,
    /// Sum of squared deviations from the mean (Welford).
    pub m2: f64,
    /// Smallest value seen.
    pub min: f64,
    /// Largest value seen.
    pub max: f64,
}

impl RunningStats {
    /// Add one value.
    pub fn push(&mut self, x: f64) {
        if self.count == 0 {
            self.min = x;
            self.max = x;
        } else {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Combine with the statistics of another, disjoint stream.
    pub fn merge(&mut self, o: &RunningStats) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *o;
            return;
        }
        let n = (self.count + o.count) as f64;
        let d = o.mean - self.mean;
        self.mean += d * o.count as f64 / n;
        self.m2 += o.m2 + d * d * self.count as f64 * o.count as f64 / n;
        self.count += o.count;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }

    /// Population standard deviation.
    pub fn std(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            (self.m2 / self.count as f64).sqrt()
        }
    }

    /// The std used to z-score: 1 when the column is constant or empty, so a
    /// constant column encodes as zeros rather than NaN.
    pub fn scale(&self) -> f64 {
        let s = self.std();
        if s.is_finite() && s > 0.0 {
            s
        } else {
            1.0
        }
    }
}

/// Statistics of `values` where `valid[i] != 0`; non-finite values count as null.
pub fn column_stats(values: impl Iterator<Item = (f64, bool)>) -> (RunningStats, ColumnStats) {
    let mut rs = RunningStats::default();
    let mut nulls = 0u64;
    for (x, ok) in values {
        if ok && x.is_finite() {
            rs.push(x);
        } else {
            nulls += 1;
        }
    }
    let cs = ColumnStats {
        count: rs.count,
        null_count: nulls,
        mean: rs.mean,
        std: rs.std(),
        min: if rs.count > 0 { rs.min } else { 0.0 },
        max: if rs.count > 0 { rs.max } else { 0.0 },
    };
    (rs, cs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_equals_single_pass() {
        let xs: Vec<f64> = (0..1000)
            .map(|i| ((i * 7919) % 1013) as f64 * 1.5e12 + 1.0e15)
            .collect();
        let mut all = RunningStats::default();
        for &x in &xs {
            all.push(x);
        }
        let mut a = RunningStats::default();
        let mut b = RunningStats::default();
        xs[..333].iter().for_each(|&x| a.push(x));
        xs[333..].iter().for_each(|&x| b.push(x));
        a.merge(&b);
        assert_eq!(a.count, all.count);
        assert!((a.mean - all.mean).abs() / all.mean < 1e-12);
        assert!((a.std() - all.std()).abs() / all.std() < 1e-9);
        let naive_mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((all.mean - naive_mean).abs() / naive_mean < 1e-12);
    }

    #[test]
    fn nan_counts_as_null() {
        let (rs, cs) =
            column_stats([(1.0, true), (f64::NAN, true), (3.0, true), (9.0, false)].into_iter());
        assert_eq!(rs.count, 2);
        assert_eq!(cs.null_count, 2);
        assert_eq!(cs.mean, 2.0);
    }
}
