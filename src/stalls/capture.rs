//! Taking the stack of another thread (see the parent module's doc for
//! why it is safe): the real-time signal's handler, which walks the
//! interrupted thread's own stack into a preallocated buffer, the monitor's
//! side that sends the signal and waits, the symbolisation (on the
//! monitor's thread, never in the handler) and the request for Python's
//! `faulthandler` stacks.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Frames kept per captured stack.
const MAX_FRAMES: usize = 96;
/// How long the monitor waits for a signalled thread to record its stack.
const CAPTURE_WAIT: Duration = Duration::from_millis(500);
/// The frame buffer the signal handler writes into.
struct Capture {
    tid: AtomicI32,
    frames: [AtomicUsize; MAX_FRAMES],
    len: AtomicUsize,
    done: AtomicBool,
}

/// The capture in progress (null: none). Only the monitor of one watch at
/// a time sets it ([`CAPTURE_LOCK`]).
static CAPTURE: AtomicPtr<Capture> = AtomicPtr::new(std::ptr::null_mut());
static CAPTURE_LOCK: Mutex<()> = Mutex::new(());
/// The signal the handler is installed on (0: none could be).
static SIGNAL: OnceLock<i32> = OnceLock::new();

pub(super) fn gettid() -> i32 {
    // SAFETY: `gettid` takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

extern "C" fn on_signal(_sig: libc::c_int) {
    // SAFETY: reads and restores the calling thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    let cap = CAPTURE.load(Acquire);
    if !cap.is_null() {
        // SAFETY: the monitor keeps the capture alive until `done` is set
        // or it has cleared `CAPTURE` and waited (see `capture_stack`).
        let cap = unsafe { &*cap };
        if cap.tid.load(Acquire) == gettid() {
            let mut n = 0;
            // SAFETY: the unsynchronised walk is the reason for this
            // handler; it allocates nothing (see the module doc).
            unsafe {
                backtrace::trace_unsynchronized(|f| {
                    cap.frames[n].store(f.ip() as usize, Relaxed);
                    n += 1;
                    n < MAX_FRAMES
                });
            }
            cap.len.store(n, Relaxed);
            cap.done.store(true, Release);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Install the handler once per process; the signal, or 0 when its
/// disposition was not the default (someone else's handler is kept).
fn install() -> i32 {
    *SIGNAL.get_or_init(|| {
        let sig = libc::SIGRTMIN() + 4;
        // SAFETY: reads the current disposition into a zeroed struct, then
        // installs a handler that only touches atomics and the unwinder.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &raw mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                return 0;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&raw mut sa.sa_mask);
            if libc::sigaction(sig, &raw const sa, std::ptr::null_mut()) != 0 {
                return 0;
            }
        }
        sig
    })
}

/// The stuck thread's frames (raw addresses), or why none were taken.
pub(super) fn capture_stack(tid: i32) -> std::result::Result<Vec<usize>, String> {
    let sig = install();
    if sig == 0 {
        return Err("no stack taken: the capture signal has another handler".into());
    }
    let _one = CAPTURE_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cap = Box::new(Capture {
        tid: AtomicI32::new(tid),
        frames: std::array::from_fn(|_| AtomicUsize::new(0)),
        len: AtomicUsize::new(0),
        done: AtomicBool::new(false),
    });
    let ptr: *const Capture = &raw const *cap;
    CAPTURE.store(ptr.cast_mut(), Release);
    // SAFETY: a thread-directed signal to a thread of this process.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) };
    let t0 = Instant::now();
    while rc == 0 && !cap.done.load(Acquire) && t0.elapsed() < CAPTURE_WAIT {
        std::thread::sleep(Duration::from_millis(1));
    }
    CAPTURE.store(std::ptr::null_mut(), Release);
    if !cap.done.load(Acquire) {
        // The handler may still be running on the target: keep the buffer
        // alive rather than free it under it (a bounded leak per failure).
        std::mem::forget(cap);
        return Err(if rc == 0 {
            format!("no stack taken: thread {tid} did not answer within {CAPTURE_WAIT:?}")
        } else {
            format!(
                "no stack taken: tgkill({tid}) failed: {}",
                std::io::Error::last_os_error()
            )
        });
    }
    let n = cap.len.load(Relaxed);
    Ok(cap.frames[..n].iter().map(|f| f.load(Relaxed)).collect())
}

/// Symbolised frames, one line each, and the innermost frame of headwater's
/// own code outside this module (the function the work is stuck in, with
/// its file and line), if any. The frames of the handler itself come first
/// and are left out.
pub(super) fn symbolise(frames: &[usize]) -> (Vec<String>, Option<String>) {
    // headwater's own code: the core's `src/` and each floor's
    // `crates/*/src/` of this workspace.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/");
    let this = concat!(env!("CARGO_MANIFEST_DIR"), "/src/stalls/");
    let mut lines = Vec::new();
    let mut stuck_in = None;
    let mut in_handler = true;
    for (i, &ip) in frames.iter().enumerate() {
        let mut names = Vec::new();
        backtrace::resolve(ip as *mut std::ffi::c_void, |sym| {
            let name = sym
                .name()
                .map_or_else(|| format!("{ip:#x}"), |n| format!("{n:#}"));
            let file = sym.filename().map(|f| f.display().to_string());
            names.push((name, file, sym.lineno()));
        });
        if names.is_empty() {
            names.push((format!("{ip:#x}"), None, None));
        }
        if in_handler {
            // Everything up to the handler's own frame is the capture.
            in_handler = !names.iter().any(|(n, ..)| n.contains("on_signal"));
            continue;
        }
        for (name, file, line) in names {
            let place = match (&file, line) {
                (Some(f), Some(l)) => format!(" at {f}:{l}"),
                _ => String::new(),
            };
            let ours = file
                .as_deref()
                .is_some_and(|f| ours_file(root, f) && !f.starts_with(this));
            if stuck_in.is_none() && ours {
                stuck_in = Some(format!("{name}{place}"));
            }
            lines.push(format!("{i:>4}: {name}{place}"));
        }
    }
    if in_handler {
        // No handler frame found (an unusual unwinder): keep every frame.
        return symbolise_all(frames);
    }
    (lines, stuck_in)
}

/// Whether `file` is a source file of this workspace under `root`: the
/// core's `src/` or a floor's `crates/NAME/src/`.
fn ours_file(root: &str, file: &str) -> bool {
    let Some(rel) = file.strip_prefix(root) else {
        return false;
    };
    rel.starts_with("src/")
        || rel
            .strip_prefix("crates/")
            .and_then(|r| r.split_once('/'))
            .is_some_and(|(_, rest)| rest.starts_with("src/"))
}

/// Every frame, unfiltered (the fallback of [`symbolise`]).
fn symbolise_all(frames: &[usize]) -> (Vec<String>, Option<String>) {
    let lines = frames
        .iter()
        .enumerate()
        .map(|(i, &ip)| {
            let mut name = format!("{ip:#x}");
            backtrace::resolve(ip as *mut std::ffi::c_void, |sym| {
                if let Some(n) = sym.name() {
                    name = format!("{n:#}");
                }
            });
            format!("{i:>4}: {name}")
        })
        .collect();
    (lines, None)
}

/// The signal Python's `faulthandler` may be registered on (by the
/// trainer) to dump its threads' stacks beside a stall dump.
pub const PYTHON_STACKS_SIGNAL: i32 = libc::SIGUSR2;

/// Ask Python's `faulthandler` for its threads' stacks: only when a
/// handler is installed on [`PYTHON_STACKS_SIGNAL`] (the default action
/// would end the process).
pub(super) fn python_stacks() {
    // SAFETY: reads the disposition into a zeroed struct.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(PYTHON_STACKS_SIGNAL, std::ptr::null(), &raw mut old) == 0
            && old.sa_sigaction != libc::SIG_DFL
            && old.sa_sigaction != libc::SIG_IGN
        {
            libc::kill(libc::getpid(), PYTHON_STACKS_SIGNAL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ours_file;

    #[test]
    fn our_frames_are_the_cores_and_every_floors_sources() {
        let root = "/w/headwater/";
        assert!(ours_file(root, "/w/headwater/src/context/bfs.rs"));
        assert!(ours_file(root, "/w/headwater/crates/format/src/views.rs"));
        assert!(!ours_file(root, "/w/headwater/crates/format/tests/x.rs"));
        assert!(!ours_file(root, "/w/headwater/tests/integration/main.rs"));
        assert!(!ours_file(root, "/home/u/.cargo/registry/src/rayon/lib.rs"));
    }
}
