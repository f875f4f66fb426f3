//! When a row's label becomes known (docs/contexts.md, "Labels known
//! later"): a cell task's `label_time_column`, or the row's own time.
//!
//! A row of the anchor table shows its label (the target column and the
//! task's `label_columns`) in a context only if the label was known at the
//! seed's observation time, and it is an in-context example only then.
//! The seed's own label cells are never shown. `label_leaks` counts, from
//! these times and independently of the hiding, every label cell shown that
//! was not yet known.

use crate::format::{ColumnValues, ColumnView, GraphView};

/// The label times of one cell task's anchor table.
#[derive(Clone, Copy)]
pub struct LabelTimes<'a> {
    /// Global id of the table's first row.
    pub row_offset: u32,
    /// The `label_time_column`, if the task has one (a null: never known).
    pub column: Option<ColumnView<'a>>,
}

impl LabelTimes<'_> {
    /// When `row`'s label becomes known: `i64::MIN` (always) for an undated
    /// row of a task without a label time column, `i64::MAX` for a null
    /// label time.
    #[inline]
    pub fn at(&self, g: &GraphView<'_>, row: u32) -> i64 {
        match &self.column {
            None => g.time_of(row).unwrap_or(i64::MIN),
            Some(c) => {
                let i = (row - self.row_offset) as usize;
                match c.values {
                    ColumnValues::Timestamp(v) if c.read(i) => v[i],
                    _ => i64::MAX,
                }
            }
        }
    }

    /// Whether `row`'s label was known at `obs_time` (a seed without a time,
    /// `i64::MAX`, knows every label).
    #[inline]
    pub fn known(&self, g: &GraphView<'_>, row: u32, obs_time: i64) -> bool {
        obs_time == i64::MAX || self.at(g, row) <= obs_time
    }
}
