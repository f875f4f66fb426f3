//! `metadata.json`: the schema of a preprocessed database.
//!
//! Read once at open and kept in memory. Field order is fixed by these structs
//! (and maps are `BTreeMap`), so serialising the same metadata always yields
//! the same bytes — the content hash depends on that.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::header::{FORMAT_VERSION, MIN_READ_VERSION};
use headwater_common::error::{Error, Result};

/// How a column's values are encoded and which decoder head predicts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum SemanticType {
    /// A number (z-scored, f32).
    Numerical,
    /// True/false.
    Boolean,
    /// A point in time (µs).
    Timestamp,
    /// One of a few categories (embedded by name).
    Categorical,
    /// Free text (embedded by value).
    Text,
    /// A key; not stored as a cell.
    Identifier,
    /// Declared to be left out.
    Ignored,
}

impl SemanticType {
    /// The code used in batch tensors (`semantic_types`, `target_stype`):
    /// numerical 0, boolean 1, timestamp 2, categorical 3, text 4. Types that
    /// produce no cells have none.
    pub fn code(self) -> Option<u8> {
        match self {
            SemanticType::Numerical => Some(0),
            SemanticType::Boolean => Some(1),
            SemanticType::Timestamp => Some(2),
            SemanticType::Categorical => Some(3),
            SemanticType::Text => Some(4),
            SemanticType::Identifier | SemanticType::Ignored => None,
        }
    }

    /// Does a column of this type become cells (and get stored)?
    pub fn is_stored(self) -> bool {
        self.code().is_some()
    }

    /// Can a task predict a value of this type (has a decoder head)?
    pub fn is_target(self) -> bool {
        matches!(self.code(), Some(0..=3))
    }

    /// Size in bytes of one stored value.
    pub fn value_size(self) -> usize {
        match self {
            // f32 values, u32 category and text ids.
            SemanticType::Numerical | SemanticType::Categorical | SemanticType::Text => 4,
            SemanticType::Boolean => 1,
            SemanticType::Timestamp => 8,
            SemanticType::Identifier | SemanticType::Ignored => 0,
        }
    }

    /// The name used in schema files and `metadata.json`.
    pub fn name(self) -> &'static str {
        match self {
            SemanticType::Numerical => "numerical",
            SemanticType::Boolean => "boolean",
            SemanticType::Timestamp => "timestamp",
            SemanticType::Categorical => "categorical",
            SemanticType::Text => "text",
            SemanticType::Identifier => "identifier",
            SemanticType::Ignored => "ignored",
        }
    }

    /// The type named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "numerical" => SemanticType::Numerical,
            "boolean" => SemanticType::Boolean,
            "timestamp" => SemanticType::Timestamp,
            "categorical" => SemanticType::Categorical,
            "text" => SemanticType::Text,
            "identifier" => SemanticType::Identifier,
            "ignored" => SemanticType::Ignored,
            _ => return None,
        })
    }
}

/// Summary statistics of a column (of its non-null source values).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnStats {
    /// Values (null included).
    pub count: u64,
    /// Null values.
    pub null_count: u64,
    /// Mean and standard deviation used for z-scoring (numerical), in source
    /// units; for timestamps in µs since the epoch.
    pub mean: f64,
    /// Standard deviation of the non-null values (before z-scoring).
    pub std: f64,
    /// Smallest non-null value.
    pub min: f64,
    /// Largest non-null value.
    pub max: f64,
    /// Non-null values the mean, std, min and max come from, where the
    /// database's [`StatsRule`] left values out of them (rows after the
    /// cutoff, a task's val/test labels); absent: every non-null value
    /// (always so in databases written before the rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_count: Option<u64>,
}

/// Which rows the normalisation statistics (column stats, timestamp stats)
/// come from: those a model may see before the earliest scored period.
/// Absent in databases written before the rule (statistics of every row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsRule {
    /// Rows dated after this (µs since the epoch) feed no statistic: the
    /// validation cutoff (RelBench: the dataset's `val_timestamp`). Rows of
    /// tables without a time column, and undated rows, count. Absent: no
    /// time split, every row counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cutoff_us: Option<i64>,
    /// The hash split (`split_seed`) under which a supplied task target
    /// without stored splits left its val/test seeds out of its statistics:
    /// the sampler's default, as the sampler's own seed is not known when
    /// the database is written.
    pub split_seed: u64,
    /// The split ratios (train, val, test) of that rule.
    pub split_ratios: [f64; 3],
}

/// One column of the database, global across tables. Task target columns that
/// are not table columns (SQL/RelBench tasks) are *virtual*: `slot` is `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColumnMeta {
    /// Global column index (position in `Metadata::columns`).
    pub idx: u32,
    /// Index of the column's table.
    pub table: u32,
    /// Column name.
    pub name: String,
    /// Semantic type.
    pub stype: SemanticType,
    /// The source's type name (e.g. `DECIMAL(15,2)`), for inspection.
    pub source_type: String,
    /// Was `stype` inferred (true) or declared in a schema file (false)?
    pub inferred: bool,
    /// Index of the column's section pair in `tables/<table>.bin`.
    pub slot: Option<u32>,
    /// Statistics of the source values.
    pub stats: ColumnStats,
    /// Categorical: the column's contiguous block in the categorical table.
    pub cat_emb_start: u32,
    /// Categories of the column (its block of category embeddings).
    pub cat_emb_count: u32,
    /// Categorical: the category values, `cat_emb_start + i` ↔ `categories[i]`.
    pub categories: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// A foreign key of a table.
pub struct ForeignKeyMeta {
    /// The referencing column.
    pub column: String,
    /// Referenced table index.
    pub references: u32,
    /// Edges created (non-null, resolved values).
    pub num_edges: u64,
    /// Rows whose key is null.
    pub num_null: u64,
    /// Non-null values that match no primary key (edge dropped).
    pub num_dangling: u64,
}

/// A column that does not become cells, kept for inspection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnstoredColumn {
    /// Column name.
    pub name: String,
    /// Semantic type (identifier or ignored).
    pub stype: SemanticType,
    /// Type in the source database.
    pub source_type: String,
    /// Whether the type was inferred rather than declared.
    pub inferred: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// One table of the database.
pub struct TableMeta {
    /// Table index.
    pub idx: u32,
    /// Table name.
    pub name: String,
    /// Relative path of the table file (derived from `idx`).
    pub file: String,
    /// Global index of the first row.
    pub row_offset: u64,
    /// Rows.
    pub num_rows: u64,
    /// Primary key column, if any.
    pub primary_key: Option<String>,
    /// Time column, if any.
    pub time_column: Option<String>,
    /// Foreign keys.
    pub foreign_keys: Vec<ForeignKeyMeta>,
    /// Global indices of the stored columns, in table order.
    pub columns: Vec<u32>,
    /// Columns that are not stored as cells.
    pub unstored_columns: Vec<UnstoredColumn>,
    /// Reachable only as a seed: no reverse edge leads into the table's
    /// rows, so no other context (BFS or walk) reaches them (a link
    /// task's candidate pairs). Absent (false) in databases written
    /// before it, and the database's hash is unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seed_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// One prediction task.
pub struct TaskMeta {
    /// Task index.
    pub idx: u32,
    /// Task name.
    pub name: String,
    /// `cell` (mask a column of the anchor table), `sql` (schema-declared
    /// query) or `relbench` (imported label table).
    pub kind: String,
    /// The task file, relative to the database directory.
    pub file: String,
    /// Index of the table whose rows are the seeds.
    pub anchor_table: u32,
    /// Global column index of the target (a table column for `cell` tasks, a
    /// virtual column otherwise).
    pub target_column: u32,
    /// Semantic type of the target.
    pub target_stype: SemanticType,
    /// Seeds (anchor rows with an observation time).
    pub num_seeds: u64,
    /// Seeds whose target is null.
    pub num_null_targets: u64,
    /// Does any seed carry an observation time (vs. all `i64::MAX`)?
    pub temporal: bool,
    /// The query that defined the task, if any.
    pub query: Option<String>,
    /// What the task predicts.
    pub description: Option<String>,
    /// Does each seed carry a stored split (RelBench: the label file it came
    /// from)? Then the task file has a fifth section, one `u8` code per seed
    /// (0 train, 1 val, 2 test), and the sampler uses it instead of the hash
    /// rule. Absent (false) in databases written before it: hash split.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stored_splits: bool,
    /// Cell tasks: the global index of the anchor table's timestamp column
    /// that says when each row's label becomes known (a null: never, yet).
    /// Absent: the row's own time. A row's label cells are hidden in a
    /// context whose seed was observed before it (docs/contexts.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_time_column: Option<u32>,
    /// Cell tasks: other stored columns of the anchor table (global
    /// indices) known only with the label, hidden with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub label_columns: Vec<u32>,
    /// Query tasks (`sql`, `relbench`): the label window Δ in µs (> 0).
    /// Each label covers (observation, observation + Δ], so it is known at
    /// observation + Δ; an earlier item of the task is an in-context
    /// example of a seed observed at t only if observation + Δ ≤ t
    /// (docs/contexts.md, "Forecast tasks"). Absent: none declared (such a
    /// task has no examples), and the database's hash is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_us: Option<i64>,
    /// Link tasks: the share of the training groups' positives that the
    /// candidate generator found (the positives the model trains on), in
    /// [0, 1]. Absent for every other task (the hash is unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_recall: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
/// Statistics of every timestamp value, for the time encoding.
pub struct TimestampStats {
    /// Mean and std of all non-null timestamp cells in the database (µs).
    pub mean_us: f64,
    /// Standard deviation (µs).
    pub std_us: f64,
    /// Timestamps counted.
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// The embedder that made the embeddings.
pub struct EmbedderMeta {
    /// Embedder name.
    pub name: String,
    /// Embedding width.
    pub dim: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
/// Size and checksum of one file of the database.
pub struct FileDigest {
    /// File length.
    pub bytes: u64,
    /// xxh3-64 payload checksum, hex.
    pub checksum: String,
}

/// The whole `metadata.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Format version of the directory.
    pub format_version: u32,
    /// xxh3-128 (hex) of this document with `content_hash` empty; see
    /// [`crate`].
    pub content_hash: String,
    /// What wrote it (crate and version).
    pub producer: String,
    /// Where the data came from.
    pub source: String,
    /// The embedder.
    pub embedder: EmbedderMeta,
    /// Rows over all tables.
    pub num_rows: u64,
    /// Foreign-key edges.
    pub num_edges: u64,
    /// Reverse edges (child lists), when fewer than `num_edges`: no reverse
    /// edge leads into a seed-only table (`TableMeta::seed_only`). Absent:
    /// as many as `num_edges`, and the database's hash is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_reverse_edges: Option<u64>,
    /// Rows of the text embedding matrix.
    pub num_text_embeddings: u64,
    /// Rows of the category embedding matrix.
    pub num_categorical_embeddings: u64,
    /// Timestamp statistics.
    pub timestamp_stats: TimestampStats,
    /// The rows the statistics come from; absent in databases written
    /// before the rule (every row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_rule: Option<StatsRule>,
    /// Tables, in index order.
    pub tables: Vec<TableMeta>,
    /// Columns, in global index order.
    pub columns: Vec<ColumnMeta>,
    /// Tasks, in index order.
    pub tasks: Vec<TaskMeta>,
    /// Every data file with its size and checksum.
    pub files: BTreeMap<String, FileDigest>,
}

impl Metadata {
    /// Read and check `dir/metadata.json`: a directory holding one, of a
    /// format version this build reads (checked before the full parse, so
    /// an incompatible file yields a version error, not a schema error),
    /// whose content hash matches. Returns its path and the metadata.
    pub(crate) fn read(dir: &Path) -> Result<(PathBuf, Metadata)> {
        let meta_path = dir.join("metadata.json");
        if !dir.is_dir() {
            return Err(Error::io(
                dir,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a directory (expected a headwater database)",
                ),
            ));
        }
        if !meta_path.is_file() {
            return Err(Error::format(
                dir,
                "is not a headwater database: it has no metadata.json (build one with `headwater preprocess`)",
            ));
        }
        let raw = std::fs::read(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
        let probe: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| Error::format(&meta_path, format!("not valid JSON: {e}")))?;
        let version = probe
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| Error::format(&meta_path, "missing `format_version`"))?;
        if !(MIN_READ_VERSION as u64..=FORMAT_VERSION as u64).contains(&version) {
            return Err(Error::Version {
                file: meta_path,
                found: version as u32,
                min: MIN_READ_VERSION,
                max: FORMAT_VERSION,
            });
        }
        let meta: Metadata = serde_json::from_value(probe)
            .map_err(|e| Error::format(&meta_path, format!("invalid metadata: {e}")))?;
        let want_hash = meta.compute_content_hash();
        if want_hash != meta.content_hash {
            return Err(Error::format(
                &meta_path,
                format!(
                    "content hash mismatch: stored {}, computed {want_hash} (metadata was edited)",
                    meta.content_hash
                ),
            ));
        }
        Ok((meta_path, meta))
    }

    /// The content hash of this metadata (ignoring the stored hash).
    pub fn compute_content_hash(&self) -> String {
        let mut m = self.clone();
        m.content_hash.clear();
        let bytes = serde_json::to_vec(&m).expect("metadata serialises");
        format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))
    }

    /// The table named `name`.
    pub fn table_by_name(&self, name: &str) -> Option<&TableMeta> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The task named `name`.
    pub fn task_by_name(&self, name: &str) -> Option<&TaskMeta> {
        self.tasks.iter().find(|t| t.name == name)
    }

    /// The tasks whose numerical target's statistics left out the val/test
    /// seeds of another hash split than (`split_seed`, `ratios`): supplied
    /// targets without stored splits, of which a sampler with those
    /// settings scores some labels that fed the statistics. None in a
    /// database written before the [`StatsRule`].
    pub fn targets_split_otherwise(&self, split_seed: u64, ratios: [f64; 3]) -> Vec<&str> {
        let Some(rule) = &self.stats_rule else {
            return vec![];
        };
        if rule.split_seed == split_seed && rule.split_ratios == ratios {
            return vec![];
        }
        let supplied = |k: &TaskMeta| {
            self.columns
                .get(k.target_column as usize)
                .is_some_and(|c| c.slot.is_none())
        };
        self.tasks
            .iter()
            .filter(|k| !k.stored_splits && k.target_stype == SemanticType::Numerical)
            .filter(|k| supplied(k))
            .map(|k| k.name.as_str())
            .collect()
    }
}
