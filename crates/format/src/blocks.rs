//! Verified reads: the per-block checksums of a format-2 file, the bit per
//! block that says "checked", and the database-wide record of what the
//! checks found.
//!
//! Invariant: a view ([`super::GraphView`], [`super::ColumnView`], …) hands
//! the sampler a byte only after [`Blocks::touch`] has seen its block's bit
//! set — set by hashing the block the first time any thread reads it and
//! finding its stored checksum. A block that fails is never marked: every
//! reader of it hashes it again and records the failure in the database's
//! [`Integrity`], which the batch builder checks (one acquire load) before
//! it hands a batch on, on the thread that built it (after the join of its
//! parallel parts). So no batch built from an unchecked or corrupt byte is
//! delivered, and the check costs one relaxed load per read once a block is
//! known good. Format-1 files have no block checksums: their first read of a
//! block is counted in [`Integrity::unverified_reads`] (unless the database
//! was opened with `verify="full"`, which marks every block checked).
//! The walk graph and the stored rankings the sampler derives from a
//! database (`walks/`, `rankings/`) check their blocks the same way, into
//! the same record.

// The per-read checks are forced inline: out of line, a call per cell
// cost a measured ~10% of the sampler's CPU.
#![allow(clippy::inline_always)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use headwater_common::error::{Error, Result};

/// Log2 of the block size the writer uses for files read whole or in long
/// runs: tasks (256 KiB).
pub const BLOCK_SHIFT: u32 = 18;
/// Log2 of the block size the writer uses for files read at random — the
/// graph, tables and embeddings (4 KiB, one page): the first read of a
/// block hashes the one page it faults in, so a cold random read costs one
/// page, not the 256 KiB around it (64 pages of I/O where the database
/// does not fit in memory).
pub const RANDOM_BLOCK_SHIFT: u32 = 12;
/// Smallest and largest block shift a reader accepts (4 KiB ..= 1 GiB).
pub const BLOCK_SHIFTS: std::ops::RangeInclusive<u32> = 12..=30;

/// What the reads of one database found: the first corrupt block (sticky)
/// and how many blocks were checked or served unchecked.
#[derive(Debug, Default)]
pub struct Integrity {
    poisoned: AtomicBool,
    first: Mutex<Option<(PathBuf, String)>>,
    verified: AtomicU64,
    unverified: AtomicU64,
}

impl Integrity {
    /// Record a corrupt block (the first one is kept).
    pub fn poison(&self, file: &Path, what: String) {
        let mut first = self
            .first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if first.is_none() {
            *first = Some((file.to_path_buf(), what));
        }
        self.poisoned.store(true, Ordering::Release);
    }

    /// `Ok` unless a read found a corrupt block; then the [`Error::Format`]
    /// naming its file and block (every later call too).
    ///
    /// # Errors
    /// The first corrupt block any read of this database found.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if !self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        let first = self
            .first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (file, what) = first.clone().unwrap_or_default();
        Err(Error::format(file, what))
    }

    /// Blocks hashed on their first read and found intact.
    pub fn blocks_verified(&self) -> u64 {
        self.verified.load(Ordering::Relaxed)
    }

    /// Blocks first read without a checksum to check them against (format-1
    /// files opened without `verify="full"`); 0 means every byte the
    /// sampler read was checked.
    pub fn unverified_reads(&self) -> u64 {
        self.unverified.load(Ordering::Relaxed)
    }
}

/// The blocks of one mapped file: bytes `start..end` (the data sections and
/// their padding) cut into `1 << shift`-byte blocks, the last one short.
#[derive(Debug)]
pub struct Blocks {
    start: usize,
    end: usize,
    shift: u32,
    /// File offset of the stored xxh3-64s (one `u64` per block, read in
    /// place from the map: shared by every process, no private copy);
    /// `None` for a format-1 file.
    sums: Option<usize>,
    bits: Box<[AtomicU64]>,
    /// Blocks marked so far, and whether that is all of them (then a read
    /// costs one load of this flag).
    marked: AtomicUsize,
    all: AtomicBool,
    integrity: Arc<Integrity>,
    /// What to do about a corrupt block, in its error.
    remedy: &'static str,
    /// The next block [`check_ahead`](Self::check_ahead) looks at.
    ahead: AtomicUsize,
}

impl Blocks {
    /// Blocks over `start..end` whose checksums start at file offset
    /// `sums` (`None`: unchecked, format 1).
    pub fn new(
        start: usize,
        end: usize,
        shift: u32,
        sums: Option<usize>,
        integrity: Arc<Integrity>,
    ) -> Self {
        let n = count(start, end, shift);
        Blocks {
            start,
            end,
            shift,
            sums,
            bits: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            marked: AtomicUsize::new(0),
            all: AtomicBool::new(n == 0),
            integrity,
            remedy: "run `headwater verify` on the database",
            ahead: AtomicUsize::new(0),
        }
    }

    /// Say `remedy` in the error of a corrupt block (a file derived from
    /// the database is rebuilt, not verified).
    #[must_use]
    pub fn with_remedy(mut self, remedy: &'static str) -> Self {
        self.remedy = remedy;
        self
    }

    /// The database's record these blocks report to.
    pub fn integrity(&self) -> &Arc<Integrity> {
        &self.integrity
    }

    /// Report to `integrity` from now on (a file opened as part of a
    /// database shares the database's record).
    pub fn share(&mut self, integrity: Arc<Integrity>) {
        self.integrity = integrity;
    }

    /// Blocks in the file.
    pub fn len(&self) -> usize {
        count(self.start, self.end, self.shift)
    }

    /// Whether the file has no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every block has been checked (or, format 1, served): then
    /// reads need no check at all (the bits only ever get set).
    #[inline]
    pub fn all_marked(&self) -> bool {
        self.all.load(Ordering::Relaxed)
    }

    /// Whether block `b` has been checked (or, format 1, served).
    #[inline(always)]
    pub fn is_verified(&self, b: usize) -> bool {
        self.bits
            .get(b >> 6)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (b & 63)) != 0)
    }

    /// Mark block `b`; `true` when this call set the bit.
    fn mark(&self, b: usize) -> bool {
        let bit = 1u64 << (b & 63);
        let newly = self.bits[b >> 6].fetch_or(bit, Ordering::Relaxed) & bit == 0;
        if newly && self.marked.fetch_add(1, Ordering::Relaxed) + 1 == self.len() {
            self.all.store(true, Ordering::Relaxed);
        }
        newly
    }

    /// Mark every block checked (after the whole payload checksum matched).
    pub fn mark_all(&self) {
        for b in 0..self.len() {
            self.mark(b);
        }
    }

    /// The first and last block holding a byte of `off..off + len` (file
    /// offsets), if any.
    #[inline]
    fn span(&self, off: usize, len: usize) -> Option<(usize, usize)> {
        if len == 0 || off < self.start || off >= self.end {
            return None;
        }
        let first = (off - self.start) >> self.shift;
        let last = (off.saturating_add(len).min(self.end) - 1 - self.start) >> self.shift;
        Some((first, last))
    }

    /// Check every block holding a byte of `off..off + len` before it is
    /// read: one relaxed load once the file (or the block) is checked. A
    /// failure is recorded in the database's [`Integrity`] (the batch
    /// builder reports it).
    #[inline(always)]
    pub fn touch(&self, map: &[u8], file: &Path, off: usize, len: usize) {
        if self.all.load(Ordering::Relaxed) {
            return;
        }
        // The common case: a short range inside one checked block.
        if self.in_one_checked_block(off, len) {
            return;
        }
        self.touch_range(map, file, off, len);
    }

    /// Whether bytes `off..off + len` (`len` > 0) lie in one block, and it
    /// has been checked: two shifts and one relaxed load.
    #[inline(always)]
    pub fn in_one_checked_block(&self, off: usize, len: usize) -> bool {
        let first = off.wrapping_sub(self.start) >> self.shift;
        let last = off.wrapping_add(len).wrapping_sub(self.start + 1) >> self.shift;
        first == last && self.is_verified(first)
    }

    /// Whether blocks `first..=last` have all been checked: one load of a
    /// word of bits when they share one (a long record of up to 64 blocks
    /// costs one load, not one per block), else one per 64 blocks, out of
    /// line. `false` for blocks past the file.
    #[inline(always)]
    pub fn blocks_range_checked(&self, first: usize, last: usize) -> bool {
        if first >> 6 != last >> 6 {
            return self.blocks_checked(first, last);
        }
        let mask = (u64::MAX >> (63 - (last & 63))) & (u64::MAX << (first & 63));
        first <= last
            && self
                .bits
                .get(first >> 6)
                .is_some_and(|w| w.load(Ordering::Relaxed) & mask == mask)
    }

    /// Whether blocks `first..=last` have all been checked, a word of bits
    /// at a time.
    #[inline(never)]
    fn blocks_checked(&self, first: usize, last: usize) -> bool {
        if first > last {
            return false;
        }
        (first >> 6..=last >> 6).all(|i| {
            let lo = if i == first >> 6 { first & 63 } else { 0 };
            let hi = if i == last >> 6 { last & 63 } else { 63 };
            let mask = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            self.bits
                .get(i)
                .is_some_and(|w| w.load(Ordering::Relaxed) & mask == mask)
        })
    }

    /// [`touch`](Self::touch) past its fast path: every block of the range.
    #[cold]
    #[inline(never)]
    fn touch_range(&self, map: &[u8], file: &Path, off: usize, len: usize) {
        if let Some((first, last)) = self.span(off, len) {
            for b in first..=last {
                if !self.is_verified(b) {
                    self.first_read(map, file, b);
                }
            }
        }
    }

    /// [`touch`](Self::touch) for the one block holding file offset `off`
    /// (an element of at most 64 aligned bytes never spans two blocks): the
    /// per-cell fast path.
    #[inline(always)]
    pub fn touch_one(&self, map: &[u8], file: &Path, off: usize) {
        if self.all.load(Ordering::Relaxed) {
            return;
        }
        let b = off.wrapping_sub(self.start) >> self.shift;
        if !self.is_verified(b) {
            self.touch_range(map, file, off, 1);
        }
    }

    /// [`touch`](Self::touch), returning the first failing block's error
    /// (for what is handed out whole: a task, an embedding matrix).
    pub fn check(&self, map: &[u8], file: &Path, off: usize, len: usize) -> Result<()> {
        if let Some((first, last)) = self.span(off, len) {
            for b in first..=last {
                if !self.is_verified(b) {
                    if let Some(what) = self.first_read(map, file, b) {
                        return Err(Error::format(file, what));
                    }
                }
            }
        }
        Ok(())
    }

    /// Check up to `n` of the blocks no read has checked yet, in file
    /// order from where the last call stopped (a corrupt one is recorded
    /// as a read would record it): a bounded step towards
    /// [`all_marked`](Self::all_marked), after which a read costs one load.
    pub fn check_ahead(&self, map: &[u8], file: &Path, n: usize) {
        let mut hashed = 0;
        while hashed < n && !self.all_marked() {
            let b = self.ahead.fetch_add(1, Ordering::Relaxed);
            if b >= self.len() {
                return;
            }
            if !self.is_verified(b) {
                self.first_read(map, file, b);
                hashed += 1;
            }
        }
    }

    /// [`check`](Self::check) every block: a whole pass over the file.
    pub fn check_all(&self, map: &[u8], file: &Path) -> Result<()> {
        self.check(map, file, self.start, self.end - self.start)
    }

    /// The first read of block `b`: hash and compare it (format 2) or count
    /// it unchecked (format 1). Returns the failure, also recorded.
    #[cold]
    #[inline(never)]
    fn first_read(&self, map: &[u8], file: &Path, b: usize) -> Option<String> {
        let Some(sums) = self.sums else {
            if self.mark(b) {
                self.integrity.unverified.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        };
        let lo = self.start + (b << self.shift);
        let hi = (lo + (1 << self.shift)).min(self.end);
        let computed = xxhash_rust::xxh3::xxh3_64(&map[lo..hi]);
        let at = sums + 8 * b;
        let stored = u64::from_le_bytes(map[at..at + 8].try_into().expect("8 bytes"));
        if computed == stored {
            if self.mark(b) {
                self.integrity.verified.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        let what = format!(
            "corrupt data: block {b} of {} (bytes {lo}..{hi}) fails its checksum \
             (stored {stored:016x}, computed {computed:016x}); no batch read from it \
             is delivered ({})",
            self.len(),
            self.remedy
        );
        self.integrity.poison(file, what.clone());
        Some(what)
    }
}

/// Blocks of `1 << shift` bytes covering `start..end`.
pub fn count(start: usize, end: usize, shift: u32) -> usize {
    (end.saturating_sub(start)).div_ceil(1 << shift)
}

/// The [`Blocks`] of a mapped file `b` of format `version` whose section
/// table (header-checked) is `sections`. Format 2: the last section is the
/// block table — `shift: u64`, then one xxh3-64 per block of the bytes from
/// `payload_start` to the table — whose own xxh3-64 is header field 40; it
/// is removed from `sections`. O(blocks): 8 bytes hashed per block.
pub fn read_block_table(
    path: &Path,
    b: &[u8],
    version: u32,
    sections: &mut Vec<(usize, usize)>,
    payload_start: usize,
) -> Result<Blocks> {
    let integrity = Arc::new(Integrity::default());
    if version < 2 {
        return Ok(Blocks::new(
            payload_start,
            b.len(),
            BLOCK_SHIFT,
            None,
            integrity,
        ));
    }
    let bad = |what: String| Err(Error::format(path, format!("corrupt block table: {what}")));
    let Some((off, len)) = sections.pop() else {
        return bad("the file has no sections, so no block table".into());
    };
    if off + len != b.len() {
        return bad(format!(
            "ends at byte {}, the file at {}",
            off + len,
            b.len()
        ));
    }
    if let Some(i) = sections.iter().position(|&(o, l)| o + l > off) {
        return bad(format!(
            "data section {i} ends past the table at byte {off}, outside the checked blocks"
        ));
    }
    let table = &b[off..off + len];
    let stored = u64::from_le_bytes(b[40..48].try_into().expect("8 bytes"));
    let computed = xxhash_rust::xxh3::xxh3_64(table);
    if computed != stored {
        return bad(format!(
            "checksum mismatch (stored {stored:016x}, computed {computed:016x})"
        ));
    }
    if len < 8 || len % 8 != 0 {
        return bad(format!("{len} bytes is not a shift and whole checksums"));
    }
    let word0 = u64::from_le_bytes(table[..8].try_into().expect("8 bytes"));
    let shift = u32::try_from(word0).unwrap_or(u32::MAX);
    if !BLOCK_SHIFTS.contains(&shift) {
        return bad(format!(
            "block size 2^{word0} is outside 2^{}..=2^{}",
            BLOCK_SHIFTS.start(),
            BLOCK_SHIFTS.end()
        ));
    }
    let want = count(payload_start, off, shift);
    if len / 8 - 1 != want {
        return bad(format!(
            "{} checksums for {want} blocks of {} bytes",
            len / 8 - 1,
            1u64 << shift
        ));
    }
    Ok(Blocks::new(
        payload_start,
        off,
        shift,
        Some(off + 8),
        integrity,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_checked_when_every_block_of_it_is() {
        // 200 blocks of 4 KiB from byte 4096; format 1: a read marks.
        let (start, k) = (4096, 4096);
        let b = Blocks::new(start, start + 200 * k - 100, 12, None, Arc::default());
        b.touch(&[], Path::new("x"), start + 3 * k, 128 * k);
        let checked = |first, last| b.blocks_range_checked(first, last);
        assert!(checked(3, 130) && checked(7, 7), "blocks 3..=130");
        assert!(checked(63, 64), "across a word of bits");
        assert!(!checked(2, 10) && !checked(130, 131) && !checked(2, 301));
        assert!(!checked(usize::MAX - 1, usize::MAX) && !checked(250, 250));
        b.touch(&[], Path::new("x"), start, 200 * k);
        assert!(b.all_marked() && checked(0, 199) && !checked(0, 200));
    }
}
