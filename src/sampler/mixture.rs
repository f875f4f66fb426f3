//! The mixture-wide views of a sampler's databases: concatenated embedding
//! tables and merged metadata (naming the databases and weighting their
//! tasks is the sampler's plan, `maker/plan.rs`).
//!
//! A single database is a mixture of one and takes the same path; for it
//! the weights are its task weights unchanged, the embedding tables are its
//! own and the merged metadata is its `metadata.json` plus a `databases`
//! list of one. Ids in a mixture's batches (`column_ids`,
//! `categorical_embed_ids`, `cat_emb_start`) index the concatenated tables:
//! database `d`'s ids are shifted by the columns (categories) of the
//! databases before it. Text is de-duplicated per batch as for one database.
//! Must never copy a database's tables or payloads: only the small
//! embedding tables are concatenated, once, on first request.

use std::borrow::Cow;
use std::sync::OnceLock;

use half::f16;
use serde_json::{json, Value};

use crate::error::Result;
use crate::maker::SamplerCore;

/// Metadata counts a mixture reports as the sum over its databases.
const SUMMED_COUNTS: [&str; 4] = [
    "num_rows",
    "num_edges",
    "num_text_embeddings",
    "num_categorical_embeddings",
];

impl SamplerCore {
    /// Column-name embeddings of the mixture, `[Σ columns, D]` row-major:
    /// a single database's table as mapped, a mixture's concatenated once.
    pub fn column_embeddings(&self) -> Result<Cow<'_, [f16]>> {
        self.embeddings(
            &self.concatenated.columns,
            crate::format::Database::column_embeddings,
        )
    }

    /// Category embeddings of the mixture, `[Σ categories, D]`.
    pub fn categorical_embeddings(&self) -> Result<Cow<'_, [f16]>> {
        self.embeddings(
            &self.concatenated.categories,
            crate::format::Database::categorical_embeddings,
        )
    }

    fn embeddings<'a>(
        &'a self,
        cache: &'a OnceLock<Vec<f16>>,
        read: fn(&crate::format::Database) -> Result<&[f16]>,
    ) -> Result<Cow<'a, [f16]>> {
        if let [one] = &self.dbs[..] {
            return Ok(Cow::Borrowed(read(&one.db)?));
        }
        if let Some(v) = cache.get() {
            return Ok(Cow::Borrowed(v));
        }
        let mut all = Vec::new();
        for d in &self.dbs {
            all.extend_from_slice(read(&d.db)?);
        }
        Ok(Cow::Borrowed(cache.get_or_init(|| all)))
    }

    /// The mixture described as one database: every database's
    /// `metadata.json` merged (tables, columns and tasks concatenated with
    /// their indices shifted to mixture ids, task names as in
    /// [`SamplerCore::task_names`], counts summed, `content_hash` the
    /// mixture's), plus `databases`: per database its name, path, share of
    /// batches (0 once dropped in place), first task, task count, column
    /// and category offsets and its own `metadata.json`; and
    /// `dropped_databases` (name and reason) when any was dropped.
    #[allow(clippy::missing_panics_doc)]
    pub fn merged_metadata(&self) -> Value {
        let mut merged = serde_json::to_value(self.dbs[0].db.metadata()).expect("serialisable");
        let (mut tables, mut columns, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
        let mut sums = [0u64; 4];
        let mut described = Vec::new();
        let shares = self.drop_set().shares;
        for (d, share) in self.dbs.iter().zip(shares.iter()) {
            let meta = serde_json::to_value(d.db.metadata()).expect("serialisable");
            let (t_off, c_off, cat_off) = (
                tables.len() as u64,
                u64::from(d.column_offset),
                u64::from(d.categorical_offset),
            );
            for (i, key) in SUMMED_COUNTS.iter().enumerate() {
                sums[i] += meta[key].as_u64().unwrap_or(0);
            }
            for t in meta["tables"].as_array().into_iter().flatten() {
                let mut t = t.clone();
                shift(&mut t, "idx", t_off);
                if let Some(cols) = t["columns"].as_array_mut() {
                    for c in cols {
                        *c = json!(c.as_u64().unwrap_or(0) + c_off);
                    }
                }
                tables.push(t);
            }
            for c in meta["columns"].as_array().into_iter().flatten() {
                let mut c = c.clone();
                shift(&mut c, "idx", c_off);
                shift(&mut c, "table", t_off);
                shift(&mut c, "cat_emb_start", cat_off);
                columns.push(c);
            }
            for (j, k) in meta["tasks"].as_array().into_iter().flatten().enumerate() {
                let mut k = k.clone();
                k["idx"] = json!(d.first_task + j);
                k["name"] = json!(self.task_names()[d.first_task + j]);
                shift(&mut k, "anchor_table", t_off);
                shift(&mut k, "target_column", c_off);
                tasks.push(k);
            }
            described.push(json!({
                "name": d.name,
                "path": d.db.dir().display().to_string(),
                "content_hash": d.db.content_hash(),
                "share": share,
                "first_task": d.first_task,
                "num_tasks": d.db.metadata().tasks.len(),
                "column_offset": d.column_offset,
                "categorical_offset": d.categorical_offset,
                "metadata": meta,
            }));
        }
        if self.as_mixture {
            merged["tables"] = Value::Array(tables);
            merged["columns"] = Value::Array(columns);
            merged["tasks"] = Value::Array(tasks);
            for (i, key) in SUMMED_COUNTS.iter().enumerate() {
                merged[*key] = json!(sums[i]);
            }
            merged["content_hash"] = json!(self.content_hash());
            merged["source"] = json!(format!("mixture of {} databases", self.dbs.len()));
            merged["files"] = json!({});
        }
        merged["databases"] = Value::Array(described);
        merged["memory"] = json!({
            "budget_bytes": self.reads.budget_bytes,
            "mapped_bytes": self.reads.mapped_bytes,
            "random_reads": self.reads.random_reads,
        });
        let dropped = self.dropped_databases();
        if !dropped.is_empty() {
            merged["dropped_databases"] = dropped
                .iter()
                .map(|d| json!({"name": d.name, "reason": d.reason}))
                .collect();
        }
        merged
    }
}

fn shift(v: &mut Value, key: &str, by: u64) {
    if let Some(x) = v[key].as_u64() {
        v[key] = json!(x + by);
    }
}
