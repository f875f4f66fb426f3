//! Building the bidirectional CSR from per-row parent lists.
//!
//! F→P edges keep foreign-key column order per row. P→F edges are grouped by
//! parent and sorted by (child time, child id), so the children visible at a
//! cutoff are a prefix.

use rayon::prelude::*;

/// A built graph, ready to write.
pub struct Csr {
    /// Row `r`'s parents are `fwd_targets[fwd_offsets[r]..fwd_offsets[r + 1]]`.
    pub fwd_offsets: Vec<u64>,
    /// Parent rows (child → parent edges), grouped by child.
    pub fwd_targets: Vec<u32>,
    /// Row `r`'s children are `rev_targets[rev_offsets[r]..rev_offsets[r + 1]]`.
    pub rev_offsets: Vec<u64>,
    /// Child rows, grouped by parent, sorted by time.
    pub rev_targets: Vec<u32>,
    /// Time of each child in `rev_targets` (for the time filter).
    pub rev_times: Vec<i64>,
}

/// Build the CSR. `parents(r, out)` appends the parents of row `r` to `out`;
/// `row_time[r]` is each row's time (`i64::MIN` when it has none).
pub fn build_csr(
    num_rows: usize,
    row_time: &[i64],
    mut parents: impl FnMut(usize, &mut Vec<u32>),
) -> Csr {
    let mut fwd_offsets = Vec::with_capacity(num_rows + 1);
    let mut fwd_targets = Vec::new();
    fwd_offsets.push(0u64);
    for r in 0..num_rows {
        parents(r, &mut fwd_targets);
        fwd_offsets.push(fwd_targets.len() as u64);
    }
    let e = fwd_targets.len();
    let mut counts = vec![0u64; num_rows + 1];
    for &p in &fwd_targets {
        counts[p as usize + 1] += 1;
    }
    for i in 0..num_rows {
        counts[i + 1] += counts[i];
    }
    let rev_offsets = counts;
    let mut cursor: Vec<u64> = rev_offsets[..num_rows].to_vec();
    let mut rev_targets = vec![0u32; e];
    for child in 0..num_rows {
        let (a, b) = (fwd_offsets[child] as usize, fwd_offsets[child + 1] as usize);
        for &p in &fwd_targets[a..b] {
            let slot = &mut cursor[p as usize];
            rev_targets[*slot as usize] = child as u32;
            *slot += 1;
        }
    }
    drop(cursor);
    // Children were filled in increasing id order; a stable sort by time
    // gives (time, id) order. Sort segments in parallel.
    let mut segments: Vec<&mut [u32]> = Vec::new();
    let mut rest: &mut [u32] = &mut rev_targets;
    for p in 0..num_rows {
        let len = (rev_offsets[p + 1] - rev_offsets[p]) as usize;
        let (seg, tail) = rest.split_at_mut(len);
        if len > 1 {
            segments.push(seg);
        }
        rest = tail;
    }
    segments
        .par_iter_mut()
        .for_each(|seg| seg.sort_by_key(|&c| row_time[c as usize]));
    drop(segments);
    let rev_times = rev_targets
        .par_iter()
        .map(|&c| row_time[c as usize])
        .collect();
    Csr {
        fwd_offsets,
        fwd_targets,
        rev_offsets,
        rev_targets,
        rev_times,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_sorted_by_time_then_id_and_every_edge_both_ways() {
        // rows 0,1 parents; rows 2..6 children with times.
        let times = [i64::MIN, i64::MIN, 50, 10, 30, 10, i64::MIN];
        let parent_of = [None, None, Some(0u32), Some(0), Some(1), Some(0), Some(1)];
        let csr = build_csr(7, &times, |r, out| out.extend(parent_of[r]));
        assert_eq!(csr.fwd_targets, vec![0, 0, 1, 0, 1]);
        let kids0 = &csr.rev_targets[csr.rev_offsets[0] as usize..csr.rev_offsets[1] as usize];
        assert_eq!(kids0, &[3, 5, 2]);
        let kids1 = &csr.rev_targets[csr.rev_offsets[1] as usize..csr.rev_offsets[2] as usize];
        assert_eq!(kids1, &[6, 4]);
        let t1 = &csr.rev_times[csr.rev_offsets[1] as usize..csr.rev_offsets[2] as usize];
        assert_eq!(t1, &[i64::MIN, 30]);
    }
}
