//! Synthetic relational databases for tests and benchmarks.
//!
//! Table `i` references tables `j < i` (a DAG), so every foreign key points at
//! an existing primary key. A temporal row is never older than its temporal
//! parents, and task observation times are never before the anchor row's
//! time; a table without a time column can still reference a newer row (as
//! real data can), which the time filter must keep out. One row of table 0
//! can be made a hub that most rows of table 1 reference.

use std::path::Path;

use half::f16;

use super::writer::{
    ColumnData, ColumnInput, DatabaseWriter, ForeignKeyInput, TableInput, TaskInput, TaskTarget,
};
use crate::error::Result;
use crate::format::{Metadata, SemanticType};
use crate::rng::Xoshiro256pp;

/// Shape of a synthetic database.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    /// Number of tables.
    pub tables: usize,
    /// Rows per table.
    pub rows: Vec<usize>,
    /// Foreign keys per table (to random earlier tables), capped by its index.
    pub fks_per_table: usize,
    /// Probability that a foreign key value is null.
    pub null_fk: f64,
    /// Tables with index in this set have a time column.
    pub temporal: Vec<bool>,
    /// Share of table 1's first foreign key that points at row 0 of its parent.
    pub hub_share: f64,
    /// Seed of everything random in the database.
    pub seed: u64,
}

impl SynthSpec {
    /// A small mixed database: `n` tables of `rows` rows each.
    pub fn small(n: usize, rows: usize, seed: u64) -> Self {
        SynthSpec {
            tables: n,
            rows: vec![rows; n],
            fks_per_table: 2,
            null_fk: 0.05,
            temporal: (0..n).map(|i| i % 2 == 1 || i + 1 == n).collect(),
            hub_share: 0.0,
            seed,
        }
    }
}

const DAY_US: i64 = 86_400_000_000;
const BASE_US: i64 = 1_600_000_000_000_000;

/// Write the database described by `spec` to `out`.
pub fn synth_database(out: &Path, spec: &SynthSpec) -> Result<Metadata> {
    let mut rng = Xoshiro256pp::seed_from_u64(spec.seed);
    let mut w = DatabaseWriter::new(out, "synthetic", "hash", 8)?;
    let mut times: Vec<Vec<i64>> = Vec::new();
    let names: Vec<String> = (0..spec.tables).map(|i| format!("t{i:02}")).collect();
    let cats: Vec<String> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(ToString::to_string)
        .collect();
    let texts = ["red bolt", "green cup", "blue pipe", "grey nut"];
    let mut offsets = vec![0i64];
    let mut bytes = Vec::new();
    for t in texts {
        bytes.extend_from_slice(t.as_bytes());
        offsets.push(bytes.len() as i64);
    }
    for i in 0..spec.tables {
        let n = spec.rows[i];
        let parents = synth_parents(&mut rng, spec, i);
        let temporal = spec.temporal[i];
        let row_time = synth_row_time(&mut rng, n, temporal, &parents, &times);
        let values = SynthValues::draw(&mut rng, n, texts.len());
        let mut columns = values.columns(&cats, &offsets, &bytes);
        let valid_time: Vec<u8> = row_time.iter().map(|&t| (t != i64::MIN) as u8).collect();
        if temporal {
            columns.push(ColumnInput {
                name: "ts".into(),
                stype: SemanticType::Timestamp,
                source_type: "TIMESTAMP".into(),
                inferred: false,
                data: ColumnData::Timestamp {
                    values: &row_time,
                    valid: &valid_time,
                },
            });
        }
        let fk_names: Vec<String> = (0..parents.len()).map(|f| format!("fk{f}")).collect();
        for name in &fk_names {
            columns.push(ColumnInput {
                name: name.clone(),
                stype: SemanticType::Identifier,
                source_type: "BIGINT".into(),
                inferred: false,
                data: ColumnData::Unstored,
            });
        }
        let foreign_keys = parents
            .iter()
            .zip(&fk_names)
            .map(|((t, p), name)| ForeignKeyInput {
                column: name.clone(),
                references: names[*t].clone(),
                parents: p,
                num_null: p.iter().filter(|&&v| v < 0).count() as u64,
                num_dangling: 0,
            })
            .collect();
        w.add_table(TableInput {
            name: names[i].clone(),
            num_rows: n,
            primary_key: Some("id".into()),
            time_column: temporal.then(|| "ts".to_string()),
            row_time: &row_time,
            columns,
            foreign_keys,
            fingerprint: format!("synth-{}-{i}", spec.seed),
        })?;
        times.push(row_time);
    }
    add_synth_tasks(&mut w, &mut rng, spec, &names, &times)?;
    let dim = 8;
    let zeros = |k: usize| vec![f16::from_f32(0.1); k * dim];
    let (c, k, t) = (
        w.column_texts().len(),
        w.category_texts().len(),
        w.num_text_values(),
    );
    w.finish(&zeros(c), &zeros(k), &zeros(t), true)
}

/// Table `i`'s foreign keys: per key, the referenced (earlier) table and a
/// parent row per row (`-1`: null).
fn synth_parents(rng: &mut Xoshiro256pp, spec: &SynthSpec, i: usize) -> Vec<(usize, Vec<i64>)> {
    let n = spec.rows[i];
    let nfk = spec.fks_per_table.min(i);
    let mut parents: Vec<(usize, Vec<i64>)> = Vec::new();
    for f in 0..nfk {
        let target = rng.below(i as u64) as usize;
        let m = spec.rows[target] as u64;
        let hub = i == 1 && f == 0 && spec.hub_share > 0.0;
        let p: Vec<i64> = (0..n)
            .map(|_| {
                if rng.next_f64() < spec.null_fk || m == 0 {
                    -1
                } else if hub && rng.next_f64() < spec.hub_share {
                    0
                } else {
                    rng.below(m) as i64
                }
            })
            .collect();
        parents.push((target, p));
    }
    parents
}

/// Row times of a table of `n` rows (`i64::MIN` for all unless `temporal`):
/// each never older than any of its parents' times (`times` per table).
fn synth_row_time(
    rng: &mut Xoshiro256pp,
    n: usize,
    temporal: bool,
    parents: &[(usize, Vec<i64>)],
    times: &[Vec<i64>],
) -> Vec<i64> {
    (0..n)
        .map(|r| {
            if !temporal {
                return i64::MIN;
            }
            // Never older than any parent.
            let floor = parents
                .iter()
                .filter(|(_, p)| p[r] >= 0)
                .map(|(t, p)| times[*t][p[r] as usize])
                .filter(|&x| x != i64::MIN)
                .max()
                .unwrap_or(BASE_US);
            floor + rng.below(30 * DAY_US as u64) as i64
        })
        .collect()
}

/// The random values of one table's stored columns (besides its time).
struct SynthValues {
    x: Vec<f64>,
    ok: Vec<u8>,
    flags: Vec<u8>,
    codes: Vec<u32>,
    tcodes: Vec<u32>,
    all: Vec<u8>,
}

impl SynthValues {
    /// Draw `n` rows of values; text codes index `num_texts` strings.
    fn draw(rng: &mut Xoshiro256pp, n: usize, num_texts: usize) -> Self {
        let x: Vec<f64> = (0..n).map(|_| rng.next_f64() * 100.0).collect();
        // About 10% nulls, but never all: every table keeps a cell task.
        let ok: Vec<u8> = (0..n)
            .map(|r| (r == 0 || rng.next_f64() > 0.1) as u8)
            .collect();
        let flags: Vec<u8> = (0..n).map(|_| (rng.next_f64() > 0.5) as u8).collect();
        let codes: Vec<u32> = (0..n).map(|_| rng.below(5) as u32).collect();
        let tcodes: Vec<u32> = (0..n).map(|_| rng.below(num_texts as u64) as u32).collect();
        SynthValues {
            x,
            ok,
            flags,
            codes,
            tcodes,
            all: vec![1; n],
        }
    }

    /// The columns `id`, `x`, `flag`, `kind` (of `cats`) and `label` (of the
    /// text dictionary `offsets`/`bytes`).
    fn columns<'a>(
        &'a self,
        cats: &[String],
        offsets: &'a [i64],
        bytes: &'a [u8],
    ) -> Vec<ColumnInput<'a>> {
        vec![
            ColumnInput {
                name: "id".into(),
                stype: SemanticType::Identifier,
                source_type: "BIGINT".into(),
                inferred: false,
                data: ColumnData::Unstored,
            },
            ColumnInput {
                name: "x".into(),
                stype: SemanticType::Numerical,
                source_type: "DOUBLE".into(),
                inferred: false,
                data: ColumnData::Numerical {
                    values: &self.x,
                    valid: &self.ok,
                },
            },
            ColumnInput {
                name: "flag".into(),
                stype: SemanticType::Boolean,
                source_type: "BOOLEAN".into(),
                inferred: false,
                data: ColumnData::Boolean {
                    values: &self.flags,
                    valid: &self.all,
                },
            },
            ColumnInput {
                name: "kind".into(),
                stype: SemanticType::Categorical,
                source_type: "VARCHAR".into(),
                inferred: false,
                data: ColumnData::Categorical {
                    codes: &self.codes,
                    valid: &self.all,
                    categories: cats.to_vec(),
                },
            },
            ColumnInput {
                name: "label".into(),
                stype: SemanticType::Text,
                source_type: "VARCHAR".into(),
                inferred: false,
                data: ColumnData::Text {
                    codes: &self.tcodes,
                    valid: &self.all,
                    offsets,
                    bytes,
                },
            },
        ]
    }
}

/// One cell task per table, and a value task on the last table whose
/// observation times are at or after the anchor row's time.
fn add_synth_tasks(
    w: &mut DatabaseWriter,
    rng: &mut Xoshiro256pp,
    spec: &SynthSpec,
    names: &[String],
    times: &[Vec<i64>],
) -> Result<()> {
    for name in names {
        w.add_cell_task(&format!("{name}.x"), name, "x", None)?;
    }
    let last = spec.tables - 1;
    let n = spec.rows[last];
    let anchors: Vec<u32> = (0..n as u32).collect();
    let obs: Vec<i64> = times[last]
        .iter()
        .map(|&t| {
            if t == i64::MIN {
                i64::MAX
            } else {
                t + rng.below(10 * DAY_US as u64) as i64
            }
        })
        .collect();
    let y: Vec<u8> = (0..n).map(|_| (rng.next_f64() > 0.5) as u8).collect();
    let ok: Vec<u8> = vec![1; n];
    w.add_task(TaskInput {
        name: "future_flag".into(),
        kind: "sql".into(),
        anchor_table: names[last].clone(),
        anchor_rows: &anchors,
        obs_time: &obs,
        target: TaskTarget::Values {
            stype: SemanticType::Boolean,
            data: ColumnData::Boolean {
                values: &y,
                valid: &ok,
            },
        },
        query: None,
        description: Some("synthetic boolean target".into()),
        splits: None,
    })
}
