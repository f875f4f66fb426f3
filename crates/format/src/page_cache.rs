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
//! A database larger than the memory the process has is read at random:
//! [`advise_random`] turns the kernel's read-ahead off for a map
//! (`MADV_RANDOM`), so a fault reads the page it needs and not the megabytes
//! around it, which would evict pages the next batch needs. The memory the
//! process has is [`memory_limit_bytes`]: the tightest memory-cgroup limit
//! on its path (v1 `memory.limit_in_bytes`, v2 `memory.max`; the page cache
//! counts against both) or, with none, the host's `MemTotal`.
//!
//! This module knows memory maps, not the file format: it is below
//! `header.rs` (which advises a fresh map before reading its header) and
//! never imports it, so the two do not form a loop.

use std::path::Path;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use headwater_common::error::{Error, Result};

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

/// Turn read-ahead off for `map` (`MADV_RANDOM`): each fault reads one
/// page. For maps read at random while the database does not fit in memory.
pub(super) fn advise_random(map: &Mmap) {
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::Random);
    #[cfg(not(unix))]
    let _ = map;
}

/// While a fresh lazy map's header and tables are read at open: no
/// read-ahead around the pages read (`MADV_RANDOM`; a cold fault would
/// otherwise read megabytes of payload with them). Each table is asked for
/// whole with [`advise_range`]; [`advise_opened`] restores the default.
pub fn advise_opening(map: &Mmap) {
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::Random);
    #[cfg(not(unix))]
    let _ = map;
}

/// Ask for bytes `off..off + len` of `map` whole (`MADV_WILLNEED` on their
/// pages: one large read, not a fault per page). A range past the end (a
/// corrupt header) is left to the check that names it.
pub fn advise_range(map: &Mmap, off: usize, len: usize) {
    #[cfg(unix)]
    if off.checked_add(len).is_some_and(|end| end <= map.len()) {
        let start = off & !4095;
        let _ = map.advise_range(memmap2::Advice::WillNeed, start, off + len - start);
    }
    #[cfg(not(unix))]
    let _ = (map, off, len);
}

/// The default read-ahead again on a map opened with [`advise_opening`]
/// (`MADV_NORMAL`); a database larger than its memory budget turns it off
/// afterwards ([`advise_random`]).
pub fn advise_opened(map: &Mmap) {
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::Normal);
    #[cfg(not(unix))]
    let _ = map;
}

/// Ask the kernel to read `map` into the page cache (`MADV_WILLNEED`: it
/// starts the reads and returns; the pages stay reclaimable). Its bytes.
pub(super) fn advise_willneed(map: &Mmap) -> u64 {
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::WillNeed);
    map.len() as u64
}

/// The memory this process can fill, page cache included: the smallest
/// memory-cgroup limit on its path (v1 or v2, every ancestor) or, without
/// one, the host's `MemTotal`; `None` where neither can be read.
pub fn memory_limit_bytes() -> Option<u64> {
    let host = meminfo_total();
    let cg = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_limit(&text, Path::new("/sys/fs/cgroup")));
    match (cg, host) {
        (Some(c), Some(h)) => Some(c.min(h)),
        (c, h) => c.or(h),
    }
}

fn meminfo_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The tightest limit along the memory cgroup path named in `proc_cgroup`
/// (the text of `/proc/self/cgroup`) under the mount `root`: v1's
/// `memory/<path>/memory.limit_in_bytes` (a value near 2^63 is "none"),
/// else v2's `<path>/memory.max` (`max` is "none").
fn cgroup_limit(proc_cgroup: &str, root: &Path) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut keep = |v: Option<u64>| {
        if let Some(v) = v {
            best = Some(best.map_or(v, |b| b.min(v)));
        }
    };
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (base, file) = if ctl.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else if ctl.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else {
            continue;
        };
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            keep(read_limit(&dir.join(file)));
            if dir == base || !dir.pop() {
                break;
            }
        }
    }
    best
}

fn read_limit(path: &Path) -> Option<u64> {
    let v: u64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    // v1 writes "no limit" as the largest page-aligned i64.
    (v < 1 << 62).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::cgroup_limit;

    #[test]
    fn the_tightest_limit_on_the_path_is_the_budget() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("memory");
        std::fs::create_dir_all(v1.join("a/b")).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(v1.join("a/memory.limit_in_bytes"), "629145600\n").unwrap();
        std::fs::write(v1.join("a/b/memory.limit_in_bytes"), "1258291200\n").unwrap();
        let text = "9:pids:/\n4:memory:/a/b\n0::/\n";
        assert_eq!(cgroup_limit(text, root.path()), Some(629_145_600));
        // v2: `max` is no limit; a number below it on the path is.
        std::fs::create_dir_all(root.path().join("x/y")).unwrap();
        std::fs::write(root.path().join("x/y/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit("0::/x/y\n", root.path()), None);
        std::fs::write(root.path().join("x/memory.max"), "734003200\n").unwrap();
        assert_eq!(cgroup_limit("0::/x/y\n", root.path()), Some(734_003_200));
        // No limit anywhere on a v1 path.
        assert_eq!(cgroup_limit("4:memory:/\n", root.path()), None);
    }
}
