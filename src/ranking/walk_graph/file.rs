//! The walk graph's file: `walks/graph-{key}.bin` in the database
//! directory, the key a hash of the database's content hash and this
//! layout's version, so a database rewritten in place never reads a stale
//! graph.
//!
//! Layout (version 2), little-endian (as every host the format runs on),
//! every section 8-aligned: the header (magic, version, padding, key, the
//! three array lengths, the block shift); the block table, one xxh3-64 per
//! `1 << shift`-byte block of the data; zero padding to a page; the data:
//! the distinct child times (`i64`), zero padding to a block, the records
//! and the row offsets (`u32`), zero padding to 8; then the xxh3-64 of the
//! header, the table and their padding. It is mapped and read in place, so
//! the processes of a host share one copy.
//!
//! Checks: opening hashes the header and the block table (8 bytes per 4
//! KiB block: 0.2 % of the file) and the times' blocks (binary-searched at
//! every context); a file that fails (damaged, cut short, another key or
//! version) is refused and built again. Every other block is hashed at its
//! first read, like the database's own files (`crate::format::Blocks`):
//! a walk reads a record only once its blocks are checked, and a corrupt
//! one ends the walk and fails the batch, naming the file and the block
//! and how to build it again ([`REBUILD`]). So a cold open reads no record
//! and a cold random read costs the pages it reads. Each in-context batch
//! also checks a bounded run of the blocks not read yet
//! ([`WalkGraph::check_ahead`]), so that the whole file is checked after a
//! few hundred batches and a walk step's check is then one load.
//!
//! The first process of a host that needs it builds it under a
//! [`BuildLock`] beside it while the others wait, then every process maps
//! it. A directory that cannot be written (a read-only share) costs only
//! the sharing: the process builds the graph in its own memory and says
//! so.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{too_big, view, Backing, WalkGraph};
use crate::error::{Error, Result};
use crate::format::{Blocks, GraphView, Integrity, BLOCK_SHIFTS, RANDOM_BLOCK_SHIFT};
use crate::ranking::rank_store::{write_renamed, BlockSums, BuildLock, DerivedHeader};

const MAGIC: &[u8; 8] = b"HWWALKG\0";
const VERSION: u32 = 2;
/// Magic, version, padding, key, words, rows, times, block shift.
const HEADER: usize = 56;
/// The data starts on a page: a 4 KiB block is one page of the map.
const PAGE: usize = 4096;

/// What to do about a corrupt block of the file, in its error.
pub(super) const REBUILD: &str = "the walk graph is derived from the database: delete the \
     database's `walks/` folder and the next start builds it again";

/// Where the parts of a file lie (byte ranges).
#[derive(Debug, Clone, Copy)]
struct Layout {
    shift: u32,
    /// Data blocks (each with a checksum in the table, from `HEADER`).
    blocks: usize,
    /// The data, checked block by block.
    data: (usize, usize),
    times: (usize, usize),
    words: (usize, usize),
    at: (usize, usize),
}

impl Layout {
    /// The layout of a file of these lengths (`None`: an impossible one).
    fn new(words: usize, rows: usize, times: usize, shift: u32) -> Option<Layout> {
        if !BLOCK_SHIFTS.contains(&shift) {
            return None;
        }
        let block = 1usize << shift;
        let t = times.checked_mul(8)?;
        let w = t.checked_next_multiple_of(block)?;
        let a = w.checked_add(words.checked_mul(4)?)?;
        let e = a.checked_add(rows.checked_mul(4)?)?;
        let len = e.checked_next_multiple_of(8)?;
        let blocks = len.div_ceil(block);
        let s = (blocks.checked_mul(8)?.checked_add(HEADER)?).checked_next_multiple_of(PAGE)?;
        s.checked_add(len)?.checked_add(8)?;
        Some(Layout {
            shift,
            blocks,
            data: (s, s + len),
            times: (s, s + t),
            words: (s + w, s + a),
            at: (s + a, s + e),
        })
    }

    /// The layout the (unchecked) header of `b` describes, if it is one.
    fn of(b: &[u8]) -> Option<Layout> {
        let word = |at: usize| -> Option<usize> {
            let x = u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?);
            usize::try_from(x).ok()
        };
        let shift = u32::try_from(word(48)?).ok()?;
        Layout::new(word(24)?, word(32)?, word(40)?, shift)
    }

    /// Bytes of the file (the trailing hash included).
    fn file_len(&self) -> usize {
        self.data.1 + 8
    }
}

/// The xxh3-64 of each `1 << shift`-byte block of `parts` laid end to end
/// (the last block short).
fn block_sums(parts: &[&[u8]], shift: u32) -> Vec<u64> {
    let mut sums = BlockSums::new(shift);
    for p in parts {
        sums.update(p);
    }
    sums.finish()
}

impl WalkGraph {
    /// The file key of a database with content hash `content_hash`.
    pub fn file_key(content_hash: &str) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(content_hash.as_bytes());
        h.update(&VERSION.to_le_bytes());
        h.digest()
    }

    /// Where the walk graph of the database in `db_dir` with key `key` lives.
    pub fn path(db_dir: &Path, key: u64) -> PathBuf {
        db_dir.join("walks").join(format!("graph-{key:016x}.bin"))
    }

    /// Write the graph to `path` under `key` (through a temporary file
    /// renamed into place: a reader never sees half a file).
    pub fn write(&self, path: &Path, key: u64) -> Result<()> {
        let (w, a, t) = (self.words, self.at, self.times);
        let l = Layout::new(w.len(), a.len(), t.len(), RANDOM_BLOCK_SHIFT)
            .ok_or_else(|| too_big(w.len() as u64))?;
        let zeros = vec![0u8; 1 << l.shift];
        let data: [&[u8]; 5] = [
            bytemuck::cast_slice(t),
            &zeros[..l.words.0 - l.times.1],
            bytemuck::cast_slice(w),
            bytemuck::cast_slice(a),
            &zeros[..l.data.1 - l.at.1],
        ];
        let sums = block_sums(&data, l.shift);
        debug_assert_eq!(sums.len(), l.blocks);
        let mut head = Vec::with_capacity(l.data.0);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.extend_from_slice(&[0; 4]);
        let lens = [w.len(), a.len(), t.len()].map(|n| n as u64);
        for x in [key].into_iter().chain(lens).chain([u64::from(l.shift)]) {
            head.extend_from_slice(&x.to_le_bytes());
        }
        for s in &sums {
            head.extend_from_slice(&s.to_le_bytes());
        }
        head.resize(l.data.0, 0);
        let sum = xxhash_rust::xxh3::xxh3_64(&head);
        write_renamed(path, |out| {
            out.write_all(&head)?;
            data.iter().try_for_each(|d| out.write_all(d))?;
            out.write_all(&sum.to_le_bytes())
        })
    }

    /// Map the graph at `path`, refusing (naming what is wrong) a file that
    /// is not one, whose header, block table or times are damaged, that is
    /// cut short, or that was written under another `key`. Reads the
    /// header, the table and the times; the other blocks are checked at
    /// their first read (see the module's doc).
    pub fn open(path: &Path, key: u64) -> Result<WalkGraph> {
        let header = DerivedHeader {
            magic: MAGIC,
            version: VERSION,
            len: HEADER,
            kind: "walk graph",
            key_hint: "another database",
        };
        let map = header.map_prefix(path, key, |b| {
            Layout::of(b)
                .filter(|l| l.file_len() == b.len())
                .map(|l| l.data.0)
        })?;
        let b: &[u8] = &map;
        let l = Layout::of(b).ok_or_else(|| Error::format(path, "header changed under us"))?;
        let blocks = Blocks::new(
            l.data.0,
            l.data.1,
            l.shift,
            Some(HEADER),
            Arc::new(Integrity::default()),
        )
        .with_remedy(REBUILD);
        // The times, asked for whole (one read, not a fault per page).
        crate::format::advise_range(&map, l.times.0, l.times.1 - l.times.0);
        blocks.check(b, path, l.times.0, l.times.1 - l.times.0)?;
        // The map is page-aligned and every section starts at a multiple
        // of its element's size, so these casts cannot fail.
        let cast = |r: (usize, usize)| &b[r.0..r.1];
        let (times, words, at): (&[i64], &[u32], &[u32]) = (
            bytemuck::cast_slice(cast(l.times)),
            bytemuck::cast_slice(cast(l.words)),
            bytemuck::cast_slice(cast(l.at)),
        );
        // SAFETY: the slices point into `map`, a read-only mapping that
        // moves into `backing` with them and lives as long as they do.
        let (words, at, times) = unsafe { (view(words), view(at), view(times)) };
        Ok(WalkGraph {
            words,
            at,
            times,
            blocks,
            words_at: l.words.0,
            word_block: (l.words.0 - l.data.0) >> l.shift,
            word_shift: l.shift - 2,
            at_at: l.at.0,
            backing: Backing::Mapped {
                map,
                path: path.to_path_buf(),
            },
        })
    }

    /// The walk graph of the database in `db_dir` (content hash
    /// `content_hash`, graph `g`, block checks reported to `integrity`):
    /// mapped from its file, which the first process of the host to need
    /// it builds (the others wait for it); built in this process's memory,
    /// said through `say`, when the file cannot be written.
    pub fn shared(
        g: &GraphView<'_>,
        db_dir: &Path,
        content_hash: &str,
        integrity: &Arc<Integrity>,
        say: &dyn Fn(&str),
    ) -> Result<WalkGraph> {
        let mut wg = Self::shared_unreported(g, db_dir, content_hash, say)?;
        wg.report_to(integrity);
        Ok(wg)
    }

    /// [`shared`](Self::shared), the checks reported to the graph's own
    /// record.
    fn shared_unreported(
        g: &GraphView<'_>,
        db_dir: &Path,
        content_hash: &str,
        say: &dyn Fn(&str),
    ) -> Result<WalkGraph> {
        let key = Self::file_key(content_hash);
        let path = Self::path(db_dir, key);
        if let Ok(wg) = Self::open(&path, key) {
            return Ok(wg);
        }
        let private = |e: &Error| {
            say(&format!(
                "examples: the walk graph cannot be shared through {} ({e}); building it in this \
                 process's memory",
                path.display()
            ));
        };
        let lock = BuildLock::take(&path.with_extension("lock"), || {
            say(&format!(
                "examples: another process is building {}; waiting for it",
                path.display()
            ));
        });
        let _lock = match lock {
            Ok(l) => l,
            Err(e) => {
                private(&e);
                return WalkGraph::new(g);
            }
        };
        match Self::open(&path, key) {
            Ok(wg) => return Ok(wg),
            Err(Error::Io { .. }) => {}
            Err(e) => say(&format!("examples: {e}; building it again")),
        }
        let t0 = std::time::Instant::now();
        let wg = WalkGraph::new(g)?;
        if let Err(e) = wg.write(&path, key) {
            private(&e);
            return Ok(wg);
        }
        say(&format!(
            "examples: built the walk graph ({:.1} MiB) in {:.1} s: {}, mapped by every process \
             of the host",
            wg.heap_bytes() as f64 / f64::from(1 << 20),
            t0.elapsed().as_secs_f64(),
            path.display()
        ));
        drop(wg);
        Self::open(&path, key)
    }
}

#[cfg(test)]
mod tests {
    use super::super::HEAD;
    use super::*;
    use crate::ranking::expected::Spread;
    use crate::ranking::walks::{WalkCounts, WalkParams};
    use crate::rng::Xoshiro256pp;

    fn graph() -> WalkGraph {
        // Not a real graph: the file keeps arrays, whatever they hold.
        WalkGraph::owned((0..11).collect(), vec![0, 4, 9], vec![-5, 3, 70])
    }

    /// Rows `0..n` of table 0 (times `1..=n`), each a child of row `n` of
    /// table 1: the hub's record (`4 + 2n` words) spans several blocks.
    struct Star {
        row_table: Vec<u16>,
        row_time: Vec<i64>,
        fwd: (Vec<u64>, Vec<u32>),
        rev: (Vec<u64>, Vec<u32>, Vec<i64>),
        table_rows: Vec<(u32, u32)>,
    }

    const N: u32 = 2000;

    fn star() -> Star {
        let mut fwd_offsets: Vec<u64> = (0..=u64::from(N)).collect();
        fwd_offsets.push(u64::from(N));
        let mut rev_offsets = vec![0; N as usize + 1];
        rev_offsets.push(u64::from(N));
        Star {
            row_table: (0..=N).map(|r| u16::from(r == N)).collect(),
            row_time: (1..=i64::from(N)).chain([i64::MIN]).collect(),
            fwd: (fwd_offsets, vec![N; N as usize]),
            rev: (rev_offsets, (0..N).collect(), (1..=i64::from(N)).collect()),
            table_rows: vec![(0, N), (N, N + 1)],
        }
    }

    fn view(s: &Star) -> GraphView<'_> {
        GraphView {
            row_table: &s.row_table,
            row_time: &s.row_time,
            fwd_offsets: &s.fwd.0,
            fwd_targets: &s.fwd.1,
            rev_offsets: &s.rev.0,
            rev_targets: &s.rev.1,
            rev_times: &s.rev.2,
            file: None,
            table_rows: &s.table_rows,
        }
    }

    fn params() -> WalkParams {
        WalkParams {
            num_walks: 100,
            walk_length: 5,
            cutoff: i64::MAX,
            bound: i64::MAX,
            table: (0, N),
        }
    }

    /// The star's graph written under key "abc" in `dir`: its path and
    /// bytes.
    fn written(dir: &Path) -> (PathBuf, Vec<u8>) {
        let key = WalkGraph::file_key("abc");
        let path = WalkGraph::path(dir, key);
        WalkGraph::new(&view(&star()))
            .unwrap()
            .write(&path, key)
            .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        (path, bytes)
    }

    /// Make the block table and the trailing hash match `b`'s data again
    /// (a file written wrong, not damaged).
    fn reseal(b: &mut [u8]) {
        let l = Layout::of(b).unwrap();
        let sums = block_sums(&[&b[l.data.0..l.data.1]], l.shift);
        for (i, s) in sums.iter().enumerate() {
            b[HEADER + 8 * i..][..8].copy_from_slice(&s.to_le_bytes());
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..l.data.0]);
        let n = b.len();
        b[n - 8..].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn a_written_graph_maps_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let s = star();
        for g in [graph(), WalkGraph::new(&view(&s)).unwrap()] {
            let key = WalkGraph::file_key("abc");
            let path = WalkGraph::path(dir.path(), key);
            g.write(&path, key).unwrap();
            let m = WalkGraph::open(&path, key).unwrap();
            assert!(m.is_mapped() && !g.is_mapped());
            assert_eq!((m.words(), m.at(), m.times), (g.words(), g.at(), g.times));
            assert_eq!(m.heap_bytes(), g.heap_bytes());
            let l = Layout::of(&std::fs::read(&path).unwrap()).unwrap();
            assert!([l.data.0, l.words.0].iter().all(|x| x % PAGE == 0), "{l:?}");
        }
    }

    #[test]
    fn a_damaged_header_or_table_a_short_or_foreign_file_is_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let (path, good) = written(dir.path());
        let key = WalkGraph::file_key("abc");
        let refused = |bytes: &[u8], key: u64| {
            std::fs::write(&path, bytes).unwrap();
            WalkGraph::open(&path, key).unwrap_err().to_string()
        };
        let l = Layout::of(&good).unwrap();
        assert!(l.blocks > 8, "{l:?}");
        // The key, a block's checksum, the times (checked at open).
        for at in [17, HEADER + 8 * (l.blocks / 2) + 3, l.times.0 + 5] {
            let mut flipped = good.clone();
            flipped[at] ^= 1;
            let e = refused(&flipped, key);
            assert!(e.contains("checksum"), "byte {at}: {e}");
        }
        // 256 more words of records than the file holds.
        let mut lens = good.clone();
        lens[25] ^= 1;
        let e = refused(&lens, key);
        assert!(e.contains("damaged or cut short"), "{e}");
        let cut = refused(&good[..good.len() - 8], key);
        assert!(cut.contains("damaged or cut short"), "{cut}");
        assert!(refused(b"not a graph at all, truly", key).contains("magic"));
        let other = WalkGraph::file_key("another database");
        assert!(refused(&good, other).contains("written for key"));
        std::fs::write(&path, &good).unwrap();
        assert!(WalkGraph::open(&path, key).is_ok());
    }

    #[test]
    fn a_damaged_record_opens_and_fails_the_first_walk_that_reads_it() {
        let (dir, s) = (tempfile::tempdir().unwrap(), star());
        let (path, mut bytes) = written(dir.path());
        let l = Layout::of(&bytes).unwrap();
        // A word in the middle of the hub's children, in a block no other
        // record shares.
        let hub = WalkGraph::new(&view(&s)).unwrap().at()[N as usize] as usize;
        let at = l.words.0 + 4 * (hub + N as usize);
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let integrity = Arc::new(Integrity::default());
        let wg = WalkGraph::shared(&view(&s), dir.path(), "abc", &integrity, &|m| {
            panic!("opened, not rebuilt: {m}")
        })
        .unwrap();
        assert!(wg.is_mapped() && integrity.check().is_ok());
        let (mut w, mut rng) = (WalkCounts::default(), Xoshiro256pp::seed_from_u64(1));
        // Every walk steps from its seed to the hub and ends there.
        assert_eq!(w.walk(&wg, 7, &params(), &mut rng, None), Ok(100));
        let e = integrity.check().unwrap_err().to_string();
        let b = (at - l.data.0) >> l.shift;
        let block = format!("block {b} of {} ", l.blocks);
        assert!(
            e.contains(&*path.to_string_lossy()) && e.contains(&block),
            "{e}"
        );
        assert!(e.contains("derived") && e.contains("`walks/`"), "{e}");
        // The expected ranker reads it as a dead end too.
        let mut spread = Spread::default();
        assert!(spread
            .expected(&wg, 7, &params(), 0.25, &mut w, None)
            .is_ok());
        assert_eq!(w.touched.len(), 1, "{:?}", w.touched);
    }

    #[test]
    fn a_record_that_does_not_fit_the_records_ends_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        let (path, good) = written(dir.path());
        let l = Layout::of(&good).unwrap();
        let hub = WalkGraph::new(&view(&star())).unwrap().at()[N as usize] as usize;
        // The hub's child count, then row 3's record offset: past the end.
        for at in [l.words.0 + 4 * (hub + 2), l.at.0 + 4 * 3] {
            let mut bytes = good.clone();
            bytes[at + 3] = 0x7f;
            reseal(&mut bytes);
            std::fs::write(&path, &bytes).unwrap();
            let wg = WalkGraph::open(&path, WalkGraph::file_key("abc")).unwrap();
            let (mut w, mut rng) = (WalkCounts::default(), Xoshiro256pp::seed_from_u64(1));
            assert!(w.walk(&wg, 3, &params(), &mut rng, None).is_ok());
            let mut spread = Spread::default();
            assert!(spread
                .expected(&wg, 3, &params(), 0.25, &mut w, None)
                .is_ok());
            let e = wg.blocks.integrity().check().unwrap_err().to_string();
            assert!(e.contains("does not fit"), "{e}");
        }
    }

    #[test]
    fn reading_every_record_checks_every_block() {
        let dir = tempfile::tempdir().unwrap();
        let (path, bytes) = written(dir.path());
        let l = Layout::of(&bytes).unwrap();
        let m = WalkGraph::open(&path, WalkGraph::file_key("abc")).unwrap();
        let times = (l.words.0 - l.data.0) >> l.shift;
        assert_eq!(m.blocks.integrity().blocks_verified(), times as u64);
        assert!(!m.blocks.all_marked());
        for row in 0..=N {
            let o = m.start_of(row).unwrap();
            assert!(m.record_ok(o));
        }
        assert!(m.record_ok(m.words().len() - HEAD), "the dead record");
        assert!(m.blocks.all_marked());
        assert_eq!(m.blocks.integrity().blocks_verified(), l.blocks as u64);
        assert!(m.blocks.integrity().check().is_ok());
    }

    #[test]
    fn checking_ahead_reaches_every_block_a_bounded_step_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut bytes) = written(dir.path());
        let l = Layout::of(&bytes).unwrap();
        let m = WalkGraph::open(&path, WalkGraph::file_key("abc")).unwrap();
        let before = m.blocks.integrity().blocks_verified();
        let mut calls = 0u64;
        while !m.blocks.all_marked() {
            m.check_ahead(3);
            calls += 1;
            let verified = m.blocks.integrity().blocks_verified();
            assert!(
                verified <= before + 3 * calls,
                "{verified} after {calls} calls"
            );
        }
        assert_eq!(m.blocks.integrity().blocks_verified(), l.blocks as u64);
        assert_eq!(calls, (l.blocks as u64 - before).div_ceil(3));
        drop(m);
        // A corrupt block no walk reads is found, and recorded, all the same.
        bytes[l.at.1 - 1] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let m = WalkGraph::open(&path, WalkGraph::file_key("abc")).unwrap();
        m.check_ahead(l.blocks);
        let e = m.blocks.integrity().check().unwrap_err().to_string();
        assert!(
            e.contains(&format!("block {} of {}", l.blocks - 1, l.blocks)),
            "{e}"
        );
    }

    #[test]
    fn keys_differ_by_content() {
        assert_ne!(WalkGraph::file_key("a"), WalkGraph::file_key("b"));
        assert_eq!(WalkGraph::file_key("a"), WalkGraph::file_key("a"));
    }
}
