//! A forecast (query) task's items as in-context examples
//! (docs/contexts.md, "Forecast tasks"): an item is one label row of the
//! task (anchor row r′, observation time t′, label y′), and its label
//! covers the window (t′, t′ + Δ], so it is known at t′ + Δ. An item is an
//! example of a seed observed at t only if its label is valid and its
//! window closed: t′ + Δ ≤ t (never merely t′ < t).
//!
//! Walks reach anchor rows, not items: a ranked row stands for its latest
//! eligible item (the most recent label known at t, of a split the seed
//! may see: `splits.rs`). [`ItemIndex`] lists
//! each anchor row's items by observation time, so that item is one binary
//! search away.
//!
//! Never: a random choice, or a read of the graph (the caller checks the
//! anchor row's own time and whether the context holds it).

use crate::format::bit;

/// Each anchor row's items, ordered by observation time (built once per
/// task when the sampler is made; owned by the maker).
#[derive(Debug, Default, Clone)]
pub struct ItemIndex {
    /// Items of local row `i` are `order[start[i]..start[i + 1]]`.
    start: Vec<u32>,
    /// Item indices (seed positions of the task file).
    order: Vec<u32>,
}

impl ItemIndex {
    /// The index of a task's items over its anchor table's rows
    /// `table = [lo, hi)`: `anchor_rows[j]` and `obs[j]` are item `j`'s.
    pub fn build(anchor_rows: &[u32], obs: &[i64], table: (u32, u32)) -> Self {
        let (lo, hi) = table;
        let n = (hi - lo) as usize;
        let mut start = vec![0u32; n + 1];
        for &r in anchor_rows {
            if let Some(i) = r.checked_sub(lo).filter(|&i| i < hi - lo) {
                start[i as usize + 1] += 1;
            }
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut next = start.clone();
        let mut order = vec![0u32; start[n] as usize];
        for (j, &r) in anchor_rows.iter().enumerate() {
            if let Some(i) = r.checked_sub(lo).filter(|&i| i < hi - lo) {
                order[next[i as usize] as usize] = j as u32;
                next[i as usize] += 1;
            }
        }
        for i in 0..n {
            let s = &mut order[start[i] as usize..start[i + 1] as usize];
            s.sort_unstable_by_key(|&j| (obs[j as usize], j));
        }
        ItemIndex { start, order }
    }
}

/// What an in-context build reads of a forecast task's items.
#[derive(Clone, Copy)]
pub struct TaskItems<'a> {
    /// The per-row index.
    pub index: &'a ItemIndex,
    /// Global id of the anchor table's first row.
    pub row_offset: u32,
    /// Anchor row of each item.
    pub anchor_rows: &'a [u32],
    /// Observation time of each item (`i64::MAX`: none).
    pub obs: &'a [i64],
    /// Validity bitmap of the items' labels.
    pub valid: &'a [u8],
    /// The label window Δ (µs, > 0).
    pub window: i64,
}

impl TaskItems<'_> {
    /// Number of items.
    #[inline]
    pub fn len(&self) -> usize {
        self.anchor_rows.len()
    }

    /// Whether the task has no items.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.anchor_rows.is_empty()
    }

    /// Whether item `j`'s window closed by `bound` (`i64::MAX`: the
    /// filter is off, or the seed has no time: every window is closed).
    #[inline]
    pub fn closed(&self, j: u32, bound: i64) -> bool {
        self.obs[j as usize].saturating_add(self.window) <= bound
    }

    /// Whether item `j` may be an example under `bound`: a valid label
    /// whose window closed.
    #[inline]
    pub fn eligible(&self, j: u32, bound: i64) -> bool {
        bit(self.valid, j as usize) && self.closed(j, bound)
    }

    /// The latest eligible item of anchor row `row` under `bound` among
    /// those `shown` lets the seed see (its split rule), if any.
    #[inline]
    pub fn latest(&self, row: u32, bound: i64, shown: impl Fn(u32) -> bool) -> Option<u32> {
        let i = row.checked_sub(self.row_offset)? as usize;
        let (a, b) = (*self.index.start.get(i)?, *self.index.start.get(i + 1)?);
        let items = &self.index.order[a as usize..b as usize];
        // Windows close in observation order: the closed ones are a prefix.
        let n = items.partition_point(|&j| self.closed(j, bound));
        items[..n]
            .iter()
            .rev()
            .copied()
            .find(|&j| bit(self.valid, j as usize) && shown(j))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_is_the_last_item_whose_window_closed() {
        // Rows 10..13; row 11 has items at 0, 50, 100 (window 30), row 12
        // one at 5 whose label is null.
        let rows = [11, 12, 11, 11];
        let obs = [100, 5, 0, 50];
        let valid = [0b1101u8];
        let index = ItemIndex::build(&rows, &obs, (10, 13));
        let it = TaskItems {
            index: &index,
            row_offset: 10,
            anchor_rows: &rows,
            obs: &obs,
            valid: &valid,
            window: 30,
        };
        let all = |_| true;
        assert_eq!(it.latest(10, i64::MAX, all), None, "a row without items");
        assert_eq!(
            it.latest(12, i64::MAX, all),
            None,
            "a null label is no example"
        );
        assert_eq!(it.latest(11, 29, all), None, "0 + 30 > 29: not yet closed");
        assert_eq!(it.latest(11, 30, all), Some(2), "0 + 30 <= 30");
        assert_eq!(it.latest(11, 129, all), Some(3), "100 + 30 > 129: item 50");
        assert_eq!(it.latest(11, 130, all), Some(0));
        assert_eq!(it.latest(13, i64::MAX, all), None, "outside the table");
        assert!(it.eligible(3, 80) && !it.eligible(3, 79) && !it.eligible(1, 100));
        // An item the seed may not see is passed over for an earlier one.
        assert_eq!(it.latest(11, 130, |j| j != 0), Some(3));
        assert_eq!(it.latest(11, 130, |j| j == 2), Some(2));
    }
}
