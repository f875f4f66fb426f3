//! Which splits' labels a seed may see as in-context examples
//! (docs/contexts.md, "Splits"): one rule for every task kind. Splits are
//! ordered train < val < test, and a seed of split s shows the label of an
//! example only if the example's split is at most s: a training seed sees
//! training labels only, a validation seed training and validation labels,
//! a test seed all three. The time rules (`incontext.rs`, `items.rs`,
//! `labels.rs`) hold on top of it.
//!
//! An example candidate is a row of the seed's table (a cell task: its
//! split is the split of the task's seed at that row) or an item (a
//! forecast task: the item is a seed of the task, with its own split). The
//! codes are each seed's split as the seed pools read it (stored codes, or
//! the hash rule: `crate::seeds::task_split_codes`, computed by the maker
//! once per task), so a candidate is in the same split as an example as it
//! is as a seed.
//!
//! Never: a split decided here (the codes are given), or a row without a
//! seed shown (it is in no split).

/// The split code of a candidate in no split: never shown.
const NONE: u8 = u8::MAX;

/// The split rule of one task's examples for seeds of one split.
#[derive(Clone, Copy, Debug)]
pub struct ExampleSplits<'a> {
    /// Split code (0 train, 1 val, 2 test) of each candidate: by row offset
    /// in the seed's table for a cell task ([`row_codes`]), by item for a
    /// forecast task; any other code (or none) is never shown.
    pub codes: &'a [u8],
    /// The seeds' split code.
    pub seed: u8,
}

impl ExampleSplits<'_> {
    /// Whether candidate `c`'s label may be shown to the seed.
    #[inline]
    pub fn shows(&self, c: u32) -> bool {
        self.codes.get(c as usize).is_some_and(|&x| x <= self.seed)
    }
}

/// A cell task's candidate codes: for each row of its anchor table
/// (`table = [lo, hi)`), the split code of the task's seed at that row
/// (`seed_codes[j]` for the seed at `anchor_rows[j]`; the latest split
/// when a row has several seeds), none for a row that is no seed.
pub fn row_codes(table: (u32, u32), anchor_rows: &[u32], seed_codes: &[u8]) -> Vec<u8> {
    let (lo, hi) = table;
    let mut out = vec![NONE; (hi - lo) as usize];
    for (&row, &code) in anchor_rows.iter().zip(seed_codes) {
        if let Some(slot) = row.checked_sub(lo).and_then(|i| out.get_mut(i as usize)) {
            *slot = if *slot == NONE {
                code
            } else {
                (*slot).max(code)
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_sees_its_split_and_earlier_ones_only() {
        // Rows 10..15: row 11 train, 12 val and test (test wins), 13 test,
        // 14 no seed; a seed outside the table is ignored.
        let codes = row_codes((10, 15), &[11, 12, 13, 12, 20], &[0, 1, 2, 2, 0]);
        assert_eq!(codes, [NONE, 0, 2, 2, NONE]);
        let shown = |seed: u8| -> Vec<u32> {
            let s = ExampleSplits {
                codes: &codes,
                seed,
            };
            (0..6).filter(|&c| s.shows(c)).collect()
        };
        assert_eq!(shown(0), [1], "train seeds: train rows only");
        assert_eq!(shown(1), [1], "val seeds: no test row");
        assert_eq!(
            shown(2),
            [1, 2, 3],
            "test seeds: every split, no unseeded row"
        );
    }
}
