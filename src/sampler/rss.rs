//! Reading the process's memory (Linux `/proc/self/status`).
//!
//! The `max_rss_bytes` cap counts `RssAnon`: resident private anonymous
//! memory (heap, batches, scratch, the interpreter). It leaves out
//! `RssFile` — the memory-mapped database pages, which are shared between
//! processes and which the kernel can drop and re-read at any time — and
//! `RssShmem`. `VmRSS` (= all three) would trip the cap on data the page
//! cache could drop; PSS would still charge a share of the mapped pages.

/// A memory field of `/proc/self/status` (e.g. `"RssFile:"`), in bytes, or
/// `None` where the file or the field is unavailable.
pub fn status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Current RSS in bytes (`VmRSS`: private and mapped), or `None` where
/// `/proc/self/status` is unavailable.
pub fn current_rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// Resident private anonymous memory in bytes (`RssAnon`): what
/// `max_rss_bytes` caps. `None` where `/proc/self/status` is unavailable.
pub fn current_private_bytes() -> Option<u64> {
    status_bytes("RssAnon:")
}
