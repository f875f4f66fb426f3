//! The walk graph of the `walks` ranker (`super::walks`): the FK graph as
//! random walks read it, one record of `u32` words per row, so a walk
//! chases records and never looks a row id up in a second array.
//!
//! Invariant: a mapped graph's records and row offsets are read only after
//! [`WalkGraph::record_ok`] / [`WalkGraph::start_of`] found every block
//! holding them checked (hashed at their first read, as the database's
//! own files are: `crate::format::Blocks`, reporting to the database's
//! `Integrity`), and the record inside the records. A record that fails
//! ends the walk there, as the dead record does, and the failure recorded
//! fails the batch: no batch is built from an unchecked or corrupt block.
//! Once every block is checked (or for a graph built in memory) the check
//! is one relaxed load.

// The per-step checks are forced inline: they run once per walk step.
#![allow(clippy::inline_always)]

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::{Blocks, GraphView, Integrity, RANDOM_BLOCK_SHIFT};
use crate::rng::mix64;

mod file;

/// Words of a record before its neighbours: row, parents, children, rank
/// of the latest child.
pub(super) const HEAD: usize = 4;

/// The FK graph as random walks read it: one record of `u32` words per row
/// — `[row, np, nc, last_rank, parent × np, (child, rank) × nc]`, its
/// parents then its time-sorted children, each named by the offset of its
/// own record, a child followed by its time rank (an index into `times`,
/// the sorted distinct child times) — plus a dead record that an
/// out-of-range row id of a corrupt payload leads to (a walk ends there).
/// Built once per database when `examples` is on, and kept in a file of
/// the database directory (`walks/`, see [`WalkGraph::open`]) mapped by
/// every process of the host: one copy in the page cache, not one per
/// rank in anonymous memory.
pub struct WalkGraph {
    // Views of `backing`'s buffers (see `view`); private, lent out only
    // for as long as `self` is borrowed.
    words: &'static [u32],
    /// Record offset of each row.
    at: &'static [u32],
    /// Distinct child times, sorted.
    times: &'static [i64],
    /// The mapped file's blocks, each checked at its first read; none (all
    /// checked) for a graph built in memory.
    blocks: Blocks,
    /// File offsets of `words` and `at` (0 in memory).
    words_at: usize,
    at_at: usize,
    /// The block of word 0 of `words` (which starts on a block) and log2
    /// of the words per block: word `o` lies in block
    /// `word_block + (o >> word_shift)`.
    word_block: usize,
    word_shift: u32,
    backing: Backing,
}

/// Where a walk graph's arrays live: built in this process, or a mapped
/// file. Never written after construction.
enum Backing {
    Owned {
        _words: Vec<u32>,
        _at: Vec<u32>,
        _times: Vec<i64>,
    },
    Mapped {
        map: memmap2::Mmap,
        /// The file, named in errors.
        path: PathBuf,
    },
}

impl std::fmt::Debug for WalkGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalkGraph")
            .field("words", &self.words.len())
            .field("rows", &self.at.len())
            .field("times", &self.times.len())
            .field("mapped", &matches!(self.backing, Backing::Mapped { .. }))
            .field("all_checked", &self.blocks.all_marked())
            .finish_non_exhaustive()
    }
}

/// `s` with the lifetime of the buffer it points into.
///
/// # Safety
/// The buffer must outlive every use of the result and never be written,
/// moved or freed meanwhile: a `Vec`'s heap buffer (moving the `Vec` does
/// not move it) or a read-only mapping, owned by the same `WalkGraph`.
unsafe fn view<T>(s: &[T]) -> &'static [T] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(s.as_ptr(), s.len()) }
}

impl WalkGraph {
    /// The walk graph of `g` (O(rows + edges)); an error when its records
    /// do not fit `u32` offsets (16 GiB of records).
    pub fn new(g: &GraphView<'_>) -> Result<Self> {
        let n = g.num_rows();
        let mut times: Vec<i64> = g.rev_times.to_vec();
        times.sort_unstable();
        times.dedup();
        let mut at = Vec::with_capacity(n);
        let mut len = 0u64;
        for u in 0..n as u32 {
            at.push(u32::try_from(len).map_err(|_| too_big(len))?);
            let (ids, _) = g.children(u);
            len += (HEAD + g.parents(u).len() + 2 * ids.len()) as u64;
        }
        let dead = u32::try_from(len).map_err(|_| too_big(len))?;
        let total = usize::try_from(len + HEAD as u64).map_err(|_| too_big(len))?;
        let mut words = Vec::with_capacity(total);
        advise_huge_pages(&words);
        let rank = |t: i64| times.partition_point(|&x| x < t) as u32;
        let off = |v: u32| at.get(v as usize).copied().unwrap_or(dead);
        for u in 0..n as u32 {
            let parents = g.parents(u);
            let (ids, ts) = g.children(u);
            let last = ts.last().map_or(0, |&t| rank(t));
            words.extend([u, parents.len() as u32, ids.len() as u32, last]);
            words.extend(parents.iter().map(|&v| off(v)));
            for (&v, &t) in ids.iter().zip(ts) {
                words.extend([off(v), rank(t)]);
            }
        }
        words.extend([u32::MAX, 0, 0, 0]);
        Ok(WalkGraph::owned(words, at, times))
    }

    fn owned(words: Vec<u32>, at: Vec<u32>, times: Vec<i64>) -> Self {
        // SAFETY: the buffers move into `backing` with `self` and are
        // never touched again (moving a `Vec` leaves its buffer in place).
        let (w, a, t) = unsafe { (view(&words), view(&at), view(&times)) };
        WalkGraph {
            words: w,
            at: a,
            times: t,
            // No bytes: every block is checked.
            blocks: Blocks::new(0, 0, RANDOM_BLOCK_SHIFT, None, Arc::default()),
            words_at: 0,
            at_at: 0,
            word_block: 0,
            word_shift: RANDOM_BLOCK_SHIFT - 2,
            backing: Backing::Owned {
                _words: words,
                _at: at,
                _times: times,
            },
        }
    }

    /// The records (see the type's doc): a record is read only after
    /// [`record_ok`](Self::record_ok) accepted it.
    #[inline]
    pub(super) fn words(&self) -> &[u32] {
        self.words
    }

    /// Record offset of each row (read through [`start_of`](Self::start_of)).
    #[cfg(test)]
    pub(super) fn at(&self) -> &[u32] {
        self.at
    }

    /// Report the blocks' checks to `integrity` (the database's record, so
    /// that a corrupt block fails the batch as the database's own would).
    pub fn report_to(&mut self, integrity: &Arc<Integrity>) {
        self.blocks.share(integrity.clone());
    }

    /// Check every block not checked yet, returning the first corrupt one
    /// (recorded, as a read would): a pass over the whole file, after
    /// which every read costs one load — for diagnostics and benchmarks;
    /// the sampler checks blocks as it reads them.
    ///
    /// # Errors
    /// The first corrupt block, naming the file and the block.
    pub fn check_all(&self) -> Result<()> {
        match &self.backing {
            Backing::Mapped { map, path } => self.blocks.check_all(map, path),
            Backing::Owned { .. } => Ok(()),
        }
    }

    /// Bytes of the mapped graph file (0 when built in memory).
    pub fn mapped_bytes(&self) -> u64 {
        match &self.backing {
            Backing::Mapped { map, .. } => map.len() as u64,
            Backing::Owned { .. } => 0,
        }
    }

    /// Turn read-ahead off on a mapped graph (`MADV_RANDOM`): walks read
    /// it at random, so on a database over its memory budget a fault must
    /// read the page it needs, not the window around it (as the database's
    /// own files, `crate::format::Database::advise_random`).
    pub fn advise_random(&self) {
        #[cfg(unix)]
        if let Backing::Mapped { map, .. } = &self.backing {
            let _ = map.advise(memmap2::Advice::Random);
        }
    }

    /// Check up to `n` blocks that no read has checked yet (a corrupt one
    /// recorded as a read would): called once per batch, so that after
    /// `blocks / n` batches every check is one load, while the open and a
    /// cold read stay bounded (the walks alone would leave unchecked the
    /// blocks they never read, e.g. row offsets of rows never a seed).
    pub fn check_ahead(&self, n: usize) {
        if let Backing::Mapped { map, path } = &self.backing {
            self.blocks.check_ahead(map, path, n);
        }
    }

    /// The record offset of row `seed`, once the block holding its entry
    /// is checked; `None` for a row out of range or a corrupt block (the
    /// failure is recorded: the batch fails).
    #[inline(always)]
    pub(super) fn start_of(&self, seed: u32) -> Option<usize> {
        let i = seed as usize;
        if i >= self.at.len() {
            return None;
        }
        let off = self.at_at + 4 * i;
        let ok = self.blocks.all_marked()
            || self.blocks.in_one_checked_block(off, 4)
            || self.first_read(off, 4);
        ok.then(|| self.at[i] as usize)
    }

    /// Whether the record at `o` (an offset read from a checked block) may
    /// be read: every block holding it checked and intact, and it lies
    /// inside the records. One relaxed load once the whole file is checked
    /// (or in memory); else one bit test for a record inside one checked
    /// block (a load per 64 blocks for a hub's long record); the blocks
    /// hashed at the first read. `false` ends the walk there; the failure
    /// is recorded in the integrity record (which fails the batch).
    #[inline(always)]
    pub(super) fn record_ok(&self, o: usize) -> bool {
        self.blocks.all_marked() || self.record_checked(o) || self.check_record(o)
    }

    /// Whether the record at `o` lies in the records and in blocks already
    /// checked. Its lengths are read before the test, but only to say
    /// which words it covers: a record is at least its head, so when every
    /// block of those words is checked, so was the head, and the lengths
    /// are the ones written (else the test fails and nothing is used).
    #[inline(always)]
    fn record_checked(&self, o: usize) -> bool {
        let Some(h) = self.words.get(o..o + HEAD) else {
            return false;
        };
        let end = o + HEAD + h[1] as usize + 2 * h[2] as usize;
        let (first, last) = (o >> self.word_shift, (end - 1) >> self.word_shift);
        let b = self.word_block + first;
        // Most records lie in one block: one bit test.
        end <= self.words.len()
            && if first == last {
                self.blocks.is_verified(b)
            } else {
                self.blocks.blocks_range_checked(b, self.word_block + last)
            }
    }

    /// [`record_ok`](Self::record_ok) past its fast path: check the blocks
    /// of the record's head, then (its lengths now trusted) of the rest.
    #[cold]
    #[inline(never)]
    fn check_record(&self, o: usize) -> bool {
        let off = |i: usize| self.words_at + 4 * i;
        if o.checked_add(HEAD).is_none_or(|end| end > self.words.len()) {
            return self.out_of_range(o);
        }
        if !self.first_read(off(o), 4 * HEAD) {
            return false;
        }
        let len = HEAD + self.words[o + 1] as usize + 2 * self.words[o + 2] as usize;
        if o + len > self.words.len() {
            return self.out_of_range(o);
        }
        self.first_read(off(o + HEAD), 4 * (len - HEAD))
    }

    /// Check the blocks of file bytes `off..off + len` (recording a
    /// failure); `true` when they are intact.
    #[cold]
    #[inline(never)]
    fn first_read(&self, off: usize, len: usize) -> bool {
        match &self.backing {
            Backing::Mapped { map, path } => self.blocks.check(map, path, off, len).is_ok(),
            Backing::Owned { .. } => true,
        }
    }

    /// A record at `o` that does not fit the records, in checked blocks (a
    /// file written wrong): recorded like a corrupt block; `false`.
    #[cold]
    #[inline(never)]
    fn out_of_range(&self, o: usize) -> bool {
        let path = match &self.backing {
            Backing::Mapped { path, .. } => path.clone(),
            Backing::Owned { .. } => PathBuf::from("walk graph (in memory)"),
        };
        let what = format!(
            "corrupt data: the record at word {o} does not fit the {} words of records; \
             no batch read from it is delivered ({})",
            self.words.len(),
            file::REBUILD
        );
        self.blocks.integrity().poison(&path, what);
        false
    }

    /// Bytes of its arrays (in this process's memory, or mapped).
    pub fn heap_bytes(&self) -> usize {
        (self.words.len() + self.at.len()) * 4 + self.times.len() * 8
    }

    /// Whether it is a mapped file (shared by the processes of the host).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped { .. })
    }

    /// The time rank below which a child is visible at `cutoff`.
    pub(super) fn visible_rank(&self, cutoff: i64) -> u32 {
        self.times.partition_point(|&t| t <= cutoff) as u32
    }

    /// The slot of neighbour `k` of the record at `o` (accepted by
    /// [`record_ok`](Self::record_ok); parents first).
    #[inline]
    pub(super) fn slot(&self, o: usize, k: u32) -> usize {
        let np = self.words[o + 1];
        o + HEAD + if k < np { k } else { 2 * k - np } as usize
    }

    /// Children of the record at `o` (accepted by
    /// [`record_ok`](Self::record_ok)) with a rank below `crank` (a prefix).
    pub(super) fn visible_children(&self, o: usize, crank: u32) -> u32 {
        let (np, nc) = (self.words[o + 1], self.words[o + 2] as usize);
        let first = o + HEAD + np as usize + 1;
        let (mut lo, mut hi) = (0usize, nc);
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            if self.words[first + 2 * mid] < crank {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo as u32
    }
}

/// Records with at least this many children keep their visible count in a
/// [`HubCache`] (a search over fewer ranks reads the record's first lines
/// anyway).
const CACHED_DEGREE: u32 = 8;

/// Slots of a [`HubCache`] (direct-mapped by record offset).
const CACHE_SLOTS: usize = 1 << 16;

/// The visible children of hubs at a cutoff, per worker:
/// `(record offset + 1, visible rank, visible children)` by record offset,
/// the rank in the tag so that nothing is cleared when the next context's
/// cutoff differs (clearing cost more than a short context's walks).
#[derive(Debug, Default)]
pub struct HubCache(Vec<(u32, u32, u32)>);

impl HubCache {
    /// The children of the record at `o` of `wg` (accepted by
    /// [`WalkGraph::record_ok`]) visible below `crank` (a hub's from the
    /// cache after its first search).
    pub fn visible(&mut self, wg: &WalkGraph, o: usize, crank: u32) -> u32 {
        if wg.words[o + 2] < CACHED_DEGREE {
            return wg.visible_children(o, crank);
        }
        if self.0.len() != CACHE_SLOTS {
            self.0 = vec![(0, 0, 0); CACHE_SLOTS];
        }
        let tag = o as u32 + 1;
        let slot = &mut self.0[(mix64(u64::from(tag)) as usize) & (CACHE_SLOTS - 1)];
        if slot.0 != tag || slot.1 != crank {
            *slot = (tag, crank, wg.visible_children(o, crank));
        }
        slot.2
    }
}

/// Ask for transparent huge pages over the whole 2 MiB pages of `v`'s
/// buffer, before it is written (a hint: where the kernel's huge pages are
/// `madvise` or `always`, the faults then map 2 MiB pages, so random steps
/// over a graph of tens of MiB stop missing the TLB on nearly every read).
fn advise_huge_pages<T>(v: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let end = start + v.capacity() * std::mem::size_of::<T>();
        let (a, b) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if b > a {
            // SAFETY: the range lies inside `v`'s allocation; MADV_HUGEPAGE
            // changes no contents, only how later faults are served.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

fn too_big(words: u64) -> Error {
    Error::Resource(format!(
        "the walk graph of `examples` needs {words} words of records, more than u32 offsets address"
    ))
}
