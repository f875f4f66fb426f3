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
//! the items), version 3: magic, version, key, zeros to a page; the items'
//! bytes one after another (`item.rs`: floors, rows as Rice-coded gaps,
//! visits as ranks, about 2 bytes a row where version 1 took 8); the index
//! (each item's bound, offset and seed, little-endian as every host the
//! format runs on); the block table (an xxh3-64 per 4 KiB block of the
//! items' bytes); the sizes; an xxh3-64 of everything but the items. It is
//! written as it is computed, a window of items at a time, so building it
//! holds one window, the index and the table, never the whole file; it is
//! mapped and read in place, so the ranks of a host share one copy.
//! Opening hashes the header, the index and the table (about 4 % of the
//! file), never the items: a file that fails is refused naming it and what
//! is wrong, and the caller builds it again, under a [`BuildLock`] beside
//! it, so the processes of a host build it once. An item's blocks are
//! hashed at its first read, like the database's own files
//! (`crate::format::Blocks`, reporting to the database's record): a corrupt
//! one fails the batch, naming the file, the block and how to compute it
//! again. Version 2 hashed the whole file at open, which read all of it:
//! 6 s for TPC-H SF 1's 510 MiB from a cold cache.
//!
//! Never: a stored row whose visits order or tie differently from the live
//! ranker's, or a context built from a head that the floors do not vouch
//! for.

mod derived;
mod item;
mod rice;

use std::io::Write;
use std::path::Path;

use rayon::prelude::*;

pub use derived::BuildLock;
pub(crate) use derived::{write_renamed, BlockSums, DerivedHeader};
pub use item::heads;

use super::expected::Spread;
use super::walks::{WalkCounts, WalkGraph, WalkParams};
use crate::error::{Error, Result};
use crate::format::{Blocks, GraphView, Integrity, RANDOM_BLOCK_SHIFT};

const MAGIC: &[u8; 8] = b"HWRANKS\0";
const VERSION: u32 = 3;
/// Magic, version, padding, key.
const HEADER: usize = 24;
/// Where the items' bytes start: a page, so that a 4 KiB block of them is
/// one page of the map.
const BLOB: usize = 4096;
/// What to do about a corrupt block of the file, in its error.
const REBUILD: &str = "the stored rankings are derived from the database: delete the \
     database's `rankings/` folder and the next start computes them again";
/// Items, item bytes, stored rows.
const TRAILER: usize = 24;

/// Items computed per parallel job (each job allocates its scratch).
const CHUNK: usize = 512;
/// Items computed before their bytes are written: what a build holds.
const WINDOW: usize = 64 * CHUNK;

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

/// One item's stored ranking: its floors and its rows' bytes, decoded as
/// they are read.
#[derive(Debug, Clone, Copy)]
pub struct StoredRanking<'s> {
    /// The stored rows, ascending, with their visit ranks (`item.rs`).
    rows: item::Rows<'s>,
    /// What the rows vouch for (in visit ranks).
    pub floors: Floors,
}

impl StoredRanking<'_> {
    /// Every eligible counted row is stored.
    pub fn complete(&self) -> bool {
        self.floors.count == 0
    }

    /// Set `walks`' counts (over `table`) to the stored ones: the visit
    /// ranks, which order and tie as the counts do.
    pub fn load(&self, walks: &mut WalkCounts, table: (u32, u32)) {
        walks.reset(table);
        for (r, c) in self.rows.iter() {
            walks.set(r, c);
        }
    }

    /// The stored `(row, visit rank)` pairs, ascending.
    pub fn rows(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.rows.iter()
    }

    /// Whether `row`, with `visits` (as [`load`](Self::load) set them),
    /// lies in the stored head of its order (then its place among the
    /// ranked rows is the live ranker's).
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
    /// 8-aligned, as the index needs.
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

/// Where the parts of a file of `n` items, `blob` item bytes lie.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Items.
    n: usize,
    /// Item bytes, from `BLOB`.
    blob: usize,
    /// Stored rows over all items.
    m: usize,
}

impl Layout {
    /// The index: bounds (`i64`), offsets (`u64`, items + 1), seeds (`u32`).
    fn index(&self) -> [(usize, usize); 3] {
        let at = (BLOB + self.blob).next_multiple_of(8);
        let b = at + 8 * self.n;
        let s = b + 8 * (self.n + 1);
        [(at, b), (b, s), (s, s + 4 * self.n)]
    }

    /// The items' 4 KiB blocks.
    fn blocks(&self) -> usize {
        self.blob.div_ceil(1 << RANDOM_BLOCK_SHIFT)
    }

    /// The block table: an xxh3-64 per block of the items' bytes.
    fn sums(&self) -> usize {
        self.index()[2].1.next_multiple_of(8)
    }

    fn trailer(&self) -> usize {
        self.sums() + 8 * self.blocks()
    }

    fn len(&self) -> usize {
        self.trailer() + TRAILER + 8
    }
}

/// A writer that hashes and counts what goes through it: the header and
/// what follows the items into `hash`, the items block by block into
/// `blocks`.
struct Hashed<'w, W: Write> {
    out: &'w mut W,
    hash: xxhash_rust::xxh3::Xxh3,
    at: usize,
    blocks: BlockSums,
}

impl<W: Write> Hashed<'_, W> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hash.update(b);
        self.at += b.len();
        self.out.write_all(b)
    }

    /// Item bytes: hashed by block, not into the file's hash.
    fn put_items(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.at += b.len();
        self.blocks.update(b);
        self.out.write_all(b)
    }

    fn pad(&mut self) -> std::io::Result<()> {
        let n = self.at.next_multiple_of(8) - self.at;
        self.put(&[0; 8][..n])
    }
}

/// The stored rankings of a database's task items (the module doc's
/// file), read in place.
#[derive(Debug)]
pub struct RankStore {
    bytes: Bytes,
    at: Layout,
    /// The items' blocks, each checked at its first read (a store computed
    /// in memory has none to check).
    blocks: Blocks,
    /// The file, named in errors.
    path: std::path::PathBuf,
}

impl RankStore {
    fn section<T: bytemuck::Pod>(&self, i: usize) -> &[T] {
        let (a, b) = self.at.index()[i];
        bytemuck::cast_slice(&self.bytes.get()[a..b])
    }

    /// Item `i`'s bytes, once their blocks are checked (`None`: one
    /// fails, recorded in the database's integrity record, which fails
    /// the batch).
    fn item(&self, i: usize) -> Option<&[u8]> {
        let o: &[u64] = self.section(1);
        let (a, b) = (BLOB + o[i] as usize, BLOB + o[i + 1] as usize);
        let bytes = self.bytes.get();
        self.blocks.check(bytes, &self.path, a, b - a).ok()?;
        Some(&bytes[a..b])
    }

    /// Report the blocks' checks to `integrity` (the database's record, so
    /// that a corrupt block fails the batch as the database's own would).
    pub fn report_to(&mut self, integrity: &std::sync::Arc<Integrity>) {
        self.blocks.share(integrity.clone());
    }

    /// Items stored.
    pub fn len(&self) -> usize {
        self.at.n
    }

    /// Whether no item is stored.
    pub fn is_empty(&self) -> bool {
        self.at.n == 0
    }

    /// Rows stored over all items.
    pub fn stored_rows(&self) -> usize {
        self.at.m
    }

    /// Bytes of the store.
    pub fn bytes(&self) -> usize {
        self.at.len()
    }

    /// Turn read-ahead off on a mapped store (`MADV_RANDOM`): contexts read
    /// their items' rankings at random, so on a database over its memory
    /// budget a fault must read the page it needs, not the window around
    /// it (as the database's own files).
    pub fn advise_random(&self) {
        #[cfg(unix)]
        if let Bytes::Mapped(map) = &self.bytes {
            let _ = map.advise(memmap2::Advice::Random);
        }
    }

    /// Items whose every eligible counted row is stored.
    pub fn complete_items(&self) -> usize {
        (0..self.at.n)
            .filter(|&i| {
                self.item(i)
                    .and_then(item::decode)
                    .is_some_and(|d| d.floors.count == 0)
            })
            .count()
    }

    /// The stored ranking of `seed` at `bound`, if stored.
    pub fn get(&self, seed: u32, bound: i64) -> Option<StoredRanking<'_>> {
        let (seeds, bounds): (&[u32], &[i64]) = (self.section(2), self.section(0));
        let (mut lo, mut hi) = (0, self.at.n);
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            if (seeds[mid], bounds[mid]) < (seed, bound) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == self.at.n || (seeds[lo], bounds[lo]) != (seed, bound) {
            return None;
        }
        let d = item::decode(self.item(lo)?)?;
        Some(StoredRanking {
            rows: d.rows,
            floors: d.floors,
        })
    }

    /// Compute the items `keys` (`(seed, bound)`, ascending, distinct;
    /// the walks see children dated up to `bound`) in parallel on the
    /// current rayon pool, under file key `key`, in memory.
    pub fn compute(
        g: &GraphView<'_>,
        wg: &WalkGraph,
        keys: &[(u32, i64)],
        p: &StoreParams,
        key: u64,
    ) -> RankStore {
        let mut b = Vec::new();
        // Writing to memory cannot fail.
        let _ = encode(g, wg, keys, p, key, &mut b);
        let mut v = vec![0u64; b.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..b.len()].copy_from_slice(&b);
        let at = Self::layout(&b, Path::new("(memory)")).expect("a store just encoded");
        RankStore {
            bytes: Bytes::Owned(v),
            at,
            // Computed here: nothing to check.
            blocks: Blocks::new(0, 0, RANDOM_BLOCK_SHIFT, None, std::sync::Arc::default()),
            path: "stored rankings (in memory)".into(),
        }
    }

    /// Compute the items `keys` as [`compute`](Self::compute) does, into
    /// the file at `path` as they are computed (through a temporary file
    /// renamed into place), and map it.
    pub fn build(
        g: &GraphView<'_>,
        wg: &WalkGraph,
        keys: &[(u32, i64)],
        p: &StoreParams,
        key: u64,
        path: &Path,
    ) -> Result<RankStore> {
        write_renamed(path, |f| encode(g, wg, keys, p, key, f))?;
        Self::open(path, key)
    }

    /// Write the store to `path` (through a temporary file renamed into
    /// place: a reader never sees half a file).
    pub fn write(&self, path: &Path) -> Result<()> {
        write_renamed(path, |f| f.write_all(self.bytes.get()))
    }

    /// The layout the trailer of `b` states, if it describes `b`.
    fn layout(b: &[u8], path: &Path) -> Result<Layout> {
        let bad = |what: String| Error::format(path, what);
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        let t = b.len().saturating_sub(TRAILER + 8);
        let (n, blob, m) = (
            word(t) as usize,
            word(t + 8) as usize,
            word(t + 16) as usize,
        );
        let fits = n < usize::MAX / 64 && blob < usize::MAX / 2;
        let at = Layout { n, blob, m };
        if !fits || at.len() != b.len() {
            return Err(bad(format!(
                "{} bytes do not hold {n} items of {blob} bytes",
                b.len()
            )));
        }
        Ok(at)
    }

    /// Map the store at `path`, refusing (naming what is wrong) a file
    /// that is not one, is damaged, or was written under another `key`.
    pub fn open(path: &Path, key: u64) -> Result<RankStore> {
        let header = DerivedHeader {
            magic: MAGIC,
            version: VERSION,
            len: HEADER + TRAILER,
            kind: "ranking store",
            key_hint: "other settings or items",
        };
        // The header, index, block table and sizes are hashed whole; the
        // items block by block as they are read.
        let map = header.map_ends(path, key, |b| {
            let at = Self::layout(b, path).ok()?;
            Some((BLOB, BLOB + at.blob))
        })?;
        let at = Self::layout(&map, path)?;
        let blocks = Blocks::new(
            BLOB,
            BLOB + at.blob,
            RANDOM_BLOCK_SHIFT,
            Some(at.sums()),
            std::sync::Arc::default(),
        )
        .with_remedy(REBUILD);
        let s = RankStore {
            bytes: Bytes::Mapped(map),
            at,
            blocks,
            path: path.to_path_buf(),
        };
        let o: &[u64] = s.section(1);
        if o[0] != 0 || o[at.n] != at.blob as u64 || o.windows(2).any(|w| w[0] > w[1]) {
            return Err(Error::format(
                path,
                "item offsets out of order or past the items' bytes",
            ));
        }
        Ok(s)
    }
}

/// The store of `keys` into `out` (the module doc's file), computed a
/// [`WINDOW`] of items at a time.
fn encode(
    g: &GraphView<'_>,
    wg: &WalkGraph,
    keys: &[(u32, i64)],
    p: &StoreParams,
    key: u64,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let mut w = Hashed {
        out,
        hash: xxhash_rust::xxh3::Xxh3::new(),
        at: 0,
        blocks: BlockSums::new(RANDOM_BLOCK_SHIFT),
    };
    w.put(MAGIC)?;
    w.put(&VERSION.to_le_bytes())?;
    w.put(&[0; 4])?;
    w.put(&key.to_le_bytes())?;
    w.put(&[0; BLOB - HEADER])?;
    let (mut offsets, mut m) = (Vec::with_capacity(keys.len() + 1), 0usize);
    offsets.push(0u64);
    for window in keys.chunks(WINDOW) {
        let parts: Vec<(Vec<u8>, Vec<usize>, usize)> = window
            .par_chunks(CHUNK)
            .map(|chunk| compute_chunk(g, wg, chunk, p))
            .collect();
        for (bytes, ends, rows) in parts {
            let base = *offsets.last().unwrap_or(&0);
            offsets.extend(ends.iter().map(|&e| base + e as u64));
            m += rows;
            w.put_items(&bytes)?;
        }
    }
    let at = Layout {
        n: keys.len(),
        blob: w.at - BLOB,
        m,
    };
    w.pad()?;
    for k in keys {
        w.put(&k.1.to_le_bytes())?;
    }
    for o in &offsets {
        w.put(&o.to_le_bytes())?;
    }
    for k in keys {
        w.put(&k.0.to_le_bytes())?;
    }
    w.pad()?;
    let sums = std::mem::replace(&mut w.blocks, BlockSums::new(RANDOM_BLOCK_SHIFT)).finish();
    for s in sums {
        w.put(&s.to_le_bytes())?;
    }
    for x in [at.n, at.blob, at.m] {
        w.put(&(x as u64).to_le_bytes())?;
    }
    debug_assert_eq!(w.at + 8, at.len());
    let sum = w.hash.digest();
    w.out.write_all(&sum.to_le_bytes())
}

/// One job's items: their bytes, each item's end within them, and the
/// rows they store.
fn compute_chunk(
    g: &GraphView<'_>,
    wg: &WalkGraph,
    chunk: &[(u32, i64)],
    p: &StoreParams,
) -> (Vec<u8>, Vec<usize>, usize) {
    let (mut spread, mut walks) = (Spread::default(), WalkCounts::default());
    let (mut bytes, mut ends, mut rows) = (Vec::new(), Vec::with_capacity(chunk.len()), 0);
    for &(seed, bound) in chunk {
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
        let head = heads(g, &walks, seed, bound, p.cap);
        rows += head.0.len();
        item::encode(&head, &mut bytes);
        ends.push(bytes.len());
    }
    (bytes, ends, rows)
}
