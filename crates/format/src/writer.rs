//! Writing one binary file: header, aligned sections, checksums.
//!
//! Sections are streamed to disk (never the whole file in memory), hashed
//! as they go, whole and per block; the block table follows them as the last
//! section, and the header is written last, once the checksums are known.
//! The writer produces exactly the layout documented in [`crate`].

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use super::blocks::{BLOCK_SHIFT, RANDOM_BLOCK_SHIFT};
use super::header::{FileKind, ALIGN, FIXED_HEADER, FORMAT_VERSION, SECTION_ENTRY};
use headwater_common::error::{Error, Result};

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
    /// The block being hashed, its bytes so far, and the finished blocks'
    /// checksums.
    block: Xxh3,
    block_fill: usize,
    block_sums: Vec<u64>,
    /// Log2 of this file's block size: [`RANDOM_BLOCK_SHIFT`] for files the
    /// sampler reads at random, [`BLOCK_SHIFT`] for tasks (read whole).
    block_shift: u32,
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
            block: Xxh3::new(),
            block_fill: 0,
            block_sums: Vec::new(),
            block_shift: match kind {
                FileKind::Task => BLOCK_SHIFT,
                FileKind::Graph | FileKind::Table | FileKind::Embeddings => RANDOM_BLOCK_SHIFT,
            },
        };
        // The data sections and the block table.
        let header_len = align_up(FIXED_HEADER + (num_sections + 1) * SECTION_ENTRY, ALIGN);
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
        let size = 1usize << self.block_shift;
        let mut rest = bytes;
        while !rest.is_empty() {
            let take = rest.len().min(size - self.block_fill);
            self.block.update(&rest[..take]);
            self.block_fill += take;
            rest = &rest[take..];
            if self.block_fill == size {
                self.block_sums.push(self.block.digest());
                self.block.reset();
                self.block_fill = 0;
            }
        }
        Ok(())
    }

    /// Close the last block and append the block table (the block shift,
    /// then each block's xxh3-64) as the last section; returns its xxh3-64.
    fn block_table(&mut self) -> Result<u64> {
        let pad = align_up(self.pos as usize, ALIGN) - self.pos as usize;
        self.put(&ZEROS[..pad])?;
        if self.block_fill > 0 {
            self.block_sums.push(self.block.digest());
        }
        let mut table = Vec::with_capacity(8 * (self.block_sums.len() + 1));
        table.extend_from_slice(&u64::from(self.block_shift).to_le_bytes());
        for s in &self.block_sums {
            table.extend_from_slice(&s.to_le_bytes());
        }
        self.table.push((self.pos, table.len() as u64));
        self.out
            .write_all(&table)
            .map_err(|e| Error::io(&self.path, e))?;
        self.hasher.update(&table);
        self.pos += table.len() as u64;
        Ok(xxhash_rust::xxh3::xxh3_64(&table))
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
        let block_table_sum = self.block_table()?;
        let payload_checksum = self.hasher.digest();
        let sections = self.table.len();
        let mut head = Vec::with_capacity(FIXED_HEADER + sections * SECTION_ENTRY);
        head.extend_from_slice(self.kind.magic());
        head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        head.extend_from_slice(&(sections as u32).to_le_bytes());
        head.extend_from_slice(&self.pos.to_le_bytes());
        head.extend_from_slice(&payload_checksum.to_le_bytes());
        let mut table = Vec::with_capacity(sections * SECTION_ENTRY);
        for (off, len) in &self.table {
            table.extend_from_slice(&off.to_le_bytes());
            table.extend_from_slice(&len.to_le_bytes());
        }
        let block_table_sum = block_table_sum.to_le_bytes();
        let header_len = align_up(FIXED_HEADER + table.len(), ALIGN);
        let padding = vec![0u8; header_len - FIXED_HEADER - table.len()];
        let mut h = Xxh3::new();
        h.update(&head);
        h.update(&block_table_sum);
        h.update(&table);
        h.update(&padding);
        head.extend_from_slice(&h.digest().to_le_bytes());
        head.extend_from_slice(&block_table_sum);
        head.extend_from_slice(&table);
        self.out.flush().map_err(io)?;
        let mut file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.write_all(&head).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok((self.pos, payload_checksum))
    }
}
