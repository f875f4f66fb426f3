//! The `expected` ranker's rankings stored once per database
//! (`expected_store`, docs/contexts.md): the ranker is deterministic, so
//! its counts for a task item (seed row, time bound) can be computed at
//! preprocessing time and read back by every context of that item, with
//! the same picks as computing them.
//!
//! What an item stores: the head of the count order (most visits first)
//! and the head of the recency order (latest first, then visits), each
//! cut between two groups of equal keys, at most `cap` rows each, with
//! the floors that bound them. Every row of the item at or above a floor
//! is stored, so the ranked rows a context reads at or above the floor of
//! its order are exactly the live ranker's (ties within a group are
//! ordered by the sequence's key at run time, as live). An item whose
//! every eligible counted row is stored is complete. A context that reads
//! past the exact head, or reaches tier 2 with an incomplete item, is
//! built again with the live ranker (`crate::context::incontext`):
//! stored or not, the batch is the same.
//!
//! The file (`rankings/expected-{key}.bin` in the database directory; the
//! key hashes the database's content hash, the walk settings, the cap and
//! the items): magic, version, key, sizes, the arrays little-endian (as
//! every host the format runs on), and an xxh3-64 of everything before
//! it; mapped and read in place, so the ranks of a host share one copy. A file that fails any check is
//! refused naming it and what is wrong; the caller builds it again,
//! under a `BuildLock` beside it, so the processes of a host build it once.
//!
//! Never: a stored row whose count differs from the live ranker's, or a
//! context built from a head that the floors do not vouch for.

use std::cmp::Reverse;
use std::io::Write;
use std::path::Path;

use rayon::prelude::*;

use super::expected::Spread;
use super::walks::{WalkCounts, WalkGraph, WalkParams};
use crate::error::{Error, Result};
use crate::format::GraphView;

const MAGIC: &[u8; 8] = b"HWRANKS\0";
const VERSION: u32 = 1;

/// Items computed per parallel job (each job allocates its scratch).
const CHUNK: usize = 512;

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
    /// another `key`. The whole file is read once to check its hash.
    pub fn map(&self, path: &Path, key: u64) -> Result<memmap2::Mmap> {
        self.map_prefix(path, key, |b| Some(b.len() - 8))
    }

    /// [`map`](Self::map), the trailing hash covering only the first
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
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: read-only; such files are written whole and renamed into
        // place, never written in place, and every byte read is checked
        // (below, or by the caller past the prefix).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let b: &[u8] = &map;
        let bad = |what: String| Error::format(path, what);
        if b.len() < self.len + 8 || &b[..8] != self.magic {
            return Err(bad(format!("not a headwater {} (magic)", self.kind)));
        }
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        let Some(n) = prefix(b).filter(|&n| (self.len..=b.len() - 8).contains(&n)) else {
            return Err(bad(format!(
                "the file is damaged or cut short: its header does not describe its {} bytes",
                b.len()
            )));
        };
        let sum = word(b.len() - 8);
        if xxhash_rust::xxh3::xxh3_64(&b[..n]) != sum {
            return Err(bad(format!(
                "checksum mismatch (stored {sum:016x}): the file is damaged"
            )));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default());
        if version != self.version {
            return Err(bad(format!(
                "version {version}, this build reads {}",
                self.version
            )));
        }
        if word(16) != key {
            return Err(bad(format!(
                "written for key {:016x}, expected {key:016x} ({})",
                word(16),
                self.key_hint
            )));
        }
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

/// The floors of one item's stored heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Floors {
    /// Every row with at least this many visits is stored (0: all are).
    pub count: u32,
    /// Every row at or above `(time, time_count)` (time first, then
    /// visits) is stored (`(i64::MIN, 0)`: all are).
    pub time: i64,
    /// See `time`.
    pub time_count: u32,
}

impl Floors {
    /// Nothing vouched for in either order.
    const NONE: Floors = Floors {
        count: u32::MAX,
        time: i64::MAX,
        time_count: u32::MAX,
    };
}

/// One item's stored ranking.
#[derive(Debug, Clone, Copy)]
pub struct StoredRanking<'s> {
    /// Stored rows (ascending).
    pub rows: &'s [u32],
    /// Their visits.
    pub counts: &'s [u32],
    /// What the rows vouch for.
    pub floors: Floors,
}

impl StoredRanking<'_> {
    /// Every eligible counted row is stored.
    pub fn complete(&self) -> bool {
        self.floors.count == 0
    }

    /// Set `walks`' counts (over `table`) to the stored ones.
    pub fn load(&self, walks: &mut WalkCounts, table: (u32, u32)) {
        walks.reset(table);
        for (&r, &c) in self.rows.iter().zip(self.counts) {
            walks.set(r, c);
        }
    }

    /// Whether `row`, with `visits`, lies in the stored head of its order
    /// (then its place among the ranked rows is the live ranker's).
    pub fn exact(&self, g: &GraphView<'_>, prefer_latest: bool, row: u32, visits: u32) -> bool {
        let f = &self.floors;
        if prefer_latest {
            let t = g.time_of(row).unwrap_or(i64::MIN);
            (t, visits) >= (f.time, f.time_count)
        } else {
            visits >= f.count
        }
    }
}

/// The walk settings of a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreParams {
    /// Walks the counts stand for.
    pub num_walks: usize,
    /// Rows each walk visits.
    pub walk_length: usize,
    /// `expected_prune`.
    pub prune: f32,
    /// Rows each head holds at most.
    pub cap: usize,
}

/// The bytes of a store: computed here, or the file mapped (shared by
/// every process of the host that reads it).
#[derive(Debug)]
enum Bytes {
    /// 8-aligned, as the file's sections need.
    Owned(Vec<u64>),
    Mapped(memmap2::Mmap),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Owned(v) => bytemuck::cast_slice(v),
            Bytes::Mapped(m) => m,
        }
    }
}

/// The file's fixed header: magic, version, padding, key, items, rows.
const HEADER: usize = 40;

/// The stored rankings of a database's task items: the file's bytes
/// (header; the 8-byte arrays `bounds`, `offsets` (items + 1),
/// `time_floor`; the 4-byte arrays `seeds`, `count_floor`,
/// `time_count_floor`, `rows`, `counts`; zero padding to 8; the xxh3-64 of
/// everything before it), read in place.
#[derive(Debug)]
pub struct RankStore {
    bytes: Bytes,
    n: usize,
    m: usize,
}

/// One item's stored rows `(row, visits)`, ascending, and their floors.
type Head = (Vec<(u32, u32)>, Floors);

impl RankStore {
    /// Byte ranges of the arrays, in file order.
    fn sections(n: usize, m: usize) -> [(usize, usize); 8] {
        let lens = [8 * n, 8 * (n + 1), 8 * n, 4 * n, 4 * n, 4 * n, 4 * m, 4 * m];
        let mut at = HEADER;
        lens.map(|l| {
            at += l;
            (at - l, at)
        })
    }

    fn u32s(&self, i: usize) -> &[u32] {
        let (a, b) = Self::sections(self.n, self.m)[i];
        bytemuck::cast_slice(&self.bytes.get()[a..b])
    }

    fn u64s(&self, i: usize) -> &[u64] {
        let (a, b) = Self::sections(self.n, self.m)[i];
        bytemuck::cast_slice(&self.bytes.get()[a..b])
    }

    fn i64s(&self, i: usize) -> &[i64] {
        let (a, b) = Self::sections(self.n, self.m)[i];
        bytemuck::cast_slice(&self.bytes.get()[a..b])
    }

    /// Items stored.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether no item is stored.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Rows stored over all items.
    pub fn stored_rows(&self) -> usize {
        self.m
    }

    /// Items whose every eligible counted row is stored.
    pub fn complete_items(&self) -> usize {
        self.u32s(4).iter().filter(|&&c| c == 0).count()
    }

    /// The stored ranking of `seed` at `bound`, if stored.
    pub fn get(&self, seed: u32, bound: i64) -> Option<StoredRanking<'_>> {
        let (seeds, bounds) = (self.u32s(3), self.i64s(0));
        let (mut lo, mut hi) = (0, self.n);
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            if (seeds[mid], bounds[mid]) < (seed, bound) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == self.n || (seeds[lo], bounds[lo]) != (seed, bound) {
            return None;
        }
        let offsets = self.u64s(1);
        let (a, b) = (offsets[lo] as usize, offsets[lo + 1] as usize);
        Some(StoredRanking {
            rows: &self.u32s(6)[a..b],
            counts: &self.u32s(7)[a..b],
            floors: Floors {
                count: self.u32s(4)[lo],
                time: self.i64s(2)[lo],
                time_count: self.u32s(5)[lo],
            },
        })
    }

    /// Compute the items `keys` (`(seed, bound)`, ascending, distinct;
    /// the walks see children dated up to `bound`) in parallel on the
    /// current rayon pool, under file key `key`.
    pub fn compute(
        g: &GraphView<'_>,
        wg: &WalkGraph,
        keys: &[(u32, i64)],
        p: &StoreParams,
        key: u64,
    ) -> RankStore {
        let parts: Vec<Vec<Head>> = keys
            .par_chunks(CHUNK)
            .map(|chunk| {
                let (mut spread, mut walks) = (Spread::default(), WalkCounts::default());
                chunk
                    .iter()
                    .map(|&(seed, bound)| {
                        let table = g
                            .table_of(seed)
                            .and_then(|t| g.table_rows.get(t).copied())
                            .unwrap_or((0, 0));
                        let wp = WalkParams {
                            num_walks: p.num_walks,
                            walk_length: p.walk_length,
                            cutoff: bound,
                            bound,
                            table,
                        };
                        // No deadline: the result is always Ok.
                        let _ = spread.expected(wg, seed, &wp, p.prune, &mut walks, None);
                        heads(g, &walks, seed, bound, p.cap)
                    })
                    .collect()
            })
            .collect();
        let heads: Vec<&Head> = parts.iter().flatten().collect();
        let (n, m) = (keys.len(), heads.iter().map(|h| h.0.len()).sum::<usize>());
        let words = Self::sections(n, m)[7].1.div_ceil(8) + 1;
        let mut v = vec![0u64; words];
        let b: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&key.to_le_bytes());
        b[24..32].copy_from_slice(&(n as u64).to_le_bytes());
        b[32..40].copy_from_slice(&(m as u64).to_le_bytes());
        let mut off = 0u64;
        let offsets = std::iter::once(0).chain(heads.iter().map(|h| {
            off += h.0.len() as u64;
            off
        }));
        let sec = Self::sections(n, m);
        put(b, sec[0], keys.iter().map(|k| k.1));
        put(b, sec[1], offsets);
        put(b, sec[2], heads.iter().map(|h| h.1.time));
        put(b, sec[3], keys.iter().map(|k| k.0));
        put(b, sec[4], heads.iter().map(|h| h.1.count));
        put(b, sec[5], heads.iter().map(|h| h.1.time_count));
        put(
            b,
            sec[6],
            heads.iter().flat_map(|h| h.0.iter().map(|x| x.0)),
        );
        put(
            b,
            sec[7],
            heads.iter().flat_map(|h| h.0.iter().map(|x| x.1)),
        );
        let end = b.len() - 8;
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..end]);
        b[end..].copy_from_slice(&sum.to_le_bytes());
        RankStore {
            bytes: Bytes::Owned(v),
            n,
            m,
        }
    }

    /// Write the store to `path` (through a temporary file renamed into
    /// place: a reader never sees half a file).
    pub fn write(&self, path: &Path) -> Result<()> {
        write_renamed(path, |f| f.write_all(self.bytes.get()))
    }

    /// Map the store at `path`, refusing (naming what is wrong) a file
    /// that is not one, is damaged, or was written under another `key`.
    pub fn open(path: &Path, key: u64) -> Result<RankStore> {
        let header = DerivedHeader {
            magic: MAGIC,
            version: VERSION,
            len: HEADER,
            kind: "ranking store",
            key_hint: "other settings or items",
        };
        let map = header.map(path, key)?;
        let b: &[u8] = &map;
        let bad = |what: String| Error::format(path, what);
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        let (n, m) = (word(24) as usize, word(32) as usize);
        let fits = n < usize::MAX / 64 && m < usize::MAX / 16;
        if !fits || Self::sections(n, m)[7].1.div_ceil(8) * 8 + 8 != b.len() {
            return Err(bad(format!(
                "{} bytes do not hold {n} items and {m} rows",
                b.len()
            )));
        }
        let s = RankStore {
            bytes: Bytes::Mapped(map),
            n,
            m,
        };
        let o = s.u64s(1);
        if o[0] != 0 || o[n] != m as u64 || o.windows(2).any(|w| w[0] > w[1]) {
            return Err(bad("item offsets out of order or past the rows".into()));
        }
        Ok(s)
    }
}

/// Write `xs` little-endian into the byte range `at` of `b`.
fn put<T: bytemuck::Pod>(b: &mut [u8], at: (usize, usize), xs: impl Iterator<Item = T>) {
    let w = std::mem::size_of::<T>();
    for (chunk, x) in b[at.0..at.1].chunks_exact_mut(w).zip(xs) {
        chunk.copy_from_slice(bytemuck::bytes_of(&x));
    }
}

/// The stored heads of one item from its counts: the eligible counted
/// rows (not the seed, dated before `bound` or undated) in each order,
/// whole groups of equal keys while at most `cap` rows; rows ascending.
pub fn heads(g: &GraphView<'_>, walks: &WalkCounts, seed: u32, bound: i64, cap: usize) -> Head {
    let time = |r: u32| g.time_of(r).unwrap_or(i64::MIN);
    let mut rows: Vec<(u32, u32)> = walks
        .touched
        .iter()
        .filter(|&&r| r != seed && (time(r) == i64::MIN || time(r) < bound))
        .map(|&r| (r, walks.get(r)))
        .collect();
    let mut f = Floors::NONE;
    if rows.len() <= cap {
        f = Floors {
            count: 0,
            time: i64::MIN,
            time_count: 0,
        };
        rows.sort_unstable();
        return (rows, f);
    }
    let mut keep = vec![false; rows.len()];
    // Most visits first.
    let mut idx: Vec<usize> = (0..rows.len()).collect();
    idx.sort_unstable_by_key(|&i| Reverse(rows[i].1));
    if let Some(n) = closed_head(&idx, cap, |i| rows[i].1) {
        idx[..n].iter().for_each(|&i| keep[i] = true);
        f.count = rows[idx[n - 1]].1;
    }
    // Latest first, then most visits.
    idx.sort_unstable_by_key(|&i| Reverse((time(rows[i].0), rows[i].1)));
    if let Some(n) = closed_head(&idx, cap, |i| (time(rows[i].0), rows[i].1)) {
        idx[..n].iter().for_each(|&i| keep[i] = true);
        let last = rows[idx[n - 1]];
        (f.time, f.time_count) = (time(last.0), last.1);
    }
    let mut out: Vec<(u32, u32)> = rows
        .iter()
        .zip(&keep)
        .filter(|x| *x.1)
        .map(|x| *x.0)
        .collect();
    out.sort_unstable();
    (out, f)
}

/// The longest head of `idx` (sorted by `key`, best first) of at most
/// `cap` entries that ends between two groups of equal keys (`None`: the
/// first group alone is longer than `cap`, or `cap` is 0).
fn closed_head<K: PartialEq>(idx: &[usize], cap: usize, key: impl Fn(usize) -> K) -> Option<usize> {
    let mut n = cap.min(idx.len());
    if n == idx.len() {
        return (n > 0).then_some(n);
    }
    // Entry `n` is the first left out: back off to its group's start.
    let cut = key(idx[n]);
    while n > 0 && key(idx[n - 1]) == cut {
        n -= 1;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_heads_end_between_groups() {
        let keys = [9, 7, 7, 7, 5, 3];
        let idx: Vec<usize> = (0..keys.len()).collect();
        let k = |i: usize| keys[i];
        assert_eq!(closed_head(&idx, 3, k), Some(1), "7s straddle the cap");
        assert_eq!(closed_head(&idx, 4, k), Some(4));
        assert_eq!(closed_head(&idx, 6, k), Some(6));
        assert_eq!(closed_head(&idx[1..], 2, |i| keys[i]), None);
        assert_eq!(closed_head(&idx, 0, k), None);
    }
}
