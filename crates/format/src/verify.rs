//! Full verification: payload checksums and the O(rows) content checks that
//! opening skips so that open time does not depend on the database size.
//!
//! [`Verify::Header`] (the default) opens in O(metadata); [`Verify::Full`]
//! (`verify="full"`) additionally runs [`Database::validate_contents`] and
//! hashes every payload. [`verify_database`] is `headwater verify`: the same
//! checks, reporting every corrupt file rather than stopping at the first.
//!
//! The open entry points that take a level ([`Database::open_with`],
//! [`Database::open_for`]) live here, above `database.rs`, whose
//! `Database::open` is the O(metadata) open these checks start from:
//! `database` never imports this module, so the two do not form a loop.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::database::Database;
use super::page_cache::PageCache;
use headwater_common::error::{Error, Result};

/// How much of a database is checked when it is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    /// Headers, section sizes and the metadata content hash: O(metadata).
    #[default]
    Header,
    /// Also every payload checksum and the graph/task contents: reads
    /// every byte of the database.
    Full,
}

/// What [`verify_database`] found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Binary files checked.
    pub files: usize,
    /// Payload bytes hashed.
    pub bytes: u64,
    /// One message per problem, each naming its file.
    pub errors: Vec<String>,
}

/// Check every file of the database in `dir`: headers (a failure there is
/// returned as the error), then every payload checksum and the content
/// checks, collecting one message per corrupt file. `progress(done, total)`
/// is called with payload bytes as they are hashed.
pub fn verify_database(dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport> {
    let db = Database::open(dir)?;
    let total: u64 = db.files().map(super::MappedFile::payload_bytes).sum();
    let mut report = VerifyReport::default();
    for f in db.files() {
        let base = report.bytes;
        if let Err(e) = f.verify_payload(&mut |done| progress(base + done, total)) {
            report.errors.push(e.to_string());
        }
        report.files += 1;
        report.bytes += f.payload_bytes();
    }
    report
        .errors
        .extend(db.content_errors().iter().map(ToString::to_string));
    Ok(report)
}

impl Database {
    /// Open `dir`; [`Verify::Full`] also hashes every payload and checks
    /// the graph and task contents (reads the whole database).
    pub fn open_with(dir: impl AsRef<Path>, verify: Verify) -> Result<Self> {
        Self::open_checked(dir.as_ref(), verify, false)
    }

    /// Open `dir` as the sampler does: checked as `verify` says, its maps
    /// advised huge pages unless `page_cache` is `Lazy`, then brought into
    /// the page cache as `page_cache` says.
    pub fn open_for(dir: impl AsRef<Path>, verify: Verify, page_cache: PageCache) -> Result<Self> {
        let db = Self::open_checked(dir.as_ref(), verify, page_cache != PageCache::Lazy)?;
        db.warm_page_cache(page_cache)?;
        Ok(db)
    }

    fn open_checked(dir: &Path, verify: Verify, huge_pages: bool) -> Result<Self> {
        let db = Self::open_headers(dir, huge_pages)?;
        if verify == Verify::Full {
            for f in db.files() {
                f.verify_payload(&mut |_| {})?;
            }
            db.validate_contents()?;
            // Every byte is checked: reads need not hash blocks again (and
            // a format-1 database's reads are then verified too).
            for f in db.files() {
                f.mark_verified();
            }
        }
        Ok(db)
    }

    /// The O(rows + edges + seeds) checks [`Verify::Full`] adds: CSR offsets
    /// monotone and in range, CSR targets and task anchors valid row ids,
    /// `row_table` agreeing with the metadata's table ranges. The first
    /// problem is the error.
    pub fn validate_contents(&self) -> Result<()> {
        match self.content_errors().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn content_errors(&self) -> Vec<Error> {
        let g = self.graph();
        let path = self.graph_file().path();
        let n = g.num_rows();
        let mut errors = Vec::new();
        for (what, offs, targets) in [
            ("fwd", g.fwd_offsets, g.fwd_targets),
            ("rev", g.rev_offsets, g.rev_targets),
        ] {
            if offs.first() != Some(&0)
                || offs.last().copied() != Some(targets.len() as u64)
                || offs.windows(2).any(|w| w[0] > w[1])
            {
                errors.push(Error::format(
                    path,
                    format!("{what}_offsets are not a valid CSR offset array"),
                ));
            }
            if let Some(bad) = targets.iter().find(|&&t| t as usize >= n) {
                errors.push(Error::format(
                    path,
                    format!("{what}_targets holds row {bad}, database has {n} rows"),
                ));
            }
        }
        for (t, &(lo, hi)) in g.table_rows.iter().enumerate() {
            let rows = g.row_table.get(lo as usize..hi as usize).unwrap_or(&[]);
            if rows.len() != (hi - lo) as usize || rows.iter().any(|&x| x as usize != t) {
                errors.push(Error::format(
                    path,
                    format!(
                        "row_table disagrees with table `{}` rows {lo}..{hi}",
                        self.metadata().tables[t].name
                    ),
                ));
            }
        }
        for (k, km) in self.metadata().tasks.iter().enumerate() {
            let task_path = self.task_path(k).unwrap_or(path);
            let Ok(v) = self.task_unchecked(k) else {
                continue;
            };
            let Some(&(lo, hi)) = g.table_rows.get(km.anchor_table as usize) else {
                errors.push(Error::format(
                    task_path,
                    format!("anchor table {} does not exist", km.anchor_table),
                ));
                continue;
            };
            if let Some(bad) = v.anchor_rows.iter().find(|&&r| r < lo || r >= hi) {
                errors.push(Error::format(
                    task_path,
                    format!(
                        "anchor row {bad} is not a row of anchor table {} ({lo}..{hi})",
                        km.anchor_table
                    ),
                ));
            }
        }
        errors
    }
}
