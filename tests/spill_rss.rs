//! Building the graph's reverse CSR needs 8 bytes per row and 4 per edge;
//! the preprocessor keeps them in file-backed spill maps so that they are
//! page-cache pages, not the process's private memory, whatever the
//! database's size (`--memory-limit` bounds private memory). Its own test
//! binary (one process, nothing else allocating beside it), so the
//! anonymous pages counted are this test's.

// Tests spell out their cases in line; the 80-line bound on functions
// (clippy.toml) is for the library.
#![allow(clippy::too_many_lines)]

use headwater::spill::{build_reverse, SpillArray};

/// This process's resident anonymous pages (`RssAnon`), bytes.
fn rss_anon() -> u64 {
    headwater::sampler::current_private_bytes().expect("/proc/self/status RssAnon")
}

#[test]
fn the_reverse_csr_of_a_large_graph_is_not_private_memory() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    // 4 M rows, each but the first 1024 with two parents among those:
    // 8 M edges, so offsets 32 MiB, targets 32 MiB, row times 32 MiB.
    let n = 4usize << 20;
    let parents = |r: usize, out: &mut Vec<u32>| {
        if r >= 1024 {
            out.push((r % 1024) as u32);
            out.push(((r / 7) % 1024) as u32);
        }
    };
    let before = rss_anon();
    let mut row_time = SpillArray::<i64>::zeroed(&dir.path().join("t.spill"), n).unwrap();
    for (r, t) in row_time.iter_mut().enumerate() {
        *t = ((r * 2_654_435_761) % 1_000_003) as i64;
    }
    let csr = build_reverse(dir.path(), n, &row_time, parents).unwrap();
    let grown = rss_anon().saturating_sub(before);
    // The result is right: every edge once, children by (time, id).
    assert_eq!(csr.rev_offsets[n], 2 * (n as u64 - 1024));
    let kids = &csr.rev_targets[csr.rev_offsets[5] as usize..csr.rev_offsets[6] as usize];
    assert!(kids.len() > 4000);
    assert!(kids
        .windows(2)
        .all(|w| (row_time[w[0] as usize], w[0]) <= (row_time[w[1] as usize], w[1])));
    assert!(
        grown < 16 * MIB,
        "building a 96 MiB reverse CSR grew private memory by {} MiB",
        grown / MIB
    );
}
