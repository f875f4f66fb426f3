//! The binary file header: constants, validation, and the mapped-file view.
//!
//! Invariant: a [`MappedFile`] that exists has passed every check that costs
//! O(header) (magic, version, length, section bounds and alignment, header
//! checksum). The payload checksum is *not* recomputed at open (that would
//! read the whole database); [`MappedFile::verify_payload`] does it on
//! request (`headwater verify`, `verify="full"`). Section accessors are
//! bounds-checked slices, never a panic on user data.

// The per-read checks are forced inline: out of line, a call per cell
// cost a measured ~10% of the sampler's CPU.
#![allow(clippy::inline_always)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use xxhash_rust::xxh3::Xxh3;

use super::blocks::{read_block_table, Blocks, Integrity};
use headwater_common::error::{Error, Result};

/// The format version this build writes (2: per-block checksums).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const MIN_READ_VERSION: u32 = 1;

pub(crate) const FIXED_HEADER: usize = 48;
pub(crate) const SECTION_ENTRY: usize = 16;
/// Every section starts at a multiple of this.
pub const ALIGN: usize = 64;

/// What a binary file holds; decides its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `graph.bin`: row tables, times and the CSR in both directions.
    Graph,
    /// `tables/<t>.bin`: the stored columns of one table.
    Table,
    /// `tasks/<k>.bin`: one task's anchors, observation times and targets.
    Task,
    /// `*_embeddings.bin`: f16 embedding matrices.
    Embeddings,
}

impl FileKind {
    /// The 8 magic bytes that open a file of this kind.
    pub fn magic(self) -> &'static [u8; 8] {
        match self {
            FileKind::Graph => b"HWGRAPH\0",
            FileKind::Table => b"HWTABLE\0",
            FileKind::Task => b"HWTASK\0\0",
            FileKind::Embeddings => b"HWEMBED\0",
        }
    }

    fn from_magic(m: &[u8]) -> Option<Self> {
        [
            FileKind::Graph,
            FileKind::Table,
            FileKind::Task,
            FileKind::Embeddings,
        ]
        .into_iter()
        .find(|k| k.magic() == m)
    }
}

/// A validated, read-only memory map of one headwater binary file.
pub struct MappedFile {
    path: PathBuf,
    mmap: Mmap,
    sections: Vec<(usize, usize)>,
    version: u32,
    payload_checksum: u64,
    payload_start: usize,
    blocks: Blocks,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The magic of the mapped bytes `b` (at least [`FIXED_HEADER`] long) is
/// `kind`'s.
fn check_magic(path: &Path, b: &[u8], kind: FileKind) -> Result<()> {
    let magic = &b[0..8];
    match FileKind::from_magic(magic) {
        Some(k) if k == kind => Ok(()),
        Some(k) => Err(Error::format(
            path,
            format!(
                "is a {k:?} file, expected a {kind:?} file (magic {:?})",
                String::from_utf8_lossy(kind.magic())
            ),
        )),
        None => Err(Error::format(
            path,
            format!(
                "not a headwater file: bad magic {:02x?} (expected {:?})",
                magic,
                String::from_utf8_lossy(kind.magic())
            ),
        )),
    }
}

/// The section count and payload start of the mapped bytes `b`, after
/// checking that the section table fits, the header checksum and the
/// declared length.
fn check_header(path: &Path, b: &[u8]) -> Result<(usize, usize)> {
    let len = b.len();
    let bad = |what: String| Error::format(path, what);
    let n = le_u32(b, 12) as usize;
    let table_end = FIXED_HEADER
        .checked_add(
            n.checked_mul(SECTION_ENTRY)
                .ok_or_else(|| bad("section count overflows".into()))?,
        )
        .ok_or_else(|| bad("section count overflows".into()))?;
    if table_end > len {
        return Err(bad(format!(
            "truncated: section table of {n} entries ends at byte {table_end}, file has {len} bytes"
        )));
    }
    let payload_start = align_up(table_end, ALIGN);
    if payload_start > len {
        return Err(bad(format!(
            "truncated: payload would start at byte {payload_start}, file has {len} bytes"
        )));
    }
    let mut h = Xxh3::new();
    h.update(&b[0..32]);
    h.update(&b[40..payload_start]);
    if h.digest() != le_u64(b, 32) {
        return Err(bad("corrupt header: header checksum mismatch".into()));
    }
    let declared_len = le_u64(b, 16) as usize;
    if declared_len != len {
        return Err(bad(format!(
            "truncated or extended: header says {declared_len} bytes, file has {len} bytes"
        )));
    }
    Ok((n, payload_start))
}

/// The `n` entries of the section table of `b`, each checked to be aligned
/// and inside the payload.
fn section_table(
    path: &Path,
    b: &[u8],
    n: usize,
    payload_start: usize,
) -> Result<Vec<(usize, usize)>> {
    let len = b.len();
    let bad = |what: String| Error::format(path, what);
    let mut sections = Vec::with_capacity(n);
    for i in 0..n {
        let off = le_u64(b, FIXED_HEADER + i * SECTION_ENTRY) as usize;
        let slen = le_u64(b, FIXED_HEADER + i * SECTION_ENTRY + 8) as usize;
        let end = off.checked_add(slen);
        if off % ALIGN != 0 || off < payload_start || end.is_none_or(|e| e > len) {
            return Err(bad(format!(
                "corrupt section table: section {i} at offset {off} length {slen} is outside the payload (file has {len} bytes)"
            )));
        }
        sections.push((off, slen));
    }
    Ok(sections)
}

impl MappedFile {
    /// Map `path` and validate it as a `kind` file with `expected_sections`
    /// sections (`None` = any count).
    pub fn open(path: &Path, kind: FileKind, expected_sections: Option<usize>) -> Result<Self> {
        Self::open_advised(path, kind, expected_sections, false)
    }

    /// [`MappedFile::open`]; with `huge_pages`, the map is advised huge pages
    /// (see [`super::PageCache`]) before its header is read, so that no page
    /// of the file enters the page cache as a small folio through this map.
    pub fn open_advised(
        path: &Path,
        kind: FileKind,
        expected_sections: Option<usize>,
        huge_pages: bool,
    ) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
        let bad = |what: String| Error::format(path, what);
        if len < FIXED_HEADER {
            return Err(bad(format!(
                "truncated: {len} bytes, shorter than the {FIXED_HEADER}-byte header"
            )));
        }
        // SAFETY: the map is read-only and the database directory is documented
        // as immutable while in use; every byte we interpret is validated below.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        if huge_pages {
            super::page_cache::advise_huge_pages(&mmap);
        } else {
            super::page_cache::advise_opening(&mmap);
        }
        let b = &mmap[..];
        check_magic(path, b, kind)?;
        let version = le_u32(b, 8);
        if !(MIN_READ_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(Error::Version {
                file: path.to_path_buf(),
                found: version,
                min: MIN_READ_VERSION,
                max: FORMAT_VERSION,
            });
        }
        let (n, payload_start) = check_header(path, b)?;
        // Format 2 adds the block table as a last section.
        let data_sections = n.saturating_sub(usize::from(version >= 2));
        if let Some(want) = expected_sections {
            if want != data_sections {
                return Err(bad(format!(
                    "has {data_sections} sections, expected {want}"
                )));
            }
        }
        let mut sections = section_table(path, b, n, payload_start)?;
        if let Some(&(off, len)) = sections.last().filter(|_| !huge_pages && version >= 2) {
            super::page_cache::advise_range(&mmap, off, len);
        }
        let blocks = read_block_table(path, b, version, &mut sections, payload_start);
        if !huge_pages {
            super::page_cache::advise_opened(&mmap);
        }
        let blocks = blocks?;
        let payload_checksum = le_u64(b, 24);
        Ok(MappedFile {
            path: path.to_path_buf(),
            mmap,
            sections,
            version,
            payload_checksum,
            payload_start,
            blocks,
        })
    }

    /// Check the blocks holding bytes `off..off + len` of the file before
    /// they are read (see [`super::blocks`]): one relaxed load per block
    /// once it is known good.
    #[inline(always)]
    pub(crate) fn touch(&self, off: usize, len: usize) {
        self.blocks.touch(&self.mmap, &self.path, off, len);
    }

    /// Check the block holding `r`, an element (at most 8 bytes, aligned)
    /// of a section of this file: the per-element fast path.
    #[inline(always)]
    pub(crate) fn touch_ref<T>(&self, r: &T) {
        let off = (std::ptr::from_ref(r) as usize).wrapping_sub(self.mmap.as_ptr() as usize);
        self.blocks.touch_one(&self.mmap, &self.path, off);
    }

    /// Check the blocks holding `s`, a slice of a section of this file.
    #[inline(always)]
    pub(crate) fn touch_slice<T>(&self, s: &[T]) {
        let off = (s.as_ptr() as usize).wrapping_sub(self.mmap.as_ptr() as usize);
        self.touch(off, std::mem::size_of_val(s));
    }

    /// Check the block holding file offset `off` (an aligned element of at
    /// most 8 bytes).
    #[inline(always)]
    pub(crate) fn touch_at(&self, off: usize) {
        self.blocks.touch_one(&self.mmap, &self.path, off);
    }

    /// Whether every block of the file has been checked: a view made now
    /// need not check its reads (views are made per batch, so a file's
    /// reads stop costing anything once all of it has been read).
    #[inline]
    pub(crate) fn all_verified(&self) -> bool {
        self.blocks.all_marked()
    }

    /// The file offset of section `i`'s first byte.
    pub(crate) fn section_offset(&self, i: usize) -> Option<usize> {
        self.sections.get(i).map(|s| s.0)
    }

    /// Check the blocks of elements `first..first + count` (of `size`
    /// bytes) of section `i`, returning the first failing block's error.
    ///
    /// # Errors
    /// A corrupt block, naming the file and block.
    pub(crate) fn check_elems(
        &self,
        i: usize,
        first: usize,
        count: usize,
        size: usize,
    ) -> Result<()> {
        match (self.sections.get(i), first.checked_mul(size)) {
            (Some(&(off, _)), Some(at)) => self.blocks.check(
                &self.mmap,
                &self.path,
                off.saturating_add(at),
                count.saturating_mul(size),
            ),
            _ => Ok(()),
        }
    }

    /// Check every block of section `i` (a section handed out whole).
    ///
    /// # Errors
    /// The first corrupt block of the section, naming the file and block.
    pub(crate) fn check_section(&self, i: usize) -> Result<()> {
        match self.sections.get(i) {
            Some(&(off, len)) => self.blocks.check(&self.mmap, &self.path, off, len),
            None => Ok(()),
        }
    }

    /// Mark every block checked (the whole payload checksum matched).
    pub(crate) fn mark_verified(&self) {
        self.blocks.mark_all();
    }

    /// Report block checks to `integrity` (the database's shared record).
    pub(crate) fn share_integrity(&mut self, integrity: Arc<Integrity>) {
        self.blocks.share(integrity);
    }

    /// The record block checks of this file report to.
    pub fn integrity(&self) -> &Arc<Integrity> {
        self.blocks.integrity()
    }

    /// Blocks of the file and, per block, whether it has been checked (or,
    /// format 1, served unchecked) — for tests and diagnostics.
    pub fn verified_blocks(&self) -> Vec<bool> {
        (0..self.blocks.len())
            .map(|b| self.blocks.is_verified(b))
            .collect()
    }

    /// Recompute the payload checksum (reads every payload byte) in chunks,
    /// calling `progress` with the bytes hashed so far after each chunk.
    ///
    /// # Errors
    /// A [`Error::Format`] naming the file when the checksum does not match.
    pub fn verify_payload(&self, progress: &mut dyn FnMut(u64)) -> Result<()> {
        const CHUNK: usize = 16 << 20;
        let start = self.payload_start();
        let mut h = Xxh3::new();
        let mut done = 0u64;
        for chunk in self.mmap[start..].chunks(CHUNK) {
            h.update(chunk);
            done += chunk.len() as u64;
            self.release(start + done as usize - chunk.len(), chunk.len());
            progress(done);
        }
        let actual = h.digest();
        if actual == self.payload_checksum {
            Ok(())
        } else {
            Err(Error::format(
                &self.path,
                format!(
                    "corrupt data: payload checksum mismatch (stored {:016x}, computed {actual:016x})",
                    self.payload_checksum
                ),
            ))
        }
    }

    /// Drop the pages of `[offset, offset + len)` from this process's
    /// resident set once hashed, so verifying a file (at write time, by
    /// `headwater verify`, or at open with `verify="full"`) does not grow
    /// the RSS by the file's size; the page cache keeps them. Advice only:
    /// an error is ignored.
    fn release(&self, offset: usize, len: usize) {
        #[cfg(unix)]
        {
            const PAGE: usize = 4096;
            let from = offset.next_multiple_of(PAGE);
            let to = (offset + len) / PAGE * PAGE;
            if to > from {
                // SAFETY: the map is a read-only shared mapping of a file
                // (`Mmap::map`): dropped pages are read back from the file
                // on the next access with the same bytes, so no borrow of
                // the mapping can observe a change.
                let _ = unsafe {
                    self.mmap.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        from,
                        to - from,
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = (offset, len);
    }

    /// First payload byte: the first multiple of 64 after the section table.
    fn payload_start(&self) -> usize {
        self.payload_start
    }

    /// Payload bytes (what [`MappedFile::verify_payload`] reads).
    pub fn payload_bytes(&self) -> u64 {
        (self.mmap.len() - self.payload_start()) as u64
    }

    /// The whole mapping (header included), for page-cache advice.
    pub(super) fn map(&self) -> &Mmap {
        &self.mmap
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The format version in the header.
    pub fn version(&self) -> u32 {
        self.version
    }
    /// The xxh3 checksum of the payload, as stored.
    pub fn payload_checksum(&self) -> u64 {
        self.payload_checksum
    }
    /// File length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.mmap.len() as u64
    }
    /// Data sections (a format-2 file's block table is not counted).
    pub fn num_sections(&self) -> usize {
        self.sections.len()
    }

    /// Section `i` viewed as `[T]`, checking its length is a whole number of
    /// `T` and equals `expected_len` elements when given.
    pub fn section<T: bytemuck::Pod>(&self, i: usize, expected_len: Option<usize>) -> Result<&[T]> {
        let (off, len) = *self.sections.get(i).ok_or_else(|| {
            Error::format(
                &self.path,
                format!("missing section {i} (file has {})", self.sections.len()),
            )
        })?;
        let bytes = &self.mmap[off..off + len];
        let size = std::mem::size_of::<T>();
        if len % size != 0 {
            return Err(Error::format(
                &self.path,
                format!("section {i}: {len} bytes is not a multiple of the {size}-byte element"),
            ));
        }
        let view: &[T] = bytemuck::try_cast_slice(bytes).map_err(|e| {
            Error::format(
                &self.path,
                format!("section {i}: cannot view in place: {e}"),
            )
        })?;
        if let Some(want) = expected_len {
            if view.len() != want {
                return Err(Error::format(
                    &self.path,
                    format!("section {i}: {} elements, metadata says {want}", view.len()),
                ));
            }
        }
        Ok(view)
    }
}

/// Round `x` up to a multiple of `a` (a power of two).
pub fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}
