//! Resuming an interrupted run: a staged table (`tables/<t>.bin` and its
//! restart record in `parts/`) is reused when its fingerprint, position and
//! checksums match; otherwise it and every later one is discarded.
//!
//! Invariants: a reused table is applied only after every check passed, and
//! it re-allocates exactly the indices (rows, columns, categories, texts) it
//! allocated when it was written. Never: reuse a table whose bytes no longer
//! hash to what its record says, or one staged after a table that is rebuilt.

use std::fs;

use serde::{Deserialize, Serialize};

use super::{io, DatabaseWriter};
use crate::error::{Error, Result};
use crate::format::{ColumnMeta, FileDigest, FileKind, MappedFile, TableMeta};
use crate::preprocess::stats::RunningStats;

#[derive(Serialize, Deserialize)]
pub(super) struct TablePart {
    pub(super) fingerprint: String,
    pub(super) table: TableMeta,
    pub(super) fk_refs: Vec<String>,
    pub(super) columns: Vec<ColumnMeta>,
    pub(super) categories_added: Vec<String>,
    pub(super) ts: (u64, f64, f64, f64, f64),
    pub(super) digest: FileDigest,
}

impl DatabaseWriter {
    /// Reuse table number `num_tables()` from an interrupted run if it was
    /// staged with the same fingerprint. Returns whether it was reused; when
    /// not, every staged table from that index on is discarded.
    pub fn resume_table(&mut self, fingerprint: &str) -> Result<bool> {
        let t = self.tables.len();
        // A table that cannot be resumed (or fails to read back) is rebuilt.
        if let Ok(true) = self.try_resume(t, fingerprint) {
            self.resumed += 1;
            Ok(true)
        } else {
            self.discard_parts_from(t)?;
            Ok(false)
        }
    }

    fn discard_parts_from(&self, t: usize) -> Result<()> {
        let parts = self.staging.join("parts");
        for entry in fs::read_dir(&parts).map_err(io(&parts))? {
            let entry = entry.map_err(io(&parts))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let idx = name.split('.').next().and_then(|s| s.parse::<usize>().ok());
            if idx.is_none_or(|i| i >= t) {
                let p = entry.path();
                fs::remove_file(&p).map_err(io(&p))?;
                if let Some(i) = idx {
                    let tf = self.staging.join(format!("tables/{i}.bin"));
                    if tf.exists() {
                        fs::remove_file(&tf).map_err(io(&tf))?;
                    }
                }
            }
        }
        Ok(())
    }

    fn try_resume(&mut self, t: usize, fingerprint: &str) -> Result<bool> {
        let json_path = self.staging.join(format!("parts/{t}.json"));
        let Ok(raw) = fs::read(&json_path) else {
            return Ok(false);
        };
        let part: TablePart =
            serde_json::from_slice(&raw).map_err(|e| Error::format(&json_path, e.to_string()))?;
        if part.fingerprint != fingerprint
            || part.table.idx as usize != t
            || part.table.row_offset != self.num_rows
        {
            return Ok(false);
        }
        let table_file = MappedFile::open(
            &self.staging.join(format!("tables/{t}.bin")),
            FileKind::Table,
            Some(2 * part.columns.len()),
        )?;
        // A staged part is reused only if its bytes still hash to what was
        // recorded when it was written (opening no longer hashes payloads).
        if format!("{:016x}", table_file.payload_checksum()) != part.digest.checksum
            || table_file.verify_payload(&mut |_| {}).is_err()
        {
            return Ok(false);
        }
        let n = part.table.num_rows as usize;
        let k = part.fk_refs.len();
        let graph_part = MappedFile::open(
            &self.staging.join(format!("parts/{t}.bin")),
            FileKind::Graph,
            Some(k + 3),
        )?;
        if graph_part.verify_payload(&mut |_| {}).is_err() {
            return Ok(false);
        }
        // Checks passed: apply. Column indices and category offsets must line
        // up with what this run has allocated so far.
        if part
            .columns
            .first()
            .is_some_and(|c| c.idx as usize != self.columns.len())
        {
            return Ok(false);
        }
        graph_part.section::<i64>(0, Some(n))?;
        for j in 0..k {
            graph_part.section::<u32>(1 + j, Some(n))?;
        }
        let offs: &[u64] = graph_part.section(k + 1, None)?;
        let bytes: &[u8] = graph_part.section(k + 2, None)?;
        for w in offs.windows(2) {
            let s = std::str::from_utf8(&bytes[w[0] as usize..w[1] as usize])
                .map_err(|e| Error::format(graph_part.path(), e.to_string()))?;
            let next = self.texts.len();
            if self.texts.intern(s)? as usize != next {
                return Err(Error::format(
                    graph_part.path(),
                    format!(
                        "text value {s:?} is recorded as new here but an earlier table added it"
                    ),
                ));
            }
        }
        self.num_rows += n as u64;
        self.graph_parts.push(graph_part);
        self.fk_refs.push(part.fk_refs);
        self.cat_strings.extend(part.categories_added);
        self.columns.extend(part.columns);
        let (count, mean, m2, min, max) = part.ts;
        self.ts_stats.merge(&RunningStats {
            count,
            mean,
            m2,
            min,
            max,
        });
        self.files.insert(part.table.file.clone(), part.digest);
        self.tables.push(part.table);
        Ok(true)
    }
}
