//! Tier 2 of an in-context context (`incontext.rs`): random examples until
//! the context is full. A cell task draws rows of the seed's table; a
//! forecast task draws its items (each eligible item equally likely), whose
//! anchor rows must not be the seed's nor held already.
//!
//! Never: a ranking (tier 1's), or a row or item that breaks the rules of
//! `incontext.rs` and `items.rs` (each draw is checked before it is taken).

use std::time::Instant;

use super::bfs::{BfsScratch, Subgraph};
use super::incontext::{ExampleScratch, Fill, Stop};
use super::items::TaskItems;
use crate::rng::{mix64, Xoshiro256pp};

impl Fill<'_, '_> {
    /// Tier 2, until the context is full: random rows of the seed's table
    /// (a forecast task's: random items) the walks did not visit (at most
    /// as many draws as there are candidates or `S` has cells), then
    /// random ones whatever their visits (as many draws), then the
    /// candidates in order from a random one. Each is taken if eligible
    /// and labelled; so a context is short only when no such candidate is
    /// left (the last pass reads them once at most).
    pub(super) fn random_examples(
        &self,
        seed: u32,
        key: u64,
        rng: &mut Xoshiro256pp,
        bs: &mut BfsScratch,
        sc: &mut ExampleScratch,
        out: &mut Subgraph,
    ) -> Result<(), Stop> {
        let (lo, hi) = self.p.table;
        let n = match &self.p.items {
            Some(it) => it.len() as u64,
            None => u64::from(hi - lo),
        };
        if n == 0 {
            return Ok(());
        }
        let mut pick = Xoshiro256pp::seed_from_u64(mix64(key ^ 0x0074_6965_7232));
        let draws = n.min(self.p.seq_len as u64);
        for visited in [false, true] {
            for _ in 0..draws {
                if self.full(out) {
                    return Ok(());
                }
                let c = pick.below(n) as u32;
                let row = self.p.items.map_or(lo + c, |it| it.anchor_rows[c as usize]);
                if visited || sc.rank.walks.get(row) == 0 {
                    self.random_example(seed, c, rng, bs, sc, out)?;
                }
            }
        }
        let start = pick.below(n);
        for i in 0..n {
            if self.full(out) {
                break;
            }
            // The pass may read a large table: the deadline holds here too.
            if i % 4096 == 4095 && self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Stop::Deadline);
            }
            let c = ((start + i) % n) as u32;
            self.random_example(seed, c, rng, bs, sc, out)?;
        }
        Ok(())
    }

    /// Add candidate `c` (a row offset in the seed's table, or a forecast
    /// item) as a tier-2 example if it may be one: its row not the seed,
    /// not held, eligible, labelled (an item: its window closed) and of a
    /// split the seed may see.
    fn random_example(
        &self,
        seed: u32,
        c: u32,
        rng: &mut Xoshiro256pp,
        bs: &mut BfsScratch,
        sc: &mut ExampleScratch,
        out: &mut Subgraph,
    ) -> Result<(), Stop> {
        let (row, item) = match &self.p.items {
            Some(it) => (it.anchor_rows[c as usize], Some(c)),
            None => (self.p.table.0 + c, None),
        };
        if row == seed || sc.local.contains_key(&row) || !self.eligible_time(row) {
            return Ok(());
        }
        let labelled = match (&self.p.items, item) {
            (Some(it), Some(j)) => TaskItems::eligible(it, j, self.bound),
            _ => (self.p.has_label)(row),
        } && self.shown(c);
        if !labelled {
            return Ok(());
        }
        self.example(row, item, 2, rng, bs, sc, out)
    }
}
