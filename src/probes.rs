//! Kernel probes: what the operating system counted for the sampler's
//! threads (page faults today; bytes read and CPU time are the same kind of
//! reading). Each probe is one `getrusage` call (well under a microsecond),
//! read before and after the work it attributes, never per row or per cell.
//!
//! Never: opening `/proc` files on a hot path (a file per call costs more
//! than a batch's telemetry budget), or a probe whose failure stops
//! sampling (a failed call reads as 0).

/// Major page faults (a page read from disk) so far: of the calling thread,
/// or of the whole process when `whole_process` (work spread over a thread
/// pool, one piece of work at a time). Differences of two readings
/// attribute the faults taken in between.
pub fn major_faults(whole_process: bool) -> u64 {
    let who = if whole_process {
        libc::RUSAGE_SELF
    } else {
        libc::RUSAGE_THREAD
    };
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is
    // handed and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(who, &raw mut usage) } != 0 {
        return 0;
    }
    u64::try_from(usage.ru_majflt).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::major_faults;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// Pages of a file dropped from the page cache fault in from disk when
    /// touched: the thread's and the process's counters both see them; a
    /// fresh map of the now cached pages takes minor faults only, which
    /// this probe does not count.
    #[test]
    fn dropped_pages_count_as_major_faults() {
        let mut f = tempfile::tempfile().unwrap();
        let page = vec![7u8; 4096];
        for _ in 0..256 {
            f.write_all(&page).unwrap();
        }
        f.sync_all().unwrap();
        // SAFETY: `f` stays open and unmodified while mapped.
        let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
        let fd = f.as_raw_fd();
        // SAFETY: plain advice on an open descriptor.
        unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        let (t0, p0) = (major_faults(false), major_faults(true));
        let sum: u64 = map.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 7 * 256);
        let (t1, p1) = (major_faults(false), major_faults(true));
        assert!(
            t1 > t0,
            "no major fault counted for the thread: {t0} -> {t1}"
        );
        assert!(
            p1 - p0 >= t1 - t0,
            "process {p0} -> {p1}, thread {t0} -> {t1}"
        );
        // SAFETY: as above.
        let cached = unsafe { memmap2::Mmap::map(&f).unwrap() };
        let again: u64 = cached.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert_eq!(again, sum);
        assert_eq!(
            major_faults(false),
            t1,
            "a cached page counted as a major fault"
        );
    }
}
