//! Writing one binary file: header, aligned sections, checksums.
//!
//! Sections are streamed to disk (never the whole file in memory); the header
//! is written last, once the payload checksum is known. The writer produces
//! exactly the layout documented in [`crate::format`].

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use super::header::{FileKind, ALIGN, FIXED_HEADER, FORMAT_VERSION, SECTION_ENTRY};
use crate::error::{Error, Result};

pub use super::header::align_up;

/// One section's bytes, borrowed.
pub struct Section<'a>(pub &'a [u8]);

impl<'a> Section<'a> {
    /// The bytes of a slice of plain values.
    pub fn of<T: bytemuck::Pod>(data: &'a [T]) -> Self {
        Section(bytemuck::cast_slice(data))
    }
}

/// Writes a binary file section by section.
pub struct FileWriter {
    path: PathBuf,
    out: BufWriter<File>,
    kind: FileKind,
    num_sections: usize,
    table: Vec<(u64, u64)>,
    pos: u64,
    hasher: Xxh3,
}

const ZEROS: [u8; ALIGN] = [0; ALIGN];

impl FileWriter {
    /// Create `path` for a `kind` file that will hold exactly `num_sections`.
    pub fn create(path: &Path, kind: FileKind, num_sections: usize) -> Result<Self> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        let mut w = FileWriter {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(1 << 20, file),
            kind,
            num_sections,
            table: Vec::with_capacity(num_sections),
            pos: 0,
            hasher: Xxh3::new(),
        };
        let header_len = align_up(FIXED_HEADER + num_sections * SECTION_ENTRY, ALIGN);
        w.out
            .write_all(&vec![0u8; header_len])
            .map_err(|e| Error::io(path, e))?;
        w.pos = header_len as u64;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .map_err(|e| Error::io(&self.path, e))?;
        self.hasher.update(bytes);
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Append the next section (64-byte aligned).
    pub fn section(&mut self, s: Section<'_>) -> Result<()> {
        assert!(
            self.table.len() < self.num_sections,
            "more sections than declared"
        );
        let pad = align_up(self.pos as usize, ALIGN) - self.pos as usize;
        self.put(&ZEROS[..pad])?;
        self.table.push((self.pos, s.0.len() as u64));
        // Hash and write in large chunks.
        for chunk in s.0.chunks(1 << 22) {
            self.put(chunk)?;
        }
        Ok(())
    }

    /// Start the next section (64-byte aligned) whose bytes follow in any
    /// number of [`append`](Self::append) calls: the same file as one
    /// [`section`](Self::section) call with their concatenation.
    pub fn begin_section(&mut self) -> Result<()> {
        assert!(
            self.table.len() < self.num_sections,
            "more sections than declared"
        );
        let pad = align_up(self.pos as usize, ALIGN) - self.pos as usize;
        self.put(&ZEROS[..pad])?;
        self.table.push((self.pos, 0));
        Ok(())
    }

    /// Append bytes to the section begun last.
    pub fn append(&mut self, s: Section<'_>) -> Result<()> {
        let last = self.table.len().checked_sub(1).expect("a section begun");
        self.table[last].1 += s.0.len() as u64;
        for chunk in s.0.chunks(1 << 22) {
            self.put(chunk)?;
        }
        Ok(())
    }

    /// Write the header and close the file; returns (file length, payload checksum).
    pub fn finish(mut self) -> Result<(u64, u64)> {
        assert_eq!(
            self.table.len(),
            self.num_sections,
            "fewer sections than declared"
        );
        let path = self.path.clone();
        let io = |e| Error::io(&path, e);
        let payload_checksum = self.hasher.digest();
        let mut head = Vec::with_capacity(FIXED_HEADER + self.num_sections * SECTION_ENTRY);
        head.extend_from_slice(self.kind.magic());
        head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        head.extend_from_slice(&(self.num_sections as u32).to_le_bytes());
        head.extend_from_slice(&self.pos.to_le_bytes());
        head.extend_from_slice(&payload_checksum.to_le_bytes());
        let mut table = Vec::with_capacity(self.num_sections * SECTION_ENTRY);
        for (off, len) in &self.table {
            table.extend_from_slice(&off.to_le_bytes());
            table.extend_from_slice(&len.to_le_bytes());
        }
        let reserved = 0u64.to_le_bytes();
        let header_len = align_up(FIXED_HEADER + table.len(), ALIGN);
        let padding = vec![0u8; header_len - FIXED_HEADER - table.len()];
        let mut h = Xxh3::new();
        h.update(&head);
        h.update(&reserved);
        h.update(&table);
        h.update(&padding);
        head.extend_from_slice(&h.digest().to_le_bytes());
        head.extend_from_slice(&reserved);
        head.extend_from_slice(&table);
        self.out.flush().map_err(io)?;
        let mut file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&head).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok((self.pos, payload_checksum))
    }
}
