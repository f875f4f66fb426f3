//! Kernel probes: what the operating system counted for the sampler's
//! threads — major page faults (`getrusage`), bytes read from storage
//! (`/proc/thread-self/io`, `/proc/self/io`), CPU time and time runnable
//! but not running (`/proc/thread-self/schedstat`) — and whether a mapped
//! page is in the page cache (`mincore`, [`page_resident`]). Each is read before and
//! after the work it attributes (a batch), never per row or per cell: one
//! `getrusage` call (well under a microsecond) and at most two `pread`s of
//! `/proc` files each thread opened once and keeps open (a few
//! microseconds; `headwater bench` measures the total).
//!
//! Never: opening a `/proc` file on a hot path (an open per call costs more
//! than a batch's telemetry budget; the descriptors here are opened once per
//! thread), or a probe whose failure stops sampling (a failed read reads as
//! 0).

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;

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

/// What the kernel counted for one thread (or the process) up to now:
/// differences of two readings attribute the work in between.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Major page faults (pages read from disk).
    pub major_faults: u64,
    /// Bytes the thread (process) caused to be read from storage (page
    /// faults of mapped files included): `read_bytes` of `/proc/…/io`.
    pub read_bytes: u64,
    /// Nanoseconds on a CPU (`CLOCK_THREAD_CPUTIME_ID`: exact to the
    /// call, where schedstat's field 1 lags by up to a scheduler tick; the
    /// calling thread only).
    pub cpu_ns: u64,
    /// Nanoseconds runnable but waiting for a CPU (schedstat field 2: the
    /// run-queue wait; the calling thread only).
    pub runqueue_ns: u64,
}

impl Usage {
    /// `self - before`, each counter saturating at 0.
    #[must_use]
    pub fn since(self, before: Usage) -> Usage {
        Usage {
            major_faults: self.major_faults.saturating_sub(before.major_faults),
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            cpu_ns: self.cpu_ns.saturating_sub(before.cpu_ns),
            runqueue_ns: self.runqueue_ns.saturating_sub(before.runqueue_ns),
        }
    }
}

/// One thread's `/proc` files, opened on its first probe and kept open
/// (`/proc/thread-self` names the opening thread; a descriptor stays bound
/// to it).
struct ProcFiles {
    schedstat: Option<File>,
    thread_io: Option<File>,
    process_io: Option<File>,
}

thread_local! {
    static PROC: RefCell<Option<ProcFiles>> = const { RefCell::new(None) };
}

/// The first integer of `text` after `key` (`/proc/…/io` lines), or 0.
fn field_after(text: &[u8], key: &[u8]) -> u64 {
    text.windows(key.len())
        .position(|w| w == key)
        .map_or(0, |at| leading_int(&text[at + key.len()..]))
}

fn leading_int(text: &[u8]) -> u64 {
    text.iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |n, &d| {
            n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
        })
}

/// The whole of `f` from offset 0 into `buf` (a `/proc` file is generated
/// on each read); the bytes read.
fn pread<'a>(f: Option<&File>, buf: &'a mut [u8]) -> &'a [u8] {
    let n = f.and_then(|f| f.read_at(buf, 0).ok()).unwrap_or(0);
    &buf[..n]
}

thread_local! {
    /// The calling thread's run-queue total at the end of its last
    /// [`runqueue_since_last`] (`None`: no earlier build on this thread).
    static LAST_RUNQUEUE: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// The run-queue wait of the calling thread between the end of its previous
/// piece of work (the last call) and `start` (this piece's first reading),
/// then remember `end` for the next call: the wait to be scheduled after
/// being woken for this work, which a window from `start` to `end` misses.
/// 0 on the thread's first call.
pub fn runqueue_since_last(start: Usage, end: Usage) -> u64 {
    LAST_RUNQUEUE.with(|last| {
        let before = last
            .get()
            .map_or(0, |l| start.runqueue_ns.saturating_sub(l));
        last.set(Some(end.runqueue_ns));
        before
    })
}

/// CPU time of the calling thread so far (ns; 0 if the clock fails).
pub fn thread_cpu_ns() -> u64 {
    cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of the whole process so far, every thread (ns; 0 if the clock
/// fails): what a benchmark divides by for its per-CPU-second rates.
pub fn process_cpu_ns() -> u64 {
    cpu_clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn cpu_clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    if unsafe { libc::clock_gettime(clock, &raw mut ts) } != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The kernel's counts so far for the calling thread, or for the whole
/// process when `whole_process` (faults and bytes read; CPU and run-queue
/// time stay the calling thread's: a process-wide figure would count the
/// trainer's threads too).
pub fn usage(whole_process: bool) -> Usage {
    let major_faults = major_faults(whole_process);
    PROC.with(|p| {
        let mut p = p.borrow_mut();
        let files = p.get_or_insert_with(|| ProcFiles {
            schedstat: File::open("/proc/thread-self/schedstat").ok(),
            thread_io: File::open("/proc/thread-self/io").ok(),
            process_io: File::open("/proc/self/io").ok(),
        });
        let mut buf = [0u8; 512];
        let sched = pread(files.schedstat.as_ref(), &mut buf);
        // Field 2, the run-queue wait, is complete up to the thread's last
        // switch in: every wait before this (running) read is counted.
        let runqueue_ns = sched.split(|b| *b == b' ').nth(1).map_or(0, leading_int);
        let cpu_ns = thread_cpu_ns();
        let io = if whole_process {
            files.process_io.as_ref()
        } else {
            files.thread_io.as_ref()
        };
        let mut buf = [0u8; 512];
        let read_bytes = field_after(pread(io, &mut buf), b"\nread_bytes:");
        Usage {
            major_faults,
            read_bytes,
            cpu_ns,
            runqueue_ns,
        }
    })
}

/// Whether the page holding `addr` (an address inside a file map) is in
/// the page cache now, without reading it (`mincore` of that one page:
/// one system call, well under a microsecond, that faults nothing in);
/// `None` where the kernel cannot say (an address outside every map).
///
/// The kernel reports the page cache itself for a file the caller owns or
/// may write; for another's file (a read-only shared corpus) it reports
/// only the pages mapped in this process, so a page another process read
/// reads as absent until this one touches it: an undercount, never an
/// overcount.
pub fn page_resident(addr: *const u8) -> Option<bool> {
    let page = page_size();
    let start = (addr as usize) & !(page - 1);
    let mut vec = 0u8;
    // SAFETY: `mincore` reads no memory at `start`; it validates the range
    // against the process's maps (ENOMEM outside them) and writes one byte
    // per page of it (one page here) into `vec`.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, page, &raw mut vec) };
    (rc == 0).then_some(vec & 1 == 1)
}

fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf reads a constant of the system.
    *PAGE.get_or_init(|| {
        usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// Whether the calling thread's affinity mask allows `cpu`.
pub fn may_run_on(cpu: u32) -> bool {
    let Ok(cpu) = usize::try_from(cpu) else {
        return false;
    };
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: `sched_getaffinity` fills the zeroed set it is handed.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw mut set) == 0
            && libc::CPU_ISSET(cpu, &set)
    }
}

#[cfg(test)]
mod tests {
    use super::{major_faults, page_resident, usage};
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

    /// A spinning thread's CPU time grows with its wall time; a sleeping
    /// one's does not; bytes read by dropped pages show in `read_bytes`.
    #[test]
    fn cpu_time_and_bytes_read_are_attributed() {
        let u0 = usage(false);
        let t = std::time::Instant::now();
        let mut x = 0u64;
        // Spin until the kernel counted 20 ms of CPU (a loaded host may
        // keep the thread waiting: that wait is run-queue time, not CPU).
        while usage(false).since(u0).cpu_ns < 20_000_000 && t.elapsed().as_secs() < 10 {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        let spun = usage(false).since(u0);
        let wall = u64::try_from(t.elapsed().as_nanos()).unwrap();
        assert!(spun.cpu_ns >= 20_000_000, "{spun:?}");
        assert!(
            spun.cpu_ns + spun.runqueue_ns <= wall + 5_000_000,
            "{spun:?} in {wall} ns"
        );
        let u1 = usage(false);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = usage(false).since(u1);
        assert!(slept.cpu_ns < 10_000_000, "{slept:?}");

        let mut f = tempfile::NamedTempFile::new_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        f.write_all(&vec![3u8; 1 << 20]).unwrap();
        f.as_file().sync_all().unwrap();
        let fd = f.as_file().as_raw_fd();
        // SAFETY: plain advice on an open descriptor.
        unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        let before = usage(false);
        // SAFETY: `f` stays open and unmodified while mapped.
        let map = unsafe { memmap2::Mmap::map(f.as_file()).unwrap() };
        let sum: u64 = map.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 3 * 256);
        let read = usage(false).since(before);
        assert!(read.major_faults > 0, "{read:?}");
        assert!(read.read_bytes >= 4096, "{read:?}");
    }

    /// A page read through a map is resident; dropped from the page cache
    /// (and the map) it is not, and asking faults nothing back in; an
    /// address outside every map has no answer.
    #[test]
    fn residency_is_read_without_faulting_the_page_in() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![5u8; 16 * 4096]).unwrap();
        f.sync_all().unwrap();
        // SAFETY: `f` stays open and unmodified while mapped.
        let map = unsafe { memmap2::Mmap::map(&f).unwrap() };
        let sum: u64 = map.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert_eq!(sum, 5 * 16);
        assert_eq!(page_resident(&raw const map[4096 * 3 + 17]), Some(true));
        // SAFETY: plain advice on a map and an open descriptor we own.
        unsafe {
            libc::madvise(
                map.as_ptr() as *mut libc::c_void,
                map.len(),
                libc::MADV_DONTNEED,
            );
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
        let faults = major_faults(false);
        let resident = (0..16).filter(|p| page_resident(&raw const map[p * 4096]) == Some(true));
        assert_eq!(resident.count(), 0, "dropped pages read as resident");
        assert_eq!(major_faults(false), faults, "asking faulted a page in");
        assert_eq!(page_resident(std::ptr::null()), None);
    }

    /// A reading costs microseconds (two per batch): printed for the
    /// overhead note, bounded so a slow `/proc` path is caught.
    #[test]
    fn a_reading_costs_microseconds() {
        usage(false);
        let n = 2000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            std::hint::black_box(usage(false));
        }
        let each = t.elapsed() / n;
        println!("probes::usage: {each:?} per reading");
        assert!(each < std::time::Duration::from_micros(200), "{each:?}");
    }
}
