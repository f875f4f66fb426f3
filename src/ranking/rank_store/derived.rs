//! What every file a database directory derives (the stored rankings, the
//! walk graph) shares: its header and trailing hash ([`DerivedHeader`]),
//! the write through a temporary file renamed into place
//! ([`write_renamed`]), and the lock under which one process of a host
//! builds it while the others wait ([`BuildLock`]).
//!
//! Never: what such a file holds (its owner's business).

use std::path::Path;

use crate::error::{Error, Result};

/// An exclusive advisory lock (`flock`) on a file beside a store, held
/// until dropped: of the processes of a host that start together without
/// the store (the ranks of a job), one computes it while the others wait,
/// then read it back.
pub struct BuildLock {
    _file: std::fs::File,
}

impl BuildLock {
    /// Take the lock on `path` (created, with its directory, if missing);
    /// `on_wait` runs once, before blocking, when another process holds it.
    pub fn take(path: &Path, on_wait: impl FnOnce()) -> Result<BuildLock> {
        use std::os::fd::AsRawFd;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let fd = file.as_raw_fd();
        // SAFETY: `fd` is open for the life of `file`; the lock goes with it.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(BuildLock { _file: file });
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Error::io(path, e));
        }
        on_wait();
        loop {
            // SAFETY: as above.
            if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
                return Ok(BuildLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::io(path, e));
            }
        }
    }
}

/// What every file a database directory derives (stored rankings, the
/// walk graph) starts and ends with: an 8-byte magic, a `u32` version, 4
/// bytes of padding, the `u64` key of what it was built from at byte 16,
/// then its own header fields up to `len` bytes; and as its last 8 bytes
/// an xxh3-64 of everything before it ([`map`](Self::map)) or of the
/// prefix its header says ([`map_prefix`](Self::map_prefix): the walk
/// graph, whose data blocks are checked at their first read).
pub(crate) struct DerivedHeader {
    pub magic: &'static [u8; 8],
    pub version: u32,
    /// Bytes of the whole header.
    pub len: usize,
    /// What the file is, in errors ("ranking store").
    pub kind: &'static str,
    /// Why another key may be found, in errors ("another database").
    pub key_hint: &'static str,
}

impl DerivedHeader {
    /// Map `path`, refusing (naming what is wrong) a file that is not this
    /// kind, is damaged (its hash), another version, or written under
    /// another `key`, the trailing hash covering only the first
    /// `prefix(file)` bytes: `prefix` reads the (not yet checked) header of
    /// the file, at least `len` bytes and its hash, and answers `None`
    /// when the lengths it holds do not describe the file (damaged or cut
    /// short). The bytes past the prefix are left to the caller to check.
    pub fn map_prefix(
        &self,
        path: &Path,
        key: u64,
        prefix: impl FnOnce(&[u8]) -> Option<usize>,
    ) -> Result<memmap2::Mmap> {
        self.map_ends(path, key, |b| {
            let n = prefix(b)?;
            Some((n, b.len() - 8))
        })
    }

    /// [`map_prefix`](Self::map_prefix) with the hash over the first
    /// `head` bytes and the bytes from `tail` to the hash (`parts` reads
    /// the unchecked file, answers `(head, tail)`, `None` when the lengths
    /// it holds do not describe it): the bytes between are left to the
    /// caller to check block by block.
    pub fn map_ends(
        &self,
        path: &Path,
        key: u64,
        parts: impl FnOnce(&[u8]) -> Option<(usize, usize)>,
    ) -> Result<memmap2::Mmap> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: read-only; such files are written whole and renamed into
        // place, never written in place, and every byte read is checked
        // (below, or by the caller between the hashed parts).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        // No read-ahead around the pages open reads (a cold fault would
        // read megabytes of records with them); the default again below.
        crate::format::advise_opening(&map);
        let b: &[u8] = &map;
        let bad = |what: String| Error::format(path, what);
        if b.len() < self.len + 8 || &b[..8] != self.magic {
            return Err(bad(format!("not a headwater {} (magic)", self.kind)));
        }
        // Another version first (its layout is not this one's); hashed below.
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default());
        if version != self.version {
            return Err(bad(format!(
                "version {version}, this build reads {}",
                self.version
            )));
        }
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        let end = b.len() - 8;
        let Some((head, tail)) = parts(b).filter(|&(h, t)| self.len <= h && h <= t && t <= end)
        else {
            return Err(bad(format!(
                "the file is damaged or cut short: its header does not describe its {} bytes",
                b.len()
            )));
        };
        // The hashed parts and the last page, each asked for whole.
        crate::format::advise_range(&map, 0, head);
        crate::format::advise_range(&map, tail, b.len() - tail);
        let sum = word(end);
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&b[..head]);
        h.update(&b[tail..end]);
        if h.digest() != sum {
            return Err(bad(format!(
                "checksum mismatch (stored {sum:016x}): the file is damaged"
            )));
        }
        if word(16) != key {
            return Err(bad(format!(
                "written for key {:016x}, expected {key:016x} ({})",
                word(16),
                self.key_hint
            )));
        }
        crate::format::advise_opened(&map);
        Ok(map)
    }
}

/// Write `path` through `fill` into a temporary file beside it, synced and
/// renamed into place: a reader never sees half a file.
pub(crate) fn write_renamed(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        fill(&mut out)?;
        out.into_inner()
            .map_err(std::io::IntoInnerError::into_error)?
            .sync_all()
    })();
    written.map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// The xxh3-64 of each `1 << shift`-byte block of a stream of bytes (the
/// last block short), fed in pieces of any size: the block table of a
/// derived file (the walk graph's, the stored rankings').
pub(crate) struct BlockSums {
    shift: u32,
    hash: xxhash_rust::xxh3::Xxh3,
    fill: usize,
    sums: Vec<u64>,
}

impl BlockSums {
    pub(crate) fn new(shift: u32) -> Self {
        BlockSums {
            shift,
            hash: xxhash_rust::xxh3::Xxh3::new(),
            fill: 0,
            sums: Vec::new(),
        }
    }

    /// Feed the next bytes of the stream.
    pub(crate) fn update(&mut self, mut p: &[u8]) {
        let block = 1usize << self.shift;
        while !p.is_empty() {
            let take = p.len().min(block - self.fill);
            self.hash.update(&p[..take]);
            (self.fill, p) = (self.fill + take, &p[take..]);
            if self.fill == block {
                self.sums.push(self.hash.digest());
                self.hash.reset();
                self.fill = 0;
            }
        }
    }

    /// The sums, the last (short) block's included.
    pub(crate) fn finish(mut self) -> Vec<u64> {
        if self.fill > 0 {
            self.sums.push(self.hash.digest());
        }
        self.sums
    }
}
