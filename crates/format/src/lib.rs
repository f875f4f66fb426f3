//! The preprocessed database on disk: one read-only directory, memory-mapped.
//!
//! # Layout (format version 2; version 1 is still read)
//!
//! ```text
//! DB_DIR/
//!   metadata.json               tables, columns, semantic types, stats, tasks,
//!                               format version, file digests, content hash
//!   graph.bin                   bidirectional CSR + dense row→table + row times
//!   tables/<t>.bin              one per table: column values + validity bitmaps
//!   tasks/<k>.bin               one per task: anchor rows, obs times, targets
//!   column_embeddings.bin       f16 [C, D]  (+ the embedded strings)
//!   categorical_embeddings.bin  f16 [Vc, D] (+ the embedded strings)
//!   text_embeddings.bin         f16 [Vt, D] (+ the embedded strings)
//! ```
//!
//! File names come from indices (`tables/0.bin`, `tasks/3.bin`), never from
//! user strings, so a table named `../../etc` cannot escape the directory.
//!
//! Rows of all tables share one global row-id space (`u32`): table `t` owns
//! `[row_offset[t], row_offset[t] + num_rows[t])`, tables in metadata order.
//!
//! `metadata.json`'s optional `stats_rule` ([`StatsRule`]) says which rows
//! the normalisation statistics come from: `cutoff_us`, the validation
//! cutoff after which no row feeds a statistic (absent: no time split), and
//! the `split_seed` / `split_ratios` under which a task target without
//! stored splits left its val/test seeds out. A column whose statistics
//! left values out records how many they came from (`stats.stats_count`).
//! Both are absent in databases written before the rule (statistics of
//! every row), which read as before.
//!
//! # Binary file header
//!
//! Every `.bin` file starts with this header (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0  | 8  | magic: `HWGRAPH\0`, `HWTABLE\0`, `HWTASK\0\0` or `HWEMBED\0` |
//! | 8  | 4  | format version (`u32`) |
//! | 12 | 4  | number of sections `n` (`u32`) |
//! | 16 | 8  | total file length in bytes (`u64`) |
//! | 24 | 8  | xxh3-64 of every byte after the header (`u64`) |
//! | 32 | 8  | xxh3-64 of bytes `0..32` followed by bytes `40..` up to the payload (section table and padding) (`u64`) |
//! | 40 | 8  | format 2: xxh3-64 of the block table (the last section); format 1: zero |
//! | 48 | 16·n | section table: `(offset u64, length u64)` per section |
//!
//! The payload starts at the first multiple of 64 after the section table and
//! every section starts on a 64-byte boundary (zero padding between), so any
//! section can be viewed in place as a slice of its element type.
//! [`MappedFile::open`] validates magic, version, length, section bounds,
//! alignment and the header checksum once, in O(header); afterwards reads
//! are slices. The whole-payload checksum is checked when the file is
//! written, by `headwater verify` ([`verify_database`]) and on open with
//! [`Verify::Full`] — never by a plain open, so opening costs the same for
//! any database size. Readers bounds-check every id that indexes memory
//! (see [`GraphView::table_of`]): a corrupt payload never panics or reads
//! out of bounds.
//!
//! # Verified reads: per-block checksums (format 2)
//!
//! A format-2 file ends with one more section than its kind lists below,
//! the **block table**: `shift: u64`, then the xxh3-64 of each block of
//! `1 << shift` bytes of the bytes from the payload start up to the block
//! table (every data section and its padding; the last block is short). Its
//! own xxh3-64 is header field 40, which the header checksum covers; open
//! hashes the table (8 bytes per block: 2 MiB per GiB of 4 KiB blocks,
//! hashed at memory speed) and checks that every data
//! section ends before it — still O(metadata), with no data byte read.
//!
//! Each open file keeps one bit per block, "checked". The sampler reads
//! through views ([`GraphView`], [`ColumnView::read`], [`EmbeddingRows`];
//! the column/category embeddings, which it reads whole, are checked whole
//! by the embedding accessors; a task's draws read through
//! [`Database::task_lazy`], whose `TaskView` accessors check the blocks of
//! the seeds they read, and [`Database::task`] checks a task whole for the
//! readers of whole sections) that,
//! before handing out a byte, load its block's bit (one relaxed atomic
//! load); the first read of a block hashes it against the table and sets
//! the bit. A block that fails is never marked: its readers record the
//! failure in the database's [`Integrity`] (the first one, naming the file,
//! the block and its byte range), and the batch builder checks that record
//! on the thread that built the batch, after its parallel parts joined,
//! before handing the batch on. So a batch whose bytes include a corrupt
//! block is never delivered: the stream stops with that `FormatError`.
//!
//! The shift is the file's own (a reader accepts 2^12..=2^30). The writer
//! uses [`RANDOM_BLOCK_SHIFT`] = 12, 4 KiB — one page — for the files the
//! sampler reads at random (the graph, the tables, the embeddings), so that
//! the first read of a block where the database does not fit in memory
//! hashes the page it faulted in and nothing more; and [`BLOCK_SHIFT`] =
//! 18, 256 KiB, for tasks, which were read whole when a sampler opened
//! (they are not any more: a draw reads its seeds' blocks, a seed list its
//! task's anchor rows or stored codes). (Databases written before
//! 2026-11-28 use 256 KiB everywhere and read as before.) The checksums are
//! read in place from the map, shared by every process of a host.
//!
//! Cost: writing hashes every byte twice (whole and per block); open adds
//! 8 bytes hashed per block (with 256 KiB blocks, 391 MiB TPC-H: 0.26 →
//! 0.31 ms median open); a block is hashed once per process, by its first
//! reader (about 0.1 ms per 256 KiB from the page cache: `headwater verify` hashes that 391 MiB
//! database in 0.15–0.25 s), so checking is spread over the first batches
//! that touch each block and costs at most one pass over the bytes actually
//! read — never over bytes no batch reads. Until a file has been read
//! whole, each read costs one relaxed load of its block's bit (a bit per
//! 4 KiB block: 32 KiB per GiB) inlined into the reader;
//! views are made per batch, and a view of a file whose every block is
//! checked carries no check at all. `headwater verify` and `verify="full"`
//! are unchanged (the whole-payload checksums; the block table is part of
//! the payload); after `verify="full"` every block is marked checked.
//!
//! Format-1 files (no block table) are still read: their reads cannot be
//! checked, so the first read of each block is counted in
//! `integrity/unverified_reads` (metric), unless the database was opened
//! with `verify="full"` (then 0). On format 2 that counter stays 0 and
//! `integrity/blocks_verified` counts the blocks checked so far.
//! Rebuilding the database with this version's `headwater preprocess`
//! upgrades it.
//!
//! The walk graph the sampler derives from a database with `examples`
//! (`walks/graph-KEY.bin`, docs/contexts.md) is checked the same way: a
//! table of 4 KiB-block checksums after its header, the header and table
//! hashed at open, each other block at its first read, into the same
//! `Integrity` (its blocks count in `integrity/blocks_verified`). A
//! corrupt block of it fails the batch alike; being derived, it is
//! rebuilt by deleting the database's `walks/` folder. The stored
//! rankings (`rankings/expected-KEY.bin`, `expected_store`) are checked
//! alike: their header, index and block table hashed at open, each 4 KiB
//! block of items at its first read; deleting `rankings/` computes them
//! again.
//!
//! # Sections
//!
//! `graph.bin` (N rows, E edges each way):
//! 0. `row_table: u16[N]` — table index of every row (dense lookup);
//! 1. `row_time: i64[N]` — row time in µs since the Unix epoch, `i64::MIN`
//!    when the table has no temporal column or the time is null;
//! 2. `fwd_offsets: u64[N+1]`, 3. `fwd_targets: u32[E]` — F→P: the parents a
//!    row references, in foreign-key column order;
//! 4. `rev_offsets: u64[N+1]`, 5. `rev_targets: u32[E]`, 6. `rev_times: i64[E]`
//!    — P→F: the children referencing a row, sorted by (child time, child id),
//!    `rev_times` holding each child's `row_time`, so "children visible at
//!    time T" is a prefix found by binary search without touching child rows.
//!
//! `tables/<t>.bin`: for the table's `j`-th stored column (the `slot` in
//! metadata), section `2j` holds the values and `2j+1` the validity bitmap
//! (`u8[ceil(N/8)]`, bit `i % 8` of byte `i / 8` set = row `i` not null).
//! Value types by semantic type: numerical `f32` (z-scored with the column's
//! mean/std), timestamp `i64` (raw µs; the 15-float encoding is computed at
//! sampling time from these and the database-wide stats), boolean `u8` (0/1),
//! categorical `u32` (global index into `categorical_embeddings.bin`), text
//! `u32` (global index into `text_embeddings.bin`). Null cells hold zero.
//! Identifier and ignored columns are not stored.
//!
//! `tasks/<k>.bin`: 0. `anchor_row: u32[n]` (global row id), 1. `obs_time:
//! i64[n]` (µs; `i64::MAX` for a non-temporal seed), 2. target values typed as
//! for table columns of the task's target semantic type, 3. target validity,
//! and, only when the task's metadata says `stored_splits: true`, 4. `split:
//! u8[n]`, each seed's split (0 train, 1 val, 2 test; any other code is
//! refused at open). A RelBench task stores the split of the label file each
//! row came from; every other task omits the section and is split by the hash
//! rule. No version bump: a database without the field (all earlier ones) is
//! still valid and means "hash split"; the field is omitted from the JSON
//! when false, so such databases keep their content hash.
//!
//! `*_embeddings.bin`: 0. `f16[N·D]` row-major, 1. `u64[N+1]` string offsets,
//! 2. UTF-8 bytes: the strings that were embedded (category labels, column
//! names, text values), kept for inspection and round-trip checks.
//!
//! # Content hash
//!
//! `metadata.json` records every file's length and payload checksum, and a
//! `content_hash`: xxh3-128 over the canonical JSON of the metadata (with the
//! hash field empty). Opening recomputes it and compares each file's header
//! checksum field and length with the recorded digest, so a directory whose
//! files were swapped, truncated or had their metadata edited is rejected
//! (payload edits are caught block by block as they are read, and whole by
//! `verify`); samplers on different ranks can
//! compare hashes to prove they read the same snapshot.

mod blocks;
mod database;
mod header;
mod metadata;
mod page_cache;
mod split;
mod stage;
mod verify;
mod views;
mod writer;

pub use blocks::{Blocks, BLOCK_SHIFTS};
pub use blocks::{Integrity, BLOCK_SHIFT, RANDOM_BLOCK_SHIFT};
pub use database::{Database, EmbeddingKind};
pub use header::{FileKind, MappedFile, FORMAT_VERSION, MIN_READ_VERSION};
pub use metadata::{
    ColumnMeta, ColumnStats, EmbedderMeta, FileDigest, ForeignKeyMeta, Metadata, SemanticType,
    StatsRule, TableMeta, TaskMeta, TimestampStats, UnstoredColumn,
};
pub use page_cache::{advise_opened, advise_opening, advise_range, memory_limit_bytes, PageCache};
pub use split::Split;
pub use stage::{stage, Staged, STAGED_MARKER};
pub use verify::{verify_database, Verify, VerifyReport};
pub use views::{ColumnValues, ColumnView, EmbeddingRows, GraphView, TableView, TaskView};
pub use writer::{align_up, FileWriter, Section};

/// Pack a slice of booleans (`0`/non-zero bytes) into a validity bitmap.
pub fn pack_bits(valid: impl ExactSizeIterator<Item = bool>) -> Vec<u8> {
    let mut out = vec![0u8; valid.len().div_ceil(8)];
    for (i, v) in valid.enumerate() {
        if v {
            out[i >> 3] |= 1 << (i & 7);
        }
    }
    out
}

/// Is bit `i` of a validity bitmap set?
#[inline]
pub fn bit(bitmap: &[u8], i: usize) -> bool {
    bitmap[i >> 3] & (1 << (i & 7)) != 0
}
