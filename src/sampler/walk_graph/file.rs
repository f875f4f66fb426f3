//! The walk graph's file: `walks/graph-{key}.bin` in the database
//! directory, the key a hash of the database's content hash and this
//! layout's version, so a database rewritten in place never reads a stale
//! graph.
//!
//! Layout: magic, version, padding, key, the three array lengths; the
//! distinct child times (`i64`), the records and the row offsets (`u32`),
//! all little-endian (as every host the format runs on); zero padding to
//! 8; the xxh3-64 of everything before it. It is mapped and read in place,
//! so the processes of a host share one copy; the whole file is checked
//! against its hash when it is opened (one sequential read, from the page
//! cache for every process after the first), so a walk never follows a
//! damaged record.
//!
//! The first process of a host that needs it builds it under a
//! [`BuildLock`] beside it while the others wait, then every process maps
//! it. A directory that cannot be written (a read-only share) costs only
//! the sharing: the process builds the graph in its own memory and says
//! so.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{view, Backing, WalkGraph};
use crate::error::{Error, Result};
use crate::format::GraphView;
use crate::sampler::rank_store::{write_renamed, BuildLock, DerivedHeader};

const MAGIC: &[u8; 8] = b"HWWALKG\0";
const VERSION: u32 = 1;
/// Magic, version, padding, key, words, rows, times.
const HEADER: usize = 48;

/// Byte ranges of times, words and row offsets in a file of these lengths,
/// and the file's length (padding and hash included).
fn layout(words: usize, rows: usize, times: usize) -> Option<[(usize, usize); 4]> {
    let t = HEADER.checked_add(times.checked_mul(8)?)?;
    let w = t.checked_add(words.checked_mul(4)?)?;
    let a = w.checked_add(rows.checked_mul(4)?)?;
    let end = a.checked_next_multiple_of(8)?.checked_add(8)?;
    Some([(HEADER, t), (t, w), (w, a), (end - 8, end)])
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
        write_renamed(path, |out| {
            let mut out = HashingWriter {
                inner: out,
                hash: xxhash_rust::xxh3::Xxh3::new(),
            };
            out.put(MAGIC)?;
            out.put(&VERSION.to_le_bytes())?;
            out.put(&[0; 4])?;
            for x in [
                key,
                self.words.len() as u64,
                self.at.len() as u64,
                self.times.len() as u64,
            ] {
                out.put(&x.to_le_bytes())?;
            }
            for &t in self.times {
                out.put(&t.to_le_bytes())?;
            }
            for &w in self.words.iter().chain(self.at) {
                out.put(&w.to_le_bytes())?;
            }
            out.put(&[0; 4][..(self.words.len() + self.at.len()) % 2 * 4])?;
            let sum = out.hash.digest();
            out.inner.write_all(&sum.to_le_bytes())
        })
    }

    /// Map the graph at `path`, refusing (naming what is wrong) a file that
    /// is not one, is damaged, or was written under another `key`.
    pub fn open(path: &Path, key: u64) -> Result<WalkGraph> {
        let header = DerivedHeader {
            magic: MAGIC,
            version: VERSION,
            len: HEADER,
            kind: "walk graph",
            key_hint: "another database",
        };
        let map = header.map(path, key)?;
        let b: &[u8] = &map;
        let bad = |what: String| Error::format(path, what);
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        let lens = [word(24), word(32), word(40)].map(|x| usize::try_from(x).unwrap_or(usize::MAX));
        let Some([t, w, a, _]) = layout(lens[0], lens[1], lens[2]).filter(|l| l[3].1 == b.len())
        else {
            return Err(bad(format!(
                "{} bytes do not hold {} words, {} rows and {} times",
                b.len(),
                lens[0],
                lens[1],
                lens[2]
            )));
        };
        // The map is page-aligned and every section starts at a multiple
        // of its element's size, so these casts cannot fail.
        let cast = |r: (usize, usize)| &b[r.0..r.1];
        let (times, words, at): (&[i64], &[u32], &[u32]) = (
            bytemuck::cast_slice(cast(t)),
            bytemuck::cast_slice(cast(w)),
            bytemuck::cast_slice(cast(a)),
        );
        // SAFETY: the slices point into `map`, a read-only mapping that
        // moves into `backing` with them and lives as long as they do.
        let (words, at, times) = unsafe { (view(words), view(at), view(times)) };
        Ok(WalkGraph {
            words,
            at,
            times,
            backing: Backing::Mapped { _map: map },
        })
    }

    /// The walk graph of the database in `db_dir` (content hash
    /// `content_hash`, graph `g`): mapped from its file, which the first
    /// process of the host to need it builds (the others wait for it);
    /// built in this process's memory, said through `say`, when the file
    /// cannot be written.
    pub fn shared(
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

/// A writer that hashes what it writes.
struct HashingWriter<'w> {
    inner: &'w mut std::io::BufWriter<std::fs::File>,
    hash: xxhash_rust::xxh3::Xxh3,
}

impl HashingWriter<'_> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hash.update(b);
        self.inner.write_all(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> WalkGraph {
        // Not a real graph: the file keeps arrays, whatever they hold.
        WalkGraph::owned((0..11).collect(), vec![0, 4, 9], vec![-5, 3, 70])
    }

    #[test]
    fn a_written_graph_maps_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let (g, key) = (graph(), WalkGraph::file_key("abc"));
        let path = WalkGraph::path(dir.path(), key);
        g.write(&path, key).unwrap();
        let m = WalkGraph::open(&path, key).unwrap();
        assert!(m.is_mapped() && !g.is_mapped());
        assert_eq!((m.words(), m.at(), m.times), (g.words(), g.at(), g.times));
        assert_eq!(m.heap_bytes(), g.heap_bytes());
    }

    #[test]
    fn a_damaged_short_or_foreign_file_is_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let key = WalkGraph::file_key("abc");
        let path = WalkGraph::path(dir.path(), key);
        graph().write(&path, key).unwrap();
        let good = std::fs::read(&path).unwrap();
        let refused = |bytes: &[u8], key: u64| {
            std::fs::write(&path, bytes).unwrap();
            WalkGraph::open(&path, key).unwrap_err().to_string()
        };
        let mut flipped = good.clone();
        flipped[HEADER + 9] ^= 1;
        assert!(refused(&flipped, key).contains("checksum mismatch"));
        assert!(refused(&good[..good.len() - 8], key).contains("checksum mismatch"));
        assert!(refused(b"not a graph at all, truly", key).contains("magic"));
        let other = WalkGraph::file_key("another database");
        assert!(refused(&good, other).contains("written for key"));
        assert!(WalkGraph::open(&path, key).is_ok());
    }

    #[test]
    fn keys_differ_by_content() {
        assert_ne!(WalkGraph::file_key("a"), WalkGraph::file_key("b"));
        assert_eq!(WalkGraph::file_key("a"), WalkGraph::file_key("a"));
    }
}
