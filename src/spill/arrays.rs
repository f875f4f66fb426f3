//! Scratch arrays in shared, writable maps of files the preprocessor
//! creates and deletes: their pages are page-cache pages, which the kernel
//! writes back and drops under memory pressure, so they cost the process no
//! private (anonymous) memory whatever their size. [`SpillArray`] has a
//! fixed length; [`SpillVec`] grows like a `Vec`.

use std::fs::{File, OpenOptions};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// A new scratch file at `path` (replaced if it exists), read-write.
fn scratch_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| Error::io(path, e))
}

/// A shared map of all of `file`, sized to hold `len` values of `T` (at
/// least one, so the map is never empty).
fn map_file<T>(file: &File, path: &Path, len: usize) -> Result<MmapMut> {
    let bytes = len.max(1) * std::mem::size_of::<T>();
    file.set_len(bytes as u64).map_err(|e| Error::io(path, e))?;
    // SAFETY: the file is this process's private scratch file, created by
    // `scratch_file` and removed on drop; nothing else maps or truncates it
    // while this map lives.
    unsafe { MmapMut::map_mut(file) }.map_err(|e| Error::io(path, e))
}

/// A zero-initialised array of `T` in a shared, writable map of a scratch
/// file (deleted on drop). Its pages are page-cache pages: the kernel writes
/// them back and drops them under memory pressure, so an array of any size
/// costs the process no private (anonymous) memory — the preprocessor's
/// out-of-core arrays for the O(rows + edges) parts of building the graph.
pub struct SpillArray<T> {
    map: MmapMut,
    len: usize,
    path: PathBuf,
    _file: File,
    _t: PhantomData<T>,
}

impl<T: bytemuck::Pod> SpillArray<T> {
    /// `len` zeros in a new file at `path` (created sparse; replaced if it
    /// exists).
    pub fn zeroed(path: &Path, len: usize) -> Result<Self> {
        let file = scratch_file(path)?;
        let map = map_file::<T>(&file, path, len)?;
        Ok(SpillArray {
            map,
            len,
            path: path.to_path_buf(),
            _file: file,
            _t: PhantomData,
        })
    }
}

impl<T: bytemuck::Pod> Deref for SpillArray<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // The map is page-aligned, so the cast cannot fail on alignment.
        &bytemuck::cast_slice(&self.map[..])[..self.len]
    }
}

impl<T: bytemuck::Pod> DerefMut for SpillArray<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.map[..])[..self.len]
    }
}

impl<T> Drop for SpillArray<T> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A growable array of `T`: in memory ([`SpillVec::in_memory`]), or in a
/// scratch file's shared map ([`SpillVec::in_file`]) that is remapped as it
/// doubles. The file is deleted on drop.
pub struct SpillVec<T> {
    store: Store<T>,
}

enum Store<T> {
    Memory(Vec<T>),
    File {
        /// `None` until the first value (a map cannot be empty).
        map: Option<MmapMut>,
        len: usize,
        /// Values the file holds room for.
        cap: usize,
        file: File,
        path: PathBuf,
    },
}

impl<T: bytemuck::Pod> SpillVec<T> {
    /// An empty vector in private memory.
    pub fn in_memory() -> Self {
        SpillVec {
            store: Store::Memory(Vec::new()),
        }
    }

    /// An empty vector in a new scratch file at `path`.
    pub fn in_file(path: &Path) -> Result<Self> {
        Ok(SpillVec {
            store: Store::File {
                map: None,
                len: 0,
                cap: 0,
                file: scratch_file(path)?,
                path: path.to_path_buf(),
            },
        })
    }

    /// Append the values of `xs`.
    pub fn extend_from_slice(&mut self, xs: &[T]) -> Result<()> {
        match &mut self.store {
            Store::Memory(v) => v.extend_from_slice(xs),
            Store::File { .. } => {
                let at = self.len();
                self.grow_to(at + xs.len())?;
                self[at..].copy_from_slice(xs);
            }
        }
        Ok(())
    }

    /// Append `x`.
    pub fn push(&mut self, x: T) -> Result<()> {
        self.extend_from_slice(std::slice::from_ref(&x))
    }

    /// Keep the first `len` values (no-op if there are fewer).
    pub fn truncate(&mut self, len: usize) {
        match &mut self.store {
            Store::Memory(v) => v.truncate(len),
            Store::File { len: l, .. } => *l = (*l).min(len),
        }
    }

    /// Exactly `len` values, each `value`.
    pub fn refill(&mut self, len: usize, value: T) -> Result<()> {
        self.truncate(0);
        match &mut self.store {
            Store::Memory(v) => v.resize(len, value),
            Store::File { .. } => {
                self.grow_to(len)?;
                self[..].fill(value);
            }
        }
        Ok(())
    }

    /// Set the length to `len` (growing the file by doubling); values past
    /// the old length are unspecified until written.
    fn grow_to(&mut self, len: usize) -> Result<()> {
        let Store::File {
            map,
            len: l,
            cap,
            file,
            path,
        } = &mut self.store
        else {
            unreachable!("only a file store grows this way")
        };
        if len > *cap {
            // Page-sized at least, then doubling: appends cost amortised O(1)
            // remaps (a remap moves no data: the pages stay in the cache).
            let min = 4096 / std::mem::size_of::<T>().max(1);
            let new_cap = len.max(2 * *cap).max(min);
            *map = None;
            *map = Some(map_file::<T>(file, path, new_cap)?);
            *cap = new_cap;
        }
        *l = len;
        Ok(())
    }
}

impl<T: bytemuck::Pod> Deref for SpillVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.store {
            Store::Memory(v) => v,
            Store::File { map: None, .. } => &[],
            // The map is page-aligned, so the cast cannot fail on alignment.
            Store::File {
                map: Some(m), len, ..
            } => &bytemuck::cast_slice(&m[..])[..*len],
        }
    }
}

impl<T: bytemuck::Pod> DerefMut for SpillVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.store {
            Store::Memory(v) => v,
            Store::File { map: None, .. } => &mut [],
            Store::File {
                map: Some(m), len, ..
            } => &mut bytemuck::cast_slice_mut(&mut m[..])[..*len],
        }
    }
}

impl<T> Drop for SpillVec<T> {
    fn drop(&mut self) {
        if let Store::File { map, path, .. } = &mut self.store {
            *map = None;
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SpillVec;

    #[test]
    fn a_file_vector_grows_truncates_and_fills_like_a_vec() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.spill");
        let mut f = SpillVec::<u64>::in_file(&path).unwrap();
        let mut m = SpillVec::<u64>::in_memory();
        let mut want = Vec::new();
        assert!(f.is_empty());
        for i in 0..20_000u64 {
            if i % 3 == 0 {
                let xs = [i, i * 7, i ^ 0xdead];
                f.extend_from_slice(&xs).unwrap();
                m.extend_from_slice(&xs).unwrap();
                want.extend_from_slice(&xs);
            } else {
                f.push(i).unwrap();
                m.push(i).unwrap();
                want.push(i);
            }
            if i % 4999 == 4998 {
                let keep = want.len() / 2;
                f.truncate(keep);
                m.truncate(keep);
                want.truncate(keep);
            }
        }
        assert_eq!(&f[..], &want[..]);
        assert_eq!(&m[..], &want[..]);
        f[5] = 99;
        assert_eq!(f[5], 99);
        f.refill(70_000, u64::MAX).unwrap();
        assert_eq!(f.len(), 70_000);
        assert!(f.iter().all(|&x| x == u64::MAX));
        assert!(path.exists());
        drop(f);
        assert!(!path.exists(), "the scratch file is deleted on drop");
    }
}
