//! The strings to embed (column names, category labels, text values) and
//! the `*_embeddings.bin` files of their vectors.
//!
//! Invariants: the strings are listed in the order their global indices were
//! allocated, which is the row order of each embeddings file; text values
//! live in the spilled [`TextTable`](crate::spill::TextTable).
//! Never: embed here; the vectors come from the front end.

use half::f16;

use super::columns::intern_dictionary;
use super::{digest, DatabaseWriter};
use crate::error::{Error, Result};
use crate::format::{FileKind, FileWriter, Section};
use crate::spill::TextTable;

impl DatabaseWriter {
    /// Strings to embed, in table order: column names, category labels, text values.
    pub fn column_texts(&self) -> Vec<String> {
        self.columns
            .iter()
            .map(|c| format!("{} of {}", c.name, self.tables[c.table as usize].name))
            .collect()
    }
    /// Category names in embedding order.
    pub fn category_texts(&self) -> &[String] {
        &self.cat_strings
    }
    /// Number of distinct text values.
    pub fn num_text_values(&self) -> usize {
        self.texts.len()
    }

    /// Intern a chunk's dictionary of text values (Arrow `large_string`
    /// buffers, first appearance first) for the open table's next column:
    /// their global ids, new values numbered in order. A text column is
    /// streamed this way and then added as [`ColumnData::TextIds`]; a table
    /// discarded later forgets the values it interned.
    pub fn intern_texts(&mut self, offsets: &[i64], bytes: &[u8]) -> Result<Vec<u32>> {
        let Some(open) = &self.open else {
            return Err(Error::Preprocess("intern_texts: no table begun".into()));
        };
        let what = format!("table `{}` text values", open.spec.name);
        intern_dictionary(&mut self.texts, &what, offsets, bytes)
    }
    /// Distinct text values `start..stop` (clamped), in embedding order.
    pub fn text_values(&self, start: usize, stop: usize) -> impl Iterator<Item = &str> {
        let stop = stop.min(self.texts.len());
        (start.min(stop)..stop).map(|i| self.texts.get(i))
    }

    /// Write an embeddings file of the strings `offs`/`bytes` (end offsets
    /// with a leading 0, UTF-8) and their vectors `emb`.
    fn write_embeddings(
        &mut self,
        file: &str,
        emb: &[f16],
        offs: &[u64],
        bytes: &[u8],
    ) -> Result<()> {
        let d = self.embedder.dim as usize;
        let n = offs.len() - 1;
        if emb.len() != n * d {
            return Err(Error::invalid(
                file,
                format!(
                    "{} values, expected {n} strings × dim {d} = {}",
                    emb.len(),
                    n * d
                ),
            ));
        }
        let path = self.staging.join(file);
        let mut w = FileWriter::create(&path, FileKind::Embeddings, 3)?;
        w.section(Section::of(emb))?;
        w.section(Section::of(offs))?;
        w.section(Section(bytes))?;
        let (len, sum) = w.finish()?;
        self.files.insert(file.to_string(), digest(len, sum));
        Ok(())
    }

    /// [`Self::write_embeddings`] of a list of strings.
    fn write_string_embeddings(&mut self, file: &str, emb: &[f16], texts: &[String]) -> Result<()> {
        let mut offs = Vec::with_capacity(texts.len() + 1);
        let mut bytes = Vec::new();
        offs.push(0u64);
        for s in texts {
            bytes.extend_from_slice(s.as_bytes());
            offs.push(bytes.len() as u64);
        }
        self.write_embeddings(file, emb, &offs, &bytes)
    }

    /// Write the three embeddings files (column names, category labels,
    /// text values) with the front end's vectors; the numbers of text values
    /// and category labels. The text table is released here.
    pub(super) fn write_all_embeddings(
        &mut self,
        column_emb: &[f16],
        categorical_emb: &[f16],
        text_emb: &[f16],
    ) -> Result<(u64, u64)> {
        let col_texts = self.column_texts();
        self.write_string_embeddings("column_embeddings.bin", column_emb, &col_texts)?;
        let cat_texts = std::mem::take(&mut self.cat_strings);
        self.write_string_embeddings("categorical_embeddings.bin", categorical_emb, &cat_texts)?;
        let text_values = std::mem::replace(&mut self.texts, TextTable::in_memory());
        let (offs, bytes) = text_values.sections();
        self.write_embeddings("text_embeddings.bin", text_emb, offs, bytes)?;
        Ok((text_values.len() as u64, cat_texts.len() as u64))
    }
}
