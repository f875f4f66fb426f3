//! A column's two passes, for table columns and task targets alike: the
//! scan ([`DatabaseWriter::scan`]: lengths, values, statistics, the
//! [`Encoding`], text interning) and the write ([`Encoding::write`]: the
//! values section, then the validity bitmap), plus the column's metadata
//! record ([`DatabaseWriter::new_column`]).
//!
//! Invariants: a value that the scan accepted is written by the encoding it
//! fixed, a chunk of [`ENCODE_CHUNK`] rows at a time, so validity bitmaps of
//! consecutive chunks concatenate. Never: keep anything per row between the
//! passes, or encode a whole column in memory.

use super::{check_len, ColumnData, DatabaseWriter};
use crate::error::{Error, Result};
use crate::format::{pack_bits, ColumnMeta, ColumnStats, FileWriter, Section, SemanticType};
use crate::preprocess::stats::{column_stats, RunningStats};
use crate::spill::TextTable;

/// Rows encoded per buffered write. A multiple of 8, so the validity bitmaps
/// of consecutive chunks concatenate into the column's bitmap. A column is
/// streamed into its file this way, never encoded whole in memory (that copy
/// was 4-8 bytes per row of the largest table: gigabytes at 10^9 rows).
pub(super) const ENCODE_CHUNK: usize = 1 << 16;

/// How a column's stored values follow from its input, fixed by the first
/// pass over it ([`DatabaseWriter::scan`]).
pub(super) enum Encoding {
    /// z-scored f32; non-finite values are null.
    Numerical { mean: f64, scale: f64 },
    /// 0/1 bytes.
    Boolean,
    /// µs since the epoch as i64.
    Timestamp,
    /// Global category index `start + code`.
    Categorical { start: u32 },
    /// Global text id, as given.
    TextIds,
    /// Global text id of each dictionary code.
    TextDict { global: Vec<u32> },
}

/// A column's first pass: its statistics and how to encode it.
pub(super) struct Scanned {
    pub(super) stats: ColumnStats,
    pub(super) ts: Option<RunningStats>,
    pub(super) encoding: Encoding,
}

/// The first valid row whose id is at least `bound` (an id out of range),
/// and that id.
fn first_at_least(ids: &[u32], valid: &[u8], bound: usize) -> Option<(usize, u32)> {
    ids.iter()
        .zip(valid)
        .position(|(&id, &v)| v != 0 && id as usize >= bound)
        .map(|i| (i, ids[i]))
}

/// Stats of a column stored as ids (categorical, text): counts only.
fn count_stats(n: usize, valid: &[u8]) -> ColumnStats {
    let nonnull = valid.iter().filter(|&&v| v != 0).count() as u64;
    ColumnStats {
        count: nonnull,
        null_count: n as u64 - nonnull,
        ..Default::default()
    }
}

/// Write one section of `n` values, a chunk of rows at a time: `fill`
/// appends the encoded values of the rows it is given.
pub(super) fn stream_values<T: bytemuck::Pod>(
    w: &mut FileWriter,
    n: usize,
    mut fill: impl FnMut(std::ops::Range<usize>, &mut Vec<T>),
) -> Result<()> {
    w.begin_section()?;
    let mut buf: Vec<T> = Vec::with_capacity(ENCODE_CHUNK.min(n));
    for a in (0..n).step_by(ENCODE_CHUNK) {
        buf.clear();
        fill(a..(a + ENCODE_CHUNK).min(n), &mut buf);
        w.append(Section::of(&buf))?;
    }
    Ok(())
}

/// Write the validity bitmap of `n` rows, a chunk at a time.
fn stream_validity(w: &mut FileWriter, n: usize, ok: impl Fn(usize) -> bool) -> Result<()> {
    w.begin_section()?;
    for a in (0..n).step_by(ENCODE_CHUNK) {
        w.append(Section(&pack_bits((a..(a + ENCODE_CHUNK).min(n)).map(&ok))))?;
    }
    Ok(())
}

/// Stored ids, 0 where null: `id` maps a valid row's input to its id.
fn stream_ids(
    w: &mut FileWriter,
    n: usize,
    input: &[u32],
    valid: &[u8],
    id: impl Fn(u32) -> u32,
) -> Result<()> {
    stream_values(w, n, |r, buf: &mut Vec<u32>| {
        let rows = input[r.clone()].iter().zip(&valid[r]);
        buf.extend(rows.map(|(&c, &v)| if v != 0 { id(c) } else { 0 }));
    })?;
    stream_validity(w, n, |i| valid[i] != 0)
}

impl Encoding {
    /// Write a column's two sections, values then validity bitmap, a chunk
    /// at a time. `data` is the input [`DatabaseWriter::scan`] checked and
    /// this encoding came from.
    pub(super) fn write(&self, w: &mut FileWriter, n: usize, data: &ColumnData<'_>) -> Result<()> {
        match (self, data) {
            (&Encoding::Numerical { mean, scale }, ColumnData::Numerical { values, valid }) => {
                let good = |i: usize| valid[i] != 0 && values[i].is_finite();
                stream_values(w, n, |r, buf: &mut Vec<f32>| {
                    buf.extend(r.map(|i| {
                        if good(i) {
                            ((values[i] - mean) / scale) as f32
                        } else {
                            0.0
                        }
                    }));
                })?;
                stream_validity(w, n, good)
            }
            (Encoding::Boolean, ColumnData::Boolean { values, valid }) => {
                stream_values(w, n, |r, buf: &mut Vec<u8>| {
                    let rows = values[r.clone()].iter().zip(&valid[r]);
                    buf.extend(rows.map(|(&x, &v)| (v != 0 && x != 0) as u8));
                })?;
                stream_validity(w, n, |i| valid[i] != 0)
            }
            (Encoding::Timestamp, ColumnData::Timestamp { values, valid }) => {
                stream_values(w, n, |r, buf: &mut Vec<i64>| {
                    let rows = values[r.clone()].iter().zip(&valid[r]);
                    buf.extend(rows.map(|(&x, &v)| if v != 0 { x } else { 0 }));
                })?;
                stream_validity(w, n, |i| valid[i] != 0)
            }
            (&Encoding::Categorical { start }, ColumnData::Categorical { codes, valid, .. }) => {
                stream_ids(w, n, codes, valid, |c| start + c)
            }
            (Encoding::TextIds, ColumnData::TextIds { ids, valid }) => {
                stream_ids(w, n, ids, valid, |id| id)
            }
            (Encoding::TextDict { global }, ColumnData::Text { codes, valid, .. }) => {
                stream_ids(w, n, codes, valid, |c| global[c as usize])
            }
            _ => unreachable!("an encoding is written with the data it was scanned from"),
        }
    }
}

/// Whether each row is present (validity byte not 0).
fn present(valid: &[u8]) -> impl Iterator<Item = bool> + '_ {
    valid.iter().map(|&v| v != 0)
}

/// A column's values and validity each hold one entry per row (`n`).
fn check_lengths(what: &str, n: usize, data: &ColumnData<'_>) -> Result<()> {
    let (len, valid) = match data {
        ColumnData::Unstored => return Ok(()),
        ColumnData::Numerical { values, valid } => (values.len(), valid),
        ColumnData::Boolean { values, valid } => (values.len(), valid),
        ColumnData::Timestamp { values, valid } => (values.len(), valid),
        ColumnData::Categorical { codes, valid, .. } | ColumnData::Text { codes, valid, .. } => {
            (codes.len(), valid)
        }
        ColumnData::TextIds { ids, valid } => (ids.len(), valid),
    };
    check_len(what, len, n)?;
    check_len(&format!("{what} validity"), valid.len(), n)
}

impl DatabaseWriter {
    /// The first pass over a column: checks its lengths and values, computes
    /// its statistics, and fixes its [`Encoding`] (interning a text
    /// dictionary). `counted` picks the rows whose values feed the mean,
    /// std, min and max (`None`: every row; see `past.rs`). Nothing per row
    /// is kept; [`Encoding::write`] is the second pass, which normalises
    /// every row with these statistics.
    pub(super) fn scan(
        &mut self,
        what: &str,
        n: usize,
        data: &ColumnData<'_>,
        counted: Option<&dyn Fn(usize) -> bool>,
    ) -> Result<Scanned> {
        check_lengths(what, n, data)?;
        Ok(match data {
            ColumnData::Unstored => unreachable!("unstored columns are not encoded"),
            ColumnData::Numerical { values, valid } => {
                let (rs, stats) = column_stats(values.iter().copied().zip(present(valid)), counted);
                Scanned {
                    encoding: Encoding::Numerical {
                        mean: rs.mean,
                        scale: rs.scale(),
                    },
                    stats,
                    ts: None,
                }
            }
            ColumnData::Boolean { values, valid } => {
                let as_f64 = values.iter().map(|&x| (x != 0) as u8 as f64);
                let (_, stats) = column_stats(as_f64.zip(present(valid)), counted);
                Scanned {
                    encoding: Encoding::Boolean,
                    stats,
                    ts: None,
                }
            }
            ColumnData::Timestamp { values, valid } => {
                let as_f64 = values.iter().map(|&x| x as f64);
                let (rs, stats) = column_stats(as_f64.zip(present(valid)), counted);
                Scanned {
                    encoding: Encoding::Timestamp,
                    stats,
                    ts: Some(rs),
                }
            }
            ColumnData::Categorical {
                codes,
                valid,
                categories,
            } => self.scan_categorical(what, codes, valid, categories.len())?,
            ColumnData::TextIds { ids, valid } => {
                let known = self.texts.len();
                if let Some((i, id)) = first_at_least(ids, valid, known) {
                    return Err(Error::Preprocess(format!(
                        "{what}: row {i} has text id {id}, only {known} texts interned"
                    )));
                }
                Scanned {
                    encoding: Encoding::TextIds,
                    stats: count_stats(n, valid),
                    ts: None,
                }
            }
            ColumnData::Text {
                codes,
                valid,
                offsets,
                bytes,
            } => {
                let dict_len = offsets.len().saturating_sub(1);
                let global = intern_dictionary(&mut self.texts, what, offsets, bytes)?;
                if let Some((i, c)) = first_at_least(codes, valid, dict_len) {
                    return Err(Error::Preprocess(format!(
                        "{what}: row {i} has text code {c}, dictionary has {dict_len} entries"
                    )));
                }
                Scanned {
                    encoding: Encoding::TextDict { global },
                    stats: count_stats(n, valid),
                    ts: None,
                }
            }
        })
    }

    /// [`Self::scan`] of a categorical column of `k` categories: every
    /// valid code indexes one; its categories will start at the next global
    /// category index.
    fn scan_categorical(
        &self,
        what: &str,
        codes: &[u32],
        valid: &[u8],
        k: usize,
    ) -> Result<Scanned> {
        let k = k as u32;
        if let Some((i, c)) = first_at_least(codes, valid, k as usize) {
            return Err(Error::Preprocess(format!(
                "{what}: row {i} has category code {c}, only {k} categories"
            )));
        }
        let counted = count_stats(codes.len(), valid);
        Ok(Scanned {
            encoding: Encoding::Categorical {
                start: self.cat_strings.len() as u32,
            },
            stats: ColumnStats {
                max: (k.saturating_sub(1)) as f64,
                ..counted
            },
            ts: None,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_column(
        &mut self,
        table: u32,
        name: &str,
        stype: SemanticType,
        source_type: &str,
        inferred: bool,
        slot: Option<u32>,
        stats: ColumnStats,
        categories: Vec<String>,
    ) -> u32 {
        let idx = self.columns.len() as u32;
        let (cat_emb_start, cat_emb_count) = if stype == SemanticType::Categorical {
            let start = self.cat_strings.len() as u32;
            for c in &categories {
                self.cat_strings.push(format!("{name}: {c}"));
            }
            (start, categories.len() as u32)
        } else {
            (0, 0)
        };
        self.columns.push(ColumnMeta {
            idx,
            table,
            name: name.to_string(),
            stype,
            source_type: source_type.to_string(),
            inferred,
            slot,
            stats,
            cat_emb_start,
            cat_emb_count,
            categories,
        });
        idx
    }
}

/// Intern the strings of an Arrow-style dictionary (`offsets` into `bytes`)
/// into `texts`; their global ids, in dictionary order.
pub(super) fn intern_dictionary(
    texts: &mut TextTable,
    what: &str,
    offsets: &[i64],
    bytes: &[u8],
) -> Result<Vec<u32>> {
    let dict_len = offsets.len().saturating_sub(1);
    let mut global = Vec::with_capacity(dict_len);
    for j in 0..dict_len {
        let (a, b) = (offsets[j], offsets[j + 1]);
        if a < 0 || b < a || b as usize > bytes.len() {
            return Err(Error::Preprocess(format!(
                "{what}: dictionary entry {j} spans {a}..{b}, outside {} bytes",
                bytes.len()
            )));
        }
        let s = std::str::from_utf8(&bytes[a as usize..b as usize]).map_err(|e| {
            Error::Preprocess(format!("{what}: dictionary entry {j} is not UTF-8: {e}"))
        })?;
        global.push(texts.intern(s)?);
    }
    Ok(global)
}
