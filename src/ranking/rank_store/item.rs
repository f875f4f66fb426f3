//! One item of the stored rankings: its heads (the rows a context may read
//! in each order, [`heads`]) and their bytes in the file ([`encode`],
//! [`decode`]).
//!
//! The bytes of an item: its three floors and its number of rows (LEB128
//! varints), the two Rice parameters, then its stored rows ascending, each
//! as the Golomb–Rice code (`rice.rs`) of its distance from the row before
//! (the first from 0) and of its **visit rank**. A context reads visit
//! counts only to order rows and to find groups of equal visits
//! (`crate::ranking::rankers`: most visits first; latest first, then
//! visits; the floors), so an item stores, instead of a count, its dense
//! rank among the item's distinct counts (1 the fewest; 0 stays 0): the
//! same order, the same ties, the same floors. Measured on TPC-H SF 0.1
//! (RT-J's recipe, 145 rows an item): gaps of median 605, ranks of median
//! 3; the codes take about 2 bytes a row where version 1 took 8 (a row and
//! a count) and varints 2.9.
//!
//! Never: a rank that reorders two rows or splits or merges a group of equal
//! visits (`ranks_keep_every_order_and_tie` checks it), or a read past the
//! item's bytes (a malformed item decodes to fewer rows, never a panic).

use std::cmp::Reverse;

use super::{rice, Floors};
use crate::format::GraphView;
use crate::ranking::walks::WalkCounts;

/// One item's stored rows `(row, visits)`, ascending, and their floors.
pub type Head = (Vec<(u32, u32)>, Floors);

/// Append the LEB128 varint of `x`.
fn put(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

/// The varint at the front of `b`, advancing it (`None`: `b` ends inside it).
fn take(b: &mut &[u8]) -> Option<u64> {
    let (mut x, mut shift) = (0u64, 0u32);
    loop {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        x |= u64::from(byte & 0x7f).checked_shl(shift)?;
        if byte < 0x80 {
            return Some(x);
        }
        shift += 7;
    }
}

fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

fn unzigzag(x: u64) -> i64 {
    ((x >> 1) as i64) ^ -((x & 1) as i64)
}

/// The item's bytes, appended to `out`: the floors, then the rows with
/// their visit ranks (module doc).
pub fn encode(head: &Head, out: &mut Vec<u8>) {
    let (rows, f) = head;
    let mut distinct: Vec<u32> = rows.iter().map(|x| x.1).filter(|&c| c > 0).collect();
    distinct.sort_unstable();
    distinct.dedup();
    // 0 stays 0 (unvisited); a count of the item becomes 1 + the distinct
    // counts below it; a floor that is no count of the item (0 or
    // u32::MAX, "all" or "none") stays what it is.
    let rank = |c: u32| match distinct.binary_search(&c) {
        Ok(i) => i as u32 + 1,
        Err(_) => c,
    };
    let gaps = rows
        .iter()
        .scan(0u32, |prev, &(r, _)| Some(r - std::mem::replace(prev, r)));
    let ranks = rows.iter().map(|&(_, c)| rank(c));
    let (kg, kr) = (rice::best_k(gaps.clone()).0, rice::best_k(ranks.clone()).0);
    put(out, u64::from(rank(f.count)));
    put(out, zigzag(f.time));
    put(out, u64::from(rank(f.time_count)));
    put(out, rows.len() as u64);
    out.extend([kg as u8, kr as u8]);
    let mut w = rice::Writer::new(out);
    for (g, r) in gaps.zip(ranks) {
        w.rice(g, kg);
        w.rice(r, kr);
    }
    w.finish();
}

/// An item's bytes decoded: its floors, and a reader of its rows.
pub struct Decoded<'b> {
    pub floors: Floors,
    pub rows: Rows<'b>,
}

/// The `(row, visit rank)` pairs of an item, ascending.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'b> {
    bits: &'b [u8],
    n: usize,
    kg: u32,
    kr: u32,
}

impl<'b> Rows<'b> {
    /// The pairs (fewer if the bits end early: never past them).
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + 'b {
        let mut r = rice::Reader::new(self.bits);
        let (kg, kr) = (self.kg, self.kr);
        let mut row = 0u32;
        (0..self.n).map_while(move |_| {
            row = row.checked_add(r.rice(kg)?)?;
            Some((row, r.rice(kr)?))
        })
    }
}

/// An item's bytes (`None`: they end inside the header).
pub fn decode(mut b: &[u8]) -> Option<Decoded<'_>> {
    let small = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
    let count = small(take(&mut b)?);
    let time = unzigzag(take(&mut b)?);
    let time_count = small(take(&mut b)?);
    let n = usize::try_from(take(&mut b)?).ok()?;
    let (&[kg, kr], bits) = b.split_first_chunk::<2>()?;
    let floors = Floors {
        count,
        time,
        time_count,
    };
    let rows = Rows {
        bits,
        n,
        kg: u32::from(kg).min(31),
        kr: u32::from(kr).min(31),
    };
    Some(Decoded { floors, rows })
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
    use crate::rng::Xoshiro256pp;

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

    #[test]
    fn varints_round_trip_and_stop_at_a_cut() {
        let xs = [0u64, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX];
        let mut b = Vec::new();
        for &x in &xs {
            put(&mut b, x);
        }
        let mut s = &b[..];
        let back: Vec<u64> = std::iter::from_fn(|| take(&mut s)).collect();
        assert_eq!(back, xs);
        let mut cut = &b[..b.len() - 1];
        assert_eq!(std::iter::from_fn(|| take(&mut cut)).count(), xs.len() - 1);
        for t in [i64::MIN, -1, 0, 1, 1_700_000_000_000_000, i64::MAX] {
            assert_eq!(unzigzag(zigzag(t)), t);
        }
    }

    /// Random items: the decoded rows are the stored rows, and every
    /// comparison a context makes (two counts, a count against a floor)
    /// answers the same on the ranks as on the counts.
    #[test]
    fn ranks_keep_every_order_and_tie() {
        let mut rng = Xoshiro256pp::seed_from_u64(7);
        for _ in 0..200 {
            let n = rng.below(60) as usize;
            let mut row = 0u32;
            let rows: Vec<(u32, u32)> = (0..n)
                .map(|_| {
                    row += 1 + rng.below(5000) as u32;
                    (row, rng.below(12) as u32 * (1 + rng.below(2) as u32 * 900))
                })
                .collect();
            let pick = |i: u64| rows.get(i as usize).map_or(0, |x| x.1);
            let f = Floors {
                count: pick(rng.below(n as u64 + 1)),
                time: rng.below(1 << 50) as i64 - (1 << 49),
                time_count: pick(rng.below(n as u64 + 1)),
            };
            for floors in [f, Floors::NONE] {
                let head = (rows.clone(), floors);
                let mut b = vec![0xAA];
                encode(&head, &mut b);
                let d = decode(&b[1..]).unwrap();
                let g = d.floors;
                assert_eq!(g.time, floors.time);
                assert_eq!(d.rows.n, n);
                let back: Vec<(u32, u32)> = d.rows.iter().collect();
                assert_eq!(back.iter().map(|x| x.0).collect::<Vec<_>>(), {
                    rows.iter().map(|x| x.0).collect::<Vec<_>>()
                });
                let (c, r): (Vec<u32>, Vec<u32>) =
                    rows.iter().zip(&back).map(|(a, b)| (a.1, b.1)).unzip();
                for i in 0..n {
                    assert_eq!(c[i] == 0, r[i] == 0);
                    for j in 0..n {
                        assert_eq!(c[i].cmp(&c[j]), r[i].cmp(&r[j]));
                    }
                    assert_eq!(c[i] >= floors.count, r[i] >= g.count);
                    assert_eq!(c[i] >= floors.time_count, r[i] >= g.time_count);
                }
            }
        }
    }
}
