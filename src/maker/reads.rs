//! What a batch's reads cost in storage, for telemetry: how much of its
//! working set was already in the page cache, and the stored bytes it used
//! (the denominator of the read amplification, whose numerator is the
//! kernel's `read_bytes`, `crate::probes`).
//!
//! **Residency, sampled.** Just before assembly reads the cells of the rows
//! the BFS found, [`probe_residency`] asks the kernel (`mincore`, one call
//! per page, nothing faulted in) whether the page holding one cell is in
//! the page cache, for [`PROBES`] cells spread over the batch's contexts:
//! a row and a stored column of it picked from the context's own generator
//! seed. The share of resident probes over the steps is the share of the
//! working set the page cache holds — the pages the run actually reads,
//! not the database's files, so a database larger than memory read a
//! window at a time reads as resident when its window fits. Why a sample
//! and why there: a batch reads thousands of cells on up to thousands of
//! pages, and a `mincore` per page read (or a scan of the mapped files,
//! ~340k pages for TPC-H SF 1) would cost more than the batch; four calls
//! cost 4–6 µs (1.0–1.4 µs each on the project's 2-core VM) of the ~700 µs
//! of CPU a batch of `B = 32`, `S = 1024` takes there, about 0.7 %, and add
//! no user-space work to speak of (callgrind: 9.483 M instructions a batch
//! against 9.488 M before); over a log window of tens of batches the share
//! is read from a hundred probes or more (a binomial standard error under
//! 5 points). The BFS reads the graph, not the table
//! files, so the probed pages are the ones assembly is about to read
//! (except the time column, which the temporal filter reads from the
//! graph's copy).
//!
//! **Useful bytes.** The batch's filled cells at its database's mean stored
//! bytes per cell ([`cell_bytes`]: the widths of the stored values, 1 to 8
//! bytes, weighted by rows) plus the text embeddings it collated (2 bytes a
//! dimension). What a batch needs at the least; the graph's adjacency, the
//! validity bitmaps and the page a value lies on are what the reads add.
//!
//! Never: reads a probed cell, draws from a stream generator, or changes a
//! batch.

use crate::batch::TableCells;
use crate::context::Subgraph;
use crate::format::{Metadata, SemanticType};
use crate::rng::mix64;

/// Cells whose pages are probed per batch.
pub(super) const PROBES: usize = 4;

/// `(probed, resident)`: pages probed and found in the page cache, over
/// [`PROBES`] cells of the rows of `subgraphs` (context `g` built from
/// `jobs[g]`, of the group `group_of(g)`, whose tables are `tables[group]`).
pub(super) fn probe_residency(
    subgraphs: &[Subgraph],
    jobs: &[(u32, u32, i64, u64)],
    group_of: impl Fn(usize) -> usize,
    tables: &[Vec<TableCells<'_>>],
) -> (u32, u32) {
    let n = subgraphs.len().min(jobs.len());
    let (mut probed, mut resident) = (0u32, 0u32);
    if n == 0 {
        return (0, 0);
    }
    for i in 0..PROBES {
        let g = i * n / PROBES;
        let sub = &subgraphs[g];
        if sub.rows.is_empty() {
            continue;
        }
        let h = mix64(jobs[g].3 ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let j = (h % sub.rows.len() as u64) as usize;
        let Some(tc) = tables
            .get(group_of(g))
            .and_then(|t| t.get(usize::from(sub.tables[j])))
        else {
            continue;
        };
        if tc.columns.is_empty() {
            continue;
        }
        let col = &tc.columns[((h >> 32) % tc.columns.len() as u64) as usize];
        let local = sub.rows[j].wrapping_sub(tc.row_offset) as usize;
        let Some(addr) = col.values.addr(local) else {
            continue;
        };
        if let Some(r) = crate::probes::page_resident(addr) {
            probed += 1;
            resident += u32::from(r);
        }
    }
    (probed, resident)
}

/// The mean stored bytes of a cell of `m`'s tables: each stored column's
/// value width, weighted by its table's rows (0 for a database without
/// cells).
pub(super) fn cell_bytes(m: &Metadata) -> f64 {
    let (mut bytes, mut cells) = (0.0f64, 0.0f64);
    for t in &m.tables {
        for &c in &t.columns {
            let width = match m.columns[c as usize].stype {
                SemanticType::Boolean => 1.0,
                SemanticType::Timestamp => 8.0,
                _ => 4.0,
            };
            #[allow(clippy::cast_precision_loss)]
            let rows = t.num_rows as f64;
            bytes += width * rows;
            cells += rows;
        }
    }
    if cells > 0.0 {
        bytes / cells
    } else {
        0.0
    }
}

impl super::SamplerCore {
    /// The readings of what `batch` cost in storage (the rest default):
    /// the bytes it used and its `(probed, resident)` pages.
    pub(super) fn storage_readings(
        &self,
        batch: &crate::batch::Batch,
        seqs: &[crate::readings::SeqReadings],
        (pages_probed, pages_resident): (u32, u32),
    ) -> crate::readings::BatchReadings {
        crate::readings::BatchReadings {
            useful_bytes: self.useful_bytes(batch, seqs),
            pages_probed,
            pages_resident,
            ..crate::readings::BatchReadings::default()
        }
    }

    /// The stored bytes `batch` used: each sequence's filled cells at its
    /// database's [`cell_bytes`], plus the text embeddings it collated.
    fn useful_bytes(
        &self,
        batch: &crate::batch::Batch,
        seqs: &[crate::readings::SeqReadings],
    ) -> u64 {
        let cells: f64 = seqs
            .iter()
            .enumerate()
            .map(|(q, r)| {
                let db = batch.seq_db_idx.get(q).map_or(0, |&d| d as usize);
                let width = self.dbs.get(db).map_or(0.0, |d| d.cell_bytes);
                f64::from(r.cells) * width
            })
            .sum();
        let texts = batch
            .num_text
            .saturating_mul(batch.text_dim)
            .saturating_mul(2);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let cells = cells.round() as u64;
        cells.saturating_add(texts as u64)
    }
}
