//! Fault injection for the diagnostic configs (`debug_*` sampler keys): a
//! stuck worker, a cold page cache, a sampler pinned to one CPU, a build
//! that burns CPU, a busy thread on the sampler's CPU. Each is
//! off by default and exists to prove a signal fires (`diag_configs/`).
//!
//! Never: used by a healthy run, or a change to what a batch contains (each
//! only costs time).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::say::warn;

/// The stuck worker of `debug_stall_step`: sleeps `ms` (named, not
/// inlined, so the stall dump shows where it is stuck).
#[inline(never)]
pub(crate) fn injected_stall(ms: f64) {
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
pub(crate) fn drop_page_cache(dir: &Path) {
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
    evict_files_under(&dir);
}

/// `posix_fadvise(POSIX_FADV_DONTNEED)` on every file under `dir`, its
/// folders (`tables/`, `tasks/`) included: the table files live one level
/// down, and a drop that left them cached left assembly's reads warm.
fn evict_files_under(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            evict_files_under(&path);
        } else if let Ok(f) = std::fs::File::open(&path) {
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
        warn(&format!(
            "debug_pin_cpu: cannot pin a sampler thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
}

/// The CPU work of `debug_spin_ms`: a busy loop until this thread has run
/// `ms` of CPU time (the thread clock, not the wall clock: on a shared core
/// it takes longer, as real work would). Named, so a stall dump shows it.
#[inline(never)]
pub(crate) fn injected_spin(ms: f64) {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let end = crate::probes::thread_cpu_ns() + (ms * 1e6) as u64;
    let mut x = 0u64;
    while crate::probes::thread_cpu_ns() < end {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
}

/// The busy thread of `debug_cpu_hog`: pinned to `debug_pin_cpu`, it spins
/// until [`Hog::stop`] (or drop) stops and joins it.
#[derive(Debug)]
pub(crate) struct Hog {
    stop: Arc<AtomicBool>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Hog {
    /// Start the hog on `cpu` (`None`, with a warning, when the thread
    /// cannot start).
    pub(crate) fn start(cpu: u32) -> Option<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("headwater-debug-hog".into())
            .spawn(move || {
                pin_to(cpu);
                while !flag.load(Ordering::Relaxed) {
                    injected_spin(1.0);
                }
            });
        match spawned {
            Ok(h) => Some(Hog {
                stop,
                thread: std::sync::Mutex::new(Some(h)),
            }),
            Err(e) => {
                warn(&format!("debug_cpu_hog: cannot start the hog thread: {e}"));
                None
            }
        }
    }

    /// Stop the hog and join its thread (idempotent).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let h = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Whether the hog thread is still running.
    #[cfg(test)]
    fn running(&self) -> bool {
        self.thread
            .lock()
            .is_ok_and(|t| t.as_ref().is_some_and(|h| !h.is_finished()))
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_burns_thread_cpu_time() {
        let (t0, c0) = (std::time::Instant::now(), crate::probes::thread_cpu_ns());
        injected_spin(30.0);
        let cpu = crate::probes::thread_cpu_ns() - c0;
        assert!(cpu >= 30_000_000, "burned {cpu} ns of CPU");
        assert!(t0.elapsed().as_nanos() >= u128::from(cpu) * 99 / 100);
    }

    #[test]
    fn hog_runs_until_stopped_and_joined() {
        let cpu = (0..1024).find(|&c| crate::probes::may_run_on(c)).unwrap();
        let hog = Hog::start(cpu).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(hog.running());
        hog.stop();
        assert!(!hog.running());
        hog.stop();
    }
}
