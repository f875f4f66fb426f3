//! The database's distinct text values while it is preprocessed.
//!
//! One arena of UTF-8 bytes with their end offsets (the layout
//! `text_embeddings.bin` stores, written from it without a copy) and an
//! open-addressing index of ids into it: about 16 bytes per distinct value
//! beside its bytes. A `HashMap<String, u32>` beside a `Vec<String>` held
//! each value twice, with about 100 bytes of bookkeeping. The preprocessor
//! keeps all three in scratch files ([`TextTable::spilled`]): page cache,
//! not private memory, however many distinct values a database has.

use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use super::arrays::SpillVec;
use crate::error::Result;

/// An empty slot of the index.
const EMPTY: u32 = u32::MAX;

/// Distinct strings in first-insertion order, each with its id (its index).
pub struct TextTable {
    bytes: SpillVec<u8>,
    /// `offsets[i]..offsets[i + 1]` is string `i`; starts with 0.
    offsets: SpillVec<u64>,
    /// Ids by hash, linear probing; a power of two, at most half full.
    slots: SpillVec<u32>,
}

impl TextTable {
    /// An empty table in private memory.
    pub fn in_memory() -> Self {
        Self::new(
            SpillVec::in_memory(),
            SpillVec::in_memory(),
            SpillVec::in_memory(),
        )
        .expect("memory stores cannot fail")
    }

    /// An empty table in scratch files `texts.{bytes,offsets,slots}.spill`
    /// of `dir` (deleted on drop).
    pub fn spilled(dir: &Path) -> Result<Self> {
        let file = |what: &str| dir.join(format!("texts.{what}.spill"));
        Self::new(
            SpillVec::in_file(&file("bytes"))?,
            SpillVec::in_file(&file("offsets"))?,
            SpillVec::in_file(&file("slots"))?,
        )
    }

    fn new(
        bytes: SpillVec<u8>,
        mut offsets: SpillVec<u64>,
        mut slots: SpillVec<u32>,
    ) -> Result<Self> {
        offsets.push(0)?;
        slots.refill(16, EMPTY)?;
        Ok(Self {
            bytes,
            offsets,
            slots,
        })
    }

    /// Number of distinct strings.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// String `id`.
    pub fn get(&self, id: usize) -> &str {
        let (a, b) = (self.offsets[id] as usize, self.offsets[id + 1] as usize);
        // SAFETY: the arena holds only whole `&str`s appended by `intern`,
        // and offsets mark their boundaries.
        unsafe { std::str::from_utf8_unchecked(&self.bytes[a..b]) }
    }

    /// The id of `s`, added (with the next id) if new. Fails only when a
    /// scratch file cannot grow.
    pub fn intern(&mut self, s: &str) -> Result<u32> {
        let mask = self.slots.len() - 1;
        let mut i = xxh3_64(s.as_bytes()) as usize & mask;
        loop {
            match self.slots[i] {
                EMPTY => break,
                id if self.get(id as usize) == s => return Ok(id),
                _ => i = (i + 1) & mask,
            }
        }
        let id = u32::try_from(self.len()).expect("fewer than 2^32 distinct texts");
        self.bytes.extend_from_slice(s.as_bytes())?;
        self.offsets.push(self.bytes.len() as u64)?;
        self.slots[i] = id;
        if 2 * self.len() > self.slots.len() {
            self.reindex(self.slots.len() * 2)?;
        }
        Ok(id)
    }

    /// Forget the strings from id `len` on (a table that failed midway).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        self.offsets.truncate(len + 1);
        self.bytes.truncate(self.offsets[len] as usize);
        // The index shrinks (it held more than 2·len slots), so its store
        // never grows here and cannot fail.
        self.reindex((2 * len).next_power_of_two().max(16))
            .expect("a shrinking index stays within its store");
    }

    fn reindex(&mut self, size: usize) -> Result<()> {
        self.slots.refill(size, EMPTY)?;
        let mask = size - 1;
        for id in 0..self.len() {
            let mut i = xxh3_64(self.get(id).as_bytes()) as usize & mask;
            while self.slots[i] != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = id as u32;
        }
        Ok(())
    }

    /// Strings `start..` as (their end offsets with the leading one, which
    /// subtracting the first makes offsets from 0; bytes).
    pub fn tail(&self, start: usize) -> (&[u64], &[u8]) {
        let offs = &self.offsets[start..];
        (offs, &self.bytes[offs[0] as usize..])
    }

    /// Every string as (end offsets with a leading 0, bytes): the layout of
    /// an embeddings file's string sections.
    pub fn sections(&self) -> (&[u64], &[u8]) {
        (&self.offsets, &self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::TextTable;
    use std::collections::HashMap;

    #[test]
    fn interns_like_a_map_and_forgets_a_tail() {
        let dir = tempfile::tempdir().unwrap();
        for spilled in [false, true] {
            let t = if spilled {
                TextTable::spilled(dir.path()).unwrap()
            } else {
                TextTable::in_memory()
            };
            check_against_a_map(t);
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "scratch files deleted"
        );
    }

    fn check_against_a_map(mut t: TextTable) {
        let mut want: HashMap<String, u32> = HashMap::new();
        let mut order = Vec::new();
        // Many collisions in a small table, empty and multi-byte strings.
        for k in 0..5000u32 {
            let s = match k % 7 {
                0 => String::new(),
                1 => format!("é{}", k % 311),
                _ => format!("v{}", (k * 7919) % 1777),
            };
            let next = want.len() as u32;
            let id = *want.entry(s.clone()).or_insert_with(|| {
                order.push(s.clone());
                next
            });
            assert_eq!(t.intern(&s).unwrap(), id, "{s:?}");
        }
        assert_eq!(t.len(), order.len());
        for (i, s) in order.iter().enumerate() {
            assert_eq!(t.get(i), s);
        }
        let (offs, bytes) = t.tail(3);
        assert_eq!(offs.len(), order.len() - 3 + 1);
        assert_eq!(&bytes[..(offs[1] - offs[0]) as usize], order[3].as_bytes());
        // Rolling back forgets the tail's strings: they get new ids again.
        t.truncate(10);
        assert_eq!(t.len(), 10);
        for (i, s) in order.iter().enumerate().take(10) {
            assert_eq!(t.intern(s).unwrap(), i as u32);
        }
        assert_eq!(t.intern(&order[10]).unwrap(), 10);
        assert_eq!(t.intern(&order[400]).unwrap(), 11);
        let (offs, bytes) = t.sections();
        assert_eq!(offs.len(), 13);
        assert_eq!(bytes.len() as u64, offs[12]);
    }
}
