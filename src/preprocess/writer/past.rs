//! Statistics from the past only: which rows feed a column's mean, std, min
//! and max, and the [`StatsRule`] that records it in `metadata.json`.
//!
//! The rule: the statistics come from what a model may see before the
//! earliest scored period. With a validation cutoff
//! ([`DatabaseWriter::set_stats_cutoff`]), a row of a table with a time
//! column counts only when it is dated at or before the cutoff (undated
//! rows count; tables without a time column count whole), and a supplied
//! task's seed only when its observation time is. A supplied task's target
//! also leaves out its val/test seeds: the stored split where it has one,
//! else the hash split under the sampler's default settings (the sampler's
//! own split seed is not known when the database is written). Every row is
//! still normalised, with these statistics.
//!
//! Invariants: a table's counted rows are one bit per row, fixed before its
//! first column and checked against the row times `end_table` gets; a
//! task's are decided per seed, never held. Never: let a row dated after
//! the cutoff reach a statistic.

use super::{DatabaseWriter, TaskInput};
use crate::config::SamplerConfig;
use crate::error::{Error, Result};
use crate::format::{pack_bits, Split, StatsRule};
use crate::seeds::split_of;

/// One bit per row (see [`crate::format::bit`]): set where the row is
/// dated at or before `cutoff`. An undated row (`i64::MIN`) is before
/// every cutoff, so it counts.
pub(super) fn rows_up_to(row_time: &[i64], cutoff: i64) -> Vec<u8> {
    pack_bits(row_time.iter().map(|&t| t <= cutoff))
}

/// The split settings a supplied task target's statistics assume when it
/// has no stored split: the sampler's defaults.
fn default_split() -> (u64, [f64; 3]) {
    let c = SamplerConfig::default();
    (c.split_seed, c.split_ratios)
}

/// Which seeds of a supplied task feed its target's statistics: train seeds
/// (stored split code 0, else the default hash split) observed at or before
/// the cutoff (non-temporal seeds always).
pub(super) struct SeedRule<'a> {
    task: u32,
    /// Global row id of the anchor table's first row.
    base: u32,
    anchors: &'a [u32],
    obs_time: &'a [i64],
    splits: Option<&'a [u8]>,
    cutoff: Option<i64>,
    split_seed: u64,
    ratios: [f64; 3],
}

impl SeedRule<'_> {
    /// Does seed `i`'s target feed the statistics?
    pub(super) fn counts(&self, i: usize) -> bool {
        let hashed = || {
            let row = self.base + self.anchors[i];
            split_of(self.task, row, self.split_seed, self.ratios) == Split::Train
        };
        let train = self.splits.map_or_else(hashed, |codes| {
            Split::from_code(codes[i]) == Some(Split::Train)
        });
        let t = self.obs_time[i];
        train && (t == i64::MAX || self.cutoff.is_none_or(|c| t <= c))
    }
}

impl DatabaseWriter {
    /// Leave every row dated after `cutoff_us` (µs since the epoch: the
    /// validation cutoff, RelBench's `val_timestamp`) out of the
    /// statistics. Set before the first table; a restarted run reuses a
    /// staged table only when its fingerprint matches, so put the cutoff
    /// in the fingerprint.
    pub fn set_stats_cutoff(&mut self, cutoff_us: i64) -> Result<()> {
        if !self.tables.is_empty() || self.open.is_some() {
            return Err(Error::Preprocess(format!(
                "statistics cutoff {cutoff_us}: set it before the first table ({} begun)",
                self.tables.len() + usize::from(self.open.is_some())
            )));
        }
        if cutoff_us == i64::MIN || cutoff_us == i64::MAX {
            return Err(Error::invalid(
                "stats_cutoff",
                format!("{cutoff_us} is the no-time marker, not a time"),
            ));
        }
        self.stats_cutoff = Some(cutoff_us);
        Ok(())
    }

    /// The statistics cutoff (µs), if one is set.
    pub fn stats_cutoff(&self) -> Option<i64> {
        self.stats_cutoff
    }

    /// `end_table`'s row times pick the rows `set_row_times`' did (`past`,
    /// kept for table `table` when a cutoff applies).
    pub(super) fn check_same_past(
        &self,
        table: &str,
        past: Option<&[u8]>,
        row_time: &[i64],
    ) -> Result<()> {
        let (Some(past), Some(cutoff)) = (past, self.stats_cutoff) else {
            return Ok(());
        };
        if rows_up_to(row_time, cutoff) == past {
            return Ok(());
        }
        Err(Error::Preprocess(format!(
            "table `{table}`: the row times given to end_table differ from those given to set_row_times (rows on the other side of the statistics cutoff {cutoff} µs)"
        )))
    }

    /// The rule `metadata.json` records.
    pub(super) fn stats_rule(&self) -> StatsRule {
        let (split_seed, split_ratios) = default_split();
        StatsRule {
            cutoff_us: self.stats_cutoff,
            split_seed,
            split_ratios,
        }
    }

    /// The rule for the seeds of supplied task `task` (its index), anchored
    /// in the table whose first row has global id `base`.
    pub(super) fn seed_rule<'a>(
        &self,
        task: u32,
        base: u32,
        input: &TaskInput<'a>,
    ) -> SeedRule<'a> {
        let (split_seed, ratios) = default_split();
        SeedRule {
            task,
            base,
            anchors: input.anchor_rows,
            obs_time: input.obs_time,
            splits: input.splits,
            cutoff: self.stats_cutoff,
            split_seed,
            ratios,
        }
    }
}
