//! Building the bidirectional CSR from per-row parent lists, in bounded
//! private memory.
//!
//! F→P edges keep foreign-key column order per row; they are streamed
//! straight into `graph.bin` ([`write_forward`]), never held. P→F edges
//! ([`build_reverse`]) are grouped by parent and sorted by (child time,
//! child id), so the children visible at a cutoff are a prefix; building them
//! needs 8 bytes per row (offsets) and 4 per edge, held in [`SpillArray`]s
//! (file-backed, so the page cache, not the process, holds them), and the
//! child times are streamed out ([`write_reverse`]).

use std::path::Path;

use rayon::prelude::*;

use super::arrays::SpillArray;

use crate::error::Result;
use crate::format::{FileWriter, Section};

/// Values per buffered write while streaming a section.
const CHUNK: usize = 1 << 16;

/// Parents per parallel sorting task in [`build_reverse`].
const SORT_BLOCK: usize = 1 << 14;

/// The P→F half of the graph, ready to write (the child times are streamed
/// from it by [`write_reverse`]).
pub struct ReverseCsr {
    /// Row `r`'s children are `rev_targets[rev_offsets[r]..rev_offsets[r + 1]]`.
    pub rev_offsets: SpillArray<u64>,
    /// Child rows, grouped by parent, sorted by time.
    pub rev_targets: SpillArray<u32>,
}

/// Write the F→P sections (`fwd_offsets`, then `fwd_targets`) to `w`, two
/// passes over `parents(r, out)` (which appends row `r`'s parents to `out`).
/// Returns the number of edges.
pub fn write_forward(
    w: &mut FileWriter,
    num_rows: usize,
    mut parents: impl FnMut(usize, &mut Vec<u32>),
) -> Result<u64> {
    let mut scratch = Vec::new();
    let mut offs: Vec<u64> = Vec::with_capacity(CHUNK);
    let mut edges = 0u64;
    w.begin_section()?;
    offs.push(0);
    for r in 0..num_rows {
        scratch.clear();
        parents(r, &mut scratch);
        edges += scratch.len() as u64;
        offs.push(edges);
        if offs.len() == CHUNK {
            w.append(Section::of(&offs))?;
            offs.clear();
        }
    }
    w.append(Section::of(&offs))?;
    let mut targets: Vec<u32> = Vec::with_capacity(CHUNK);
    w.begin_section()?;
    for r in 0..num_rows {
        parents(r, &mut targets);
        if targets.len() >= CHUNK {
            w.append(Section::of(&targets))?;
            targets.clear();
        }
    }
    w.append(Section::of(&targets))?;
    Ok(edges)
}

/// Build the P→F half in two spill files in `dir`. `parents(r, out)` appends
/// the parents of row `r` to `out`; `row_time[r]` is each row's time
/// (`i64::MIN` when it has none). Needs 8 bytes per row and 4 per edge beyond
/// its inputs, all spilled: the offsets are their own fill cursors (children
/// placed from each segment's end, highest id first), then shifted back into
/// place.
pub fn build_reverse(
    dir: &Path,
    num_rows: usize,
    row_time: &[i64],
    mut parents: impl FnMut(usize, &mut Vec<u32>),
) -> Result<ReverseCsr> {
    let mut scratch = Vec::new();
    let mut counts = SpillArray::<u64>::zeroed(&dir.join("rev_offsets.spill"), num_rows + 1)?;
    for r in 0..num_rows {
        scratch.clear();
        parents(r, &mut scratch);
        for &p in &scratch {
            counts[p as usize + 1] += 1;
        }
    }
    for i in 0..num_rows {
        counts[i + 1] += counts[i];
    }
    let e = counts[num_rows] as usize;
    // counts[p + 1] is the end of parent p's segment: fill backwards.
    let mut rev_targets = SpillArray::<u32>::zeroed(&dir.join("rev_targets.spill"), e)?;
    for child in (0..num_rows).rev() {
        scratch.clear();
        parents(child, &mut scratch);
        for &p in scratch.iter().rev() {
            let end = &mut counts[p as usize + 1];
            *end -= 1;
            rev_targets[*end as usize] = child as u32;
        }
    }
    // Now counts[p + 1] is the start of segment p: shift back.
    counts.copy_within(1.., 0);
    counts[num_rows] = e as u64;
    let rev_offsets = counts;
    // Children were filled in increasing id order; a stable sort by time
    // gives (time, id) order. Sort blocks of parents in parallel (a block's
    // segments are one contiguous run of `rev_targets`), holding one slice
    // per block, not one per parent.
    let mut blocks: Vec<(usize, &mut [u32])> = Vec::new();
    let mut rest: &mut [u32] = &mut rev_targets;
    for start in (0..num_rows).step_by(SORT_BLOCK) {
        let end = (start + SORT_BLOCK).min(num_rows);
        let len = (rev_offsets[end] - rev_offsets[start]) as usize;
        let (block, tail) = rest.split_at_mut(len);
        blocks.push((start, block));
        rest = tail;
    }
    let offsets = &rev_offsets[..];
    blocks.par_iter_mut().for_each(|(start, block)| {
        let base = offsets[*start];
        let end = (*start + SORT_BLOCK).min(num_rows);
        for p in *start..end {
            let seg = &mut block[(offsets[p] - base) as usize..(offsets[p + 1] - base) as usize];
            if seg.len() > 1 {
                seg.sort_by_key(|&c| row_time[c as usize]);
            }
        }
    });
    drop(blocks);
    Ok(ReverseCsr {
        rev_offsets,
        rev_targets,
    })
}

/// Write the P→F sections (`rev_offsets`, `rev_targets`, then each child's
/// time, computed a chunk at a time) to `w`.
pub fn write_reverse(w: &mut FileWriter, rev: &ReverseCsr, row_time: &[i64]) -> Result<()> {
    w.section(Section::of(&rev.rev_offsets[..]))?;
    w.section(Section::of(&rev.rev_targets[..]))?;
    w.begin_section()?;
    let mut times: Vec<i64> = Vec::with_capacity(CHUNK);
    for chunk in rev.rev_targets.chunks(CHUNK) {
        times.clear();
        times.extend(chunk.iter().map(|&c| row_time[c as usize]));
        w.append(Section::of(&times))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_sorted_by_time_then_id_and_every_edge_both_ways() {
        // rows 0,1 parents; rows 2..6 children with times.
        let times = [i64::MIN, i64::MIN, 50, 10, 30, 10, i64::MIN];
        let parent_of = [None, None, Some(0u32), Some(0), Some(1), Some(0), Some(1)];
        let tmp = tempfile::tempdir().unwrap();
        let csr = build_reverse(tmp.path(), 7, &times, |r, out| out.extend(parent_of[r])).unwrap();
        let kids0 = &csr.rev_targets[csr.rev_offsets[0] as usize..csr.rev_offsets[1] as usize];
        assert_eq!(kids0, &[3, 5, 2]);
        let kids1 = &csr.rev_targets[csr.rev_offsets[1] as usize..csr.rev_offsets[2] as usize];
        assert_eq!(kids1, &[6, 4]);
        assert_eq!(&csr.rev_offsets[..], &[0, 3, 5, 5, 5, 5, 5, 5]);
        // The scratch files go with the arrays.
        drop(csr);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn streamed_forward_sections_are_the_bytes_of_whole_ones() {
        use crate::format::FileKind;
        let tmp = tempfile::tempdir().unwrap();
        // Enough rows to cross several write chunks.
        let n = 2 * CHUNK + 7;
        let parents = |r: usize, out: &mut Vec<u32>| {
            if r % 3 != 0 {
                out.push((r / 3) as u32);
            }
            if r % 5 == 0 {
                out.push(1);
            }
        };
        let a = tmp.path().join("a");
        let mut w = FileWriter::create(&a, FileKind::Graph, 2).unwrap();
        let edges = write_forward(&mut w, n, parents).unwrap();
        w.finish().unwrap();
        let (mut offs, mut targets) = (vec![0u64], vec![]);
        for r in 0..n {
            parents(r, &mut targets);
            offs.push(targets.len() as u64);
        }
        let b = tmp.path().join("b");
        let mut w = FileWriter::create(&b, FileKind::Graph, 2).unwrap();
        w.section(Section::of(&offs)).unwrap();
        w.section(Section::of(&targets)).unwrap();
        w.finish().unwrap();
        assert_eq!(edges, targets.len() as u64);
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    }
}
