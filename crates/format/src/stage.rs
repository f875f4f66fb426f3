//! Staging a database to node-local disk (`stage_dir`): the copy a corpus
//! on a network file system is read from, made once per host.
//!
//! `stage(src, stage_dir)` copies the database folder `src` to
//! `stage_dir/<folder>-<content hash>/` and returns that path. The copy is
//! made in `.<folder>-<hash>.partial`, checked with every payload checksum
//! ([`Verify::Full`]: a torn or corrupt copy is never used), marked with a
//! `.staged` file holding the content hash, and renamed into place, so a
//! folder without its marker is never read. The ranks of a host share it:
//! an exclusive `flock` on `.<folder>-<hash>.lock` makes one rank copy while
//! the others wait and then find the marker. A copy cut off (a preempted
//! node) resumes: files already in the partial folder at their full size
//! are kept, the rest copied again, and the whole is verified as before. A
//! new snapshot (another content hash) is staged beside the old one.
//!
//! Before copying, the free space of `stage_dir` must hold the database: a
//! clear error names the key, the folder and the bytes needed and free.

use std::fs;
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::{Database, Verify};
use headwater_common::error::{Error, Result};

/// The marker file of a complete, verified copy (holds the content hash).
pub const STAGED_MARKER: &str = ".staged";

/// What [`stage`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// The staged copy (what the sampler opens).
    pub path: PathBuf,
    /// Bytes copied by this call (0 when the copy was already there).
    pub copied_bytes: u64,
}

/// Copy the database at `src` into `stage_dir` (once per host; see the
/// module docs) and return where it is.
pub fn stage(src: &Path, stage_dir: &Path) -> Result<Staged> {
    let hash = content_hash_of(src)?;
    let folder = src
        .file_name()
        .map_or_else(|| "db".to_string(), |n| n.to_string_lossy().into_owned());
    let short: String = hash
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect();
    let key = format!("{folder}-{short}");
    let dest = stage_dir.join(&key);
    fs::create_dir_all(stage_dir).map_err(|e| Error::io(stage_dir, e))?;
    if is_staged(&dest, &hash) {
        return Ok(Staged {
            path: dest,
            copied_bytes: 0,
        });
    }
    let lock_path = stage_dir.join(format!(".{key}.lock"));
    let lock = fs::File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
    // SAFETY: flock on a descriptor we own; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(Error::io(&lock_path, std::io::Error::last_os_error()));
    }
    if is_staged(&dest, &hash) {
        return Ok(Staged {
            path: dest,
            copied_bytes: 0,
        });
    }
    let files = files_of(src)?;
    let need: u64 = files.iter().map(|(_, n)| n).sum();
    let partial = stage_dir.join(format!(".{key}.partial"));
    let have: u64 = files
        .iter()
        .filter(|(rel, n)| fs::metadata(partial.join(rel)).is_ok_and(|m| m.len() == *n))
        .map(|(_, n)| n)
        .sum();
    let free = free_bytes(stage_dir)?;
    if need - have > free {
        return Err(Error::config(
            "stage_dir",
            format!(
                "{} has {free} bytes free; staging database `{folder}` needs {} more \
                 ({need} bytes in all): free space, or set stage_dir elsewhere",
                stage_dir.display(),
                need - have
            ),
        ));
    }
    let mut copied_bytes = 0;
    for (rel, n) in &files {
        let (from, to) = (src.join(rel), partial.join(rel));
        if fs::metadata(&to).is_ok_and(|m| m.len() == *n) {
            continue; // copied before a cut-off run stopped
        }
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        fs::copy(&from, &to).map_err(|e| Error::io(&to, e))?;
        copied_bytes += n;
    }
    if let Err(e) = Database::open_with(&partial, Verify::Full) {
        // Never kept: the next attempt copies afresh.
        let _ = fs::remove_dir_all(&partial);
        return Err(e);
    }
    let marker = partial.join(STAGED_MARKER);
    let mut m = fs::File::create(&marker).map_err(|e| Error::io(&marker, e))?;
    m.write_all(hash.as_bytes())
        .and_then(|()| m.sync_all())
        .map_err(|e| Error::io(&marker, e))?;
    if dest.exists() {
        // An unmarked leftover (never read): replaced.
        fs::remove_dir_all(&dest).map_err(|e| Error::io(&dest, e))?;
    }
    fs::rename(&partial, &dest).map_err(|e| Error::io(&dest, e))?;
    Ok(Staged {
        path: dest,
        copied_bytes,
    })
}

fn is_staged(dest: &Path, hash: &str) -> bool {
    fs::read_to_string(dest.join(STAGED_MARKER)).is_ok_and(|h| h == hash)
}

/// The `content_hash` of `src/metadata.json`.
fn content_hash_of(src: &Path) -> Result<String> {
    if !src.is_dir() {
        return Err(Error::format(
            src,
            "not a directory (expected a headwater database)",
        ));
    }
    let path = src.join("metadata.json");
    let text = fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::format(&path, e.to_string()))?;
    v["content_hash"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::format(&path, "no `content_hash`"))
}

/// Every regular file under `src` (relative path, size), staging markers
/// excluded.
fn files_of(src: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let dir = src.join(&rel);
        for entry in fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let meta = entry.metadata().map_err(|e| Error::io(entry.path(), e))?;
            let name = rel.join(entry.file_name());
            if meta.is_dir() {
                dirs.push(name);
            } else if meta.is_file() && entry.file_name() != STAGED_MARKER {
                out.push((name, meta.len()));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn free_bytes(dir: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::config("stage_dir", format!("{} holds a NUL byte", dir.display())))?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `s` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &raw mut s) } != 0 {
        return Err(Error::io(dir, std::io::Error::last_os_error()));
    }
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/golden_v1")
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hw-stage-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    /// The staged copy removed and an empty partial folder in its place:
    /// a copy cut off before any file was written.
    fn cut_off(staged: &Staged) -> PathBuf {
        fs::remove_dir_all(&staged.path).unwrap();
        let key = staged.path.file_name().unwrap().to_string_lossy();
        let partial = staged.path.with_file_name(format!(".{key}.partial"));
        fs::create_dir_all(&partial).unwrap();
        partial
    }

    #[test]
    fn stages_once_verified_and_resumes_a_cut_off_copy() {
        let dir = tmp("once");
        let first = stage(&golden(), &dir).unwrap();
        assert!(first.copied_bytes > 0 && first.path.join(STAGED_MARKER).exists());
        Database::open_with(&first.path, Verify::Full).unwrap();
        let again = stage(&golden(), &dir).unwrap();
        assert_eq!(
            (again.path.clone(), again.copied_bytes),
            (first.path.clone(), 0)
        );
        // A cut-off copy: the partial folder with some files; the next call
        // keeps those and copies the rest.
        let partial = cut_off(&first);
        fs::copy(golden().join("graph.bin"), partial.join("graph.bin")).unwrap();
        let resumed = stage(&golden(), &dir).unwrap();
        let graph = fs::metadata(golden().join("graph.bin")).unwrap().len();
        assert_eq!(resumed.copied_bytes, first.copied_bytes - graph);
        Database::open_with(&resumed.path, Verify::Full).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_copy_is_never_marked() {
        let dir = tmp("corrupt");
        let first = stage(&golden(), &dir).unwrap();
        // A torn file of the full size left in the partial folder.
        let partial = cut_off(&first);
        let mut bytes = fs::read(golden().join("graph.bin")).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xFF;
        fs::write(partial.join("graph.bin"), bytes).unwrap();
        let e = stage(&golden(), &dir).unwrap_err().to_string();
        assert!(e.contains("graph.bin"), "{e}");
        assert!(!first.path.exists() && !partial.exists());
        // The next attempt copies afresh and succeeds.
        stage(&golden(), &dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
