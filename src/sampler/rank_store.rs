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
//! built again with the live ranker (`incontext.rs`): stored or not, the
//! batch is the same.
//!
//! The file (`rankings/expected-{key}.bin` in the database directory; the
//! key hashes the database's content hash, the walk settings, the cap and
//! the items): magic, version, key, sizes, the arrays little-endian, and
//! an xxh3-64 of everything before it. A file that fails any check is
//! refused naming it and what is wrong; the caller builds it again.
//!
//! Never: a stored row whose count differs from the live ranker's, or a
//! context built from a head that the floors do not vouch for.

use std::cmp::Reverse;
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

/// The floors of one item's stored heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// The stored rankings of a database's task items.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RankStore {
    /// `(seed, bound)` per item, ascending.
    keys: Vec<(u32, i64)>,
    /// Item `i`'s rows are `rows[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<u64>,
    rows: Vec<u32>,
    counts: Vec<u32>,
    floors: Vec<Floors>,
}

/// One item's stored rows `(row, visits)`, ascending, and their floors.
type Head = (Vec<(u32, u32)>, Floors);

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

impl RankStore {
    /// Items stored.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no item is stored.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Rows stored over all items.
    pub fn stored_rows(&self) -> usize {
        self.rows.len()
    }

    /// Items whose every eligible counted row is stored.
    pub fn complete_items(&self) -> usize {
        self.floors.iter().filter(|f| f.count == 0).count()
    }

    /// The stored ranking of `seed` at `bound`, if stored.
    pub fn get(&self, seed: u32, bound: i64) -> Option<StoredRanking<'_>> {
        let i = self.keys.binary_search(&(seed, bound)).ok()?;
        let (lo, hi) = (self.offsets[i] as usize, self.offsets[i + 1] as usize);
        Some(StoredRanking {
            rows: &self.rows[lo..hi],
            counts: &self.counts[lo..hi],
            floors: self.floors[i],
        })
    }

    /// Compute the items `keys` (`(seed, bound)`, ascending, distinct;
    /// the walks see children dated up to `bound`) in parallel on the
    /// current rayon pool.
    pub fn compute(
        g: &GraphView<'_>,
        wg: &WalkGraph,
        keys: Vec<(u32, i64)>,
        p: &StoreParams,
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
        let mut s = RankStore {
            keys,
            offsets: vec![0],
            ..RankStore::default()
        };
        for (rows, floors) in parts.into_iter().flatten() {
            s.rows.extend(rows.iter().map(|x| x.0));
            s.counts.extend(rows.iter().map(|x| x.1));
            s.offsets.push(s.rows.len() as u64);
            s.floors.push(floors);
        }
        s
    }

    /// Write the store to `path` under `key` (through a temporary file
    /// renamed into place: a reader never sees half a file).
    pub fn write(&self, path: &Path, key: u64) -> Result<()> {
        let mut b = Vec::with_capacity(64 + self.rows.len() * 8 + self.keys.len() * 40);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&key.to_le_bytes());
        b.extend_from_slice(&(self.keys.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.rows.len() as u64).to_le_bytes());
        put(&mut b, self.keys.iter().map(|k| k.0));
        put(&mut b, self.keys.iter().map(|k| k.1));
        put(&mut b, self.offsets.iter().copied());
        put(&mut b, self.floors.iter().map(|f| f.count));
        put(&mut b, self.floors.iter().map(|f| f.time));
        put(&mut b, self.floors.iter().map(|f| f.time_count));
        put(&mut b, self.rows.iter().copied());
        put(&mut b, self.counts.iter().copied());
        let sum = xxhash_rust::xxh3::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &b).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    }

    /// Read the store at `path`, refusing (naming what is wrong) a file
    /// that is not one, is damaged, or was written under another `key`.
    pub fn read(path: &Path, key: u64) -> Result<RankStore> {
        let b = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let bad = |what: String| Error::format(path, what);
        if b.len() < 44 || &b[..8] != MAGIC {
            return Err(bad("not a headwater ranking store (magic)".into()));
        }
        let (body, tail) = b.split_at(b.len() - 8);
        let sum = u64::from_le_bytes(tail.try_into().unwrap_or_default());
        if xxhash_rust::xxh3::xxh3_64(body) != sum {
            return Err(bad(format!(
                "checksum mismatch (stored {sum:016x}): the file is damaged"
            )));
        }
        let mut r = Reader {
            b: body,
            at: 8,
            path,
        };
        let version = r.u32()?;
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this build reads {VERSION}"
            )));
        }
        let found = r.u64()?;
        if found != key {
            return Err(bad(format!(
                "written for key {found:016x}, expected {key:016x} (other settings or items)"
            )));
        }
        let (n, m) = (r.u64()? as usize, r.u64()? as usize);
        let seeds = r.vec(n, u32::from_le_bytes)?;
        let bounds = r.vec(n, i64::from_le_bytes)?;
        let offsets = r.vec(n + 1, u64::from_le_bytes)?;
        let fc = r.vec(n, u32::from_le_bytes)?;
        let ft = r.vec(n, i64::from_le_bytes)?;
        let ftc = r.vec(n, u32::from_le_bytes)?;
        let rows = r.vec(m, u32::from_le_bytes)?;
        let counts = r.vec(m, u32::from_le_bytes)?;
        if r.at != body.len()
            || offsets.first() != Some(&0)
            || offsets.last() != Some(&(m as u64))
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(bad("inconsistent sizes or offsets".into()));
        }
        Ok(RankStore {
            keys: seeds.into_iter().zip(bounds).collect(),
            offsets,
            rows,
            counts,
            floors: (0..n)
                .map(|i| Floors {
                    count: fc[i],
                    time: ft[i],
                    time_count: ftc[i],
                })
                .collect(),
        })
    }
}

/// Append `xs` little-endian.
fn put<T: ToLeBytes>(b: &mut Vec<u8>, xs: impl Iterator<Item = T>) {
    for x in xs {
        x.put(b);
    }
}

/// A fixed-size integer written little-endian.
trait ToLeBytes {
    fn put(self, b: &mut Vec<u8>);
}

macro_rules! to_le {
    ($($t:ty),*) => {$(
        impl ToLeBytes for $t {
            fn put(self, b: &mut Vec<u8>) {
                b.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
to_le!(u32, u64, i64);

/// A cursor over a checked file body.
struct Reader<'b> {
    b: &'b [u8],
    at: usize,
    path: &'b Path,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(Error::format(
                self.path,
                format!("truncated at byte {}", self.at),
            ));
        };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    fn vec<T, const W: usize>(&mut self, n: usize, f: fn([u8; W]) -> T) -> Result<Vec<T>> {
        let bytes = self.take(n.saturating_mul(W))?;
        Ok(bytes
            .chunks_exact(W)
            .map(|c| f(c.try_into().unwrap_or([0; W])))
            .collect())
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
