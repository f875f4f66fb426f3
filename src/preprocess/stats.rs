//! Column statistics, merged exactly across chunks (Chan et al.), and the
//! rule that picks the rows they come from: a column's mean, std, min and
//! max are computed over the rows a model may see before the earliest
//! scored period (the `counted` rows of [`column_stats`]); its counts cover
//! every row. See docs/preprocessing.md, "Statistics from the past only".

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

/// Statistics of a column: `values` yields `(value, present)` per row;
/// absent and non-finite values count as null. `counted` picks the rows
/// whose values feed the mean, std, min and max (`None`: every row), which
/// then records how many did (`stats_count`); `count` and `null_count`
/// always cover every row, as they describe the stored column.
pub fn column_stats(
    values: impl Iterator<Item = (f64, bool)>,
    counted: Option<&dyn Fn(usize) -> bool>,
) -> (RunningStats, ColumnStats) {
    let mut rs = RunningStats::default();
    let (mut nonnull, mut nulls) = (0u64, 0u64);
    for (i, (x, ok)) in values.enumerate() {
        if !(ok && x.is_finite()) {
            nulls += 1;
            continue;
        }
        nonnull += 1;
        if counted.is_none_or(|keep| keep(i)) {
            rs.push(x);
        }
    }
    let cs = ColumnStats {
        count: nonnull,
        null_count: nulls,
        mean: rs.mean,
        std: rs.std(),
        min: if rs.count > 0 { rs.min } else { 0.0 },
        max: if rs.count > 0 { rs.max } else { 0.0 },
        stats_count: counted.map(|_| rs.count),
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
        let rows = [(1.0, true), (f64::NAN, true), (3.0, true), (9.0, false)];
        let (rs, cs) = column_stats(rows.into_iter(), None);
        assert_eq!(rs.count, 2);
        assert_eq!(cs.null_count, 2);
        assert_eq!(cs.mean, 2.0);
        assert_eq!(cs.stats_count, None, "no rule: every value counted");
    }

    #[test]
    fn rows_left_out_feed_no_value_statistic_but_are_counted() {
        let rows = [(1.0, true), (3.0, true), (1000.0, true), (f64::NAN, true)];
        let past = |i: usize| i < 2;
        let (rs, cs) = column_stats(rows.into_iter(), Some(&past));
        let (_, only_past) = column_stats(rows[..2].iter().copied(), None);
        assert_eq!(rs.count, 2);
        assert_eq!((cs.count, cs.null_count), (3, 1), "counts cover every row");
        assert_eq!(cs.stats_count, Some(2));
        assert_eq!(
            (cs.mean, cs.std, cs.min, cs.max),
            (only_past.mean, only_past.std, only_past.min, only_past.max)
        );
    }
}
