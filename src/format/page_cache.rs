//! How the mapped files of an opened database enter the page cache.
//!
//! `lazy` (the default) leaves it to page faults: opening touches no payload
//! byte, so open time is independent of the database size. `willneed` asks
//! the kernel to read every file ahead (`madvise(MADV_WILLNEED)`, returns at
//! once); `populate` faults every page in before the open returns (like
//! `MAP_POPULATE`: `madvise(MADV_POPULATE_READ)`, or one read per page on
//! kernels without it); `mlock` also locks the pages so they are never
//! evicted, and fails with an error naming the key and `RLIMIT_MEMLOCK` when
//! the kernel refuses. Pages stay shared: eight processes that populate the
//! same database still hold one copy in the page cache.
//!
//! The three eager modes are for a database that fits in memory, so their
//! maps are also advised huge pages (`madvise(MADV_HUGEPAGE)`) when created,
//! before the header is read (`Database::open_for`): where
//! transparent huge pages are `madvise` or `always` and the filesystem keeps
//! large folios (ext4 from Linux 6.16, xfs), the pages they read enter the
//! page cache as 2 MiB folios and are mapped by 2 MiB entries, so random
//! reads over a large database take one TLB entry and one fault per 2 MiB
//! instead of per 4 KiB. Pages already in the page cache keep their size.
//! `lazy` does not advise it: faults on a database larger than memory would
//! read 2 MiB each.
//!
//! This module knows memory maps, not the file format: it is below
//! `header.rs` (which advises a fresh map before reading its header) and
//! never imports it, so the two do not form a loop.

use std::path::Path;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How an opened database's files are brought into the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageCache {
    /// On demand, by page faults (open reads no payload).
    #[default]
    Lazy,
    /// `madvise(MADV_WILLNEED)`: read-ahead started, open does not wait.
    Willneed,
    /// Every page faulted in before open returns.
    Populate,
    /// Populated and `mlock`ed (needs `RLIMIT_MEMLOCK` ≥ the database size).
    Mlock,
}

/// The locked-memory limit of this process, as `/proc/self/limits` states it.
fn memlock_limit() -> String {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max locked memory"))
                .map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    // "Max locked memory <soft> <hard> bytes"
                    format!("{} bytes (soft), {} (hard)", f[3], f[4])
                })
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Apply `mode` to the map of the file at `path` (named in errors).
pub(super) fn apply(map: &Mmap, path: &Path, mode: PageCache) -> Result<()> {
    match mode {
        PageCache::Lazy => Ok(()),
        PageCache::Willneed => map
            .advise(memmap2::Advice::WillNeed)
            .map_err(|e| Error::io(path, e)),
        PageCache::Populate => {
            populate(map);
            Ok(())
        }
        PageCache::Mlock => map.lock().map_err(|e| Error::Config {
            key: "page_cache".into(),
            value: None,
            what: format!(
                "\"mlock\": locking {} ({} bytes) failed: {e}; RLIMIT_MEMLOCK is {} \
                 (raise it with `ulimit -l`, or use page_cache=\"populate\")",
                path.display(),
                map.len(),
                memlock_limit()
            ),
        }),
    }
}

/// Ask for huge pages on a fresh map, before anything reads through it
/// (a page faulted in first starts readahead in small folios); a kernel
/// without transparent huge pages refuses (`EINVAL`), which leaves 4 KiB
/// pages, as before.
pub(super) fn advise_huge_pages(map: &Mmap) {
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    #[cfg(not(target_os = "linux"))]
    let _ = map;
}

fn populate(map: &Mmap) {
    #[cfg(target_os = "linux")]
    if map.advise(memmap2::Advice::PopulateRead).is_ok() {
        return;
    }
    // Kernels before 5.14: one read per page faults it in.
    let mut acc = 0u8;
    for page in map.chunks(4096) {
        acc ^= page[0];
    }
    std::hint::black_box(acc);
}
