//! Fault injection for the diagnostic configs (`debug_*` sampler keys): a
//! stuck worker, a cold page cache, a sampler pinned to one CPU. Each is
//! off by default and exists to prove a signal fires (`diag_configs/`).
//!
//! Never: used by a healthy run, or a change to what a batch contains (each
//! only costs time).

use std::path::Path;

/// The stuck worker of `debug_stall_step`: sleeps `ms` (named, not
/// inlined, so the stall dump shows where it is stuck).
#[inline(never)]
pub(super) fn injected_stall(ms: f64) {
    let t0 = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs_f64(ms / 1e3));
    // Work after the sleep keeps this frame on the stack (no tail call).
    std::hint::black_box(t0.elapsed());
}

/// Drop the pages of every file under `dir` from this process's maps
/// (`madvise(MADV_DONTNEED)` on each read-only file map found in
/// `/proc/self/maps`: the next touch faults the page in again, same bytes)
/// and from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`), and
/// turn the maps' read-ahead off (`MADV_RANDOM`: one fault, one page, as
/// random reads of a database far larger than the cache get). What the
/// kernel does for a database larger than the page cache.
pub(super) fn drop_page_cache(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(path) = parts.nth(3) else {
            continue;
        };
        if !Path::new(path).starts_with(&dir) || perms.contains('w') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        // SAFETY: a read-only file map of this process: dropping its pages
        // only makes the next read fault the same bytes back in.
        unsafe {
            libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED);
            libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_RANDOM);
        }
    }
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        if let Ok(f) = std::fs::File::open(e.path()) {
            use std::os::fd::AsRawFd;
            // SAFETY: plain advice on an open descriptor.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// Pin the calling thread to `cpu` (`debug_pin_cpu`; validated to be one
/// the process may run on). A failure is reported, not fatal.
pub(crate) fn pin_to(cpu: u32) {
    // SAFETY: builds a set with one CPU and applies it to this thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set)
    };
    if rc != 0 {
        super::maker::tracing_warn(&format!(
            "debug_pin_cpu: cannot pin a sampler thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
}
