//! The saved form of the sampler state (`state_dict()`): [`SamplerState`],
//! versioned JSON with a format tag, and the refusals of a state that does
//! not fit the sampler it is restored into (see the parent module's doc).
//!
//! Invariants: every refusal is an [`Error::State`] naming the field that
//! differs; a state of another format or version is refused before its
//! fields are read. Never: hand out a stream from a state that failed a
//! check, or reach into the running pipeline; this file converts between a
//! [`StreamState`] and its saved form, and nothing else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{StreamConfig, StreamState};
use crate::error::{Error, Result};
use crate::seeds::{epoch_cursor, Split};

/// The `format` tag of a saved state.
pub const STATE_FORMAT: &str = "headwater-sampler-state";
/// The state version this build writes and reads.
pub const STATE_VERSION: u32 = 2;

/// One task's pool in a saved split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolRecord {
    /// The task's name.
    pub task: String,
    /// Seeds in the global pool (0: the task has none in this split).
    pub size: u64,
    /// Completed reshuffles (global exhaust events) so far.
    pub epoch: u64,
    /// Position in the epoch's order, `0..=size` (`size`: exhausted, the
    /// next draw opens epoch `epoch + 1`).
    pub cursor: u64,
    /// The last step that picked the task.
    pub last_picked: Option<u64>,
}

/// One split's saved stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitRecord {
    /// Batches delivered (the next step).
    pub step: u64,
    /// `(first step, world size)` spans from step 0.
    pub world_sizes: Vec<(u64, u32)>,
    /// Restores so far.
    pub resumes: u64,
    /// One per task, metadata order.
    pub pools: Vec<PoolRecord>,
    /// Task indices of the recent picks, oldest first.
    pub mix_window: Vec<u32>,
}

/// One database of the mixture a state was taken on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseRecord {
    /// Its name in the mixture.
    pub name: String,
    /// Its snapshot content hash.
    pub content_hash: String,
}

/// The saved sampler state (`state_dict()`), as of delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerState {
    /// [`STATE_FORMAT`].
    pub format: String,
    /// [`STATE_VERSION`] when written by this build.
    pub version: u32,
    /// The snapshot's content hash (`metadata.json`); for a mixture, the
    /// mixture's hash (of its databases' names and hashes, in order).
    pub content_hash: String,
    /// The mixture's databases, in order (one for a single database).
    pub databases: Vec<DatabaseRecord>,
    /// Databases of the mixture dropped at open (`on_bad_database =
    /// "skip"`), by name: a resume drops them again (absent when none, so
    /// states without drops are unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_databases: Vec<String>,
    /// [`StreamConfig::hash`] of `config`.
    pub config_hash: String,
    /// The stream keys the state was taken under.
    pub config: StreamConfig,
    /// Task names, metadata order.
    pub tasks: Vec<String>,
    /// By split name (`train`, `val`).
    pub splits: BTreeMap<String, SplitRecord>,
}

fn refuse(field: &str, what: String) -> Error {
    Error::State {
        field: field.to_string(),
        what,
    }
}

impl SamplerState {
    /// The state as compact JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("serialisable")
    }

    /// Parse a saved state, refusing another format or version first (so an
    /// old or newer state gets a version error, not a field error).
    pub fn from_json(s: &str) -> Result<SamplerState> {
        let v: serde_json::Value = serde_json::from_str(s)
            .map_err(|e| refuse("state", format!("not a JSON sampler state: {e}")))?;
        let format = v.get("format").and_then(|f| f.as_str());
        if format != Some(STATE_FORMAT) {
            return Err(refuse(
                "format",
                format!("expected {STATE_FORMAT:?}, got {:?}", v.get("format")),
            ));
        }
        let version = v.get("version").and_then(serde_json::Value::as_u64);
        match version {
            Some(x) if x == STATE_VERSION as u64 => {}
            Some(x) if x > STATE_VERSION as u64 => {
                return Err(refuse(
                    "version",
                    format!("state version {x} is newer than this build reads ({STATE_VERSION}); upgrade headwater"),
                ))
            }
            other => {
                return Err(refuse(
                    "version",
                    format!("state version {other:?} is not supported (this build reads version {STATE_VERSION})"),
                ))
            }
        }
        serde_json::from_value(v)
            .map_err(|e| refuse("state", format!("malformed sampler state: {e}")))
    }

    /// The state of `streams` (with each split's pool sizes) under `config`.
    pub fn capture(
        content_hash: &str,
        databases: &[DatabaseRecord],
        config: StreamConfig,
        tasks: &[String],
        streams: &[(Split, &StreamState, &[u64])],
    ) -> SamplerState {
        let splits = streams
            .iter()
            .map(|&(split, st, sizes)| {
                let pools = tasks
                    .iter()
                    .enumerate()
                    .map(|(k, name)| {
                        let (epoch, cursor) = if sizes[k] == 0 {
                            (0, 0)
                        } else {
                            epoch_cursor(st.drawn[k], sizes[k])
                        };
                        PoolRecord {
                            task: name.clone(),
                            size: sizes[k],
                            epoch,
                            cursor,
                            last_picked: st.last_picked[k],
                        }
                    })
                    .collect();
                let rec = SplitRecord {
                    step: st.step,
                    world_sizes: st.world_sizes.clone(),
                    resumes: st.resumes,
                    pools,
                    mix_window: st.mix.picks().collect(),
                };
                (split.name().to_string(), rec)
            })
            .collect();
        SamplerState {
            format: STATE_FORMAT.into(),
            version: STATE_VERSION,
            content_hash: content_hash.into(),
            databases: databases.to_vec(),
            dropped_databases: Vec::new(),
            config_hash: config.hash(),
            config,
            tasks: tasks.to_vec(),
            splits,
        }
    }

    /// Check this state against the snapshot and config it is restored
    /// under, naming the first field that differs.
    pub fn check(
        &self,
        content_hash: &str,
        databases: &[DatabaseRecord],
        mine: &StreamConfig,
        tasks: &[String],
    ) -> Result<()> {
        if self.format != STATE_FORMAT {
            return Err(refuse(
                "format",
                format!("expected {STATE_FORMAT:?}, got {:?}", self.format),
            ));
        }
        if self.version != STATE_VERSION {
            return Err(refuse(
                "version",
                format!(
                    "state version {} is not supported (this build reads version {STATE_VERSION})",
                    self.version
                ),
            ));
        }
        self.check_snapshot(content_hash, databases, tasks)?;
        self.check_config(mine)
    }

    /// The databases (names, then each content hash), the snapshot's hash
    /// and the task names are the ones this state was taken on.
    fn check_snapshot(
        &self,
        content_hash: &str,
        databases: &[DatabaseRecord],
        tasks: &[String],
    ) -> Result<()> {
        let names = |d: &[DatabaseRecord]| d.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        if names(&self.databases) != names(databases) {
            return Err(refuse(
                "databases",
                format!(
                    "the state was taken on the databases {:?}, this sampler has {:?}",
                    names(&self.databases),
                    names(databases)
                ),
            ));
        }
        for (i, (a, b)) in self.databases.iter().zip(databases).enumerate() {
            if a.content_hash != b.content_hash {
                // One database: the snapshot's own field, as before mixtures.
                let field = if databases.len() == 1 {
                    "content_hash".to_string()
                } else {
                    format!("databases.{i}.content_hash")
                };
                return Err(refuse(
                    &field,
                    format!(
                        "database `{}`: the state was taken on snapshot {}, this one is snapshot {}",
                        a.name, a.content_hash, b.content_hash
                    ),
                ));
            }
        }
        if self.content_hash != content_hash {
            return Err(refuse(
                "content_hash",
                format!(
                    "the state was taken on snapshot {}, this database is snapshot {content_hash}",
                    self.content_hash
                ),
            ));
        }
        if self.tasks != tasks {
            return Err(refuse(
                "tasks",
                format!(
                    "the state has tasks {:?}, this database {:?}",
                    self.tasks, tasks
                ),
            ));
        }
        Ok(())
    }

    /// The stream keys and their hash are the ones this state was taken
    /// under; the first key that differs is named.
    fn check_config(&self, mine: &StreamConfig) -> Result<()> {
        if &self.config != mine {
            let a = serde_json::to_value(&self.config).expect("serialisable");
            let b = serde_json::to_value(mine).expect("serialisable");
            let (a, b) = (
                a.as_object().expect("object"),
                b.as_object().expect("object"),
            );
            // Keys absent from one side (the recipe without `examples`)
            // are named too, as "not set".
            let shown = |v: Option<&serde_json::Value>| {
                v.map_or_else(|| "not set".to_string(), ToString::to_string)
            };
            // `examples` first: it decides whether the recipe keys exist.
            let first = "examples".to_string();
            let keys = std::iter::once(&first)
                .chain(a.keys())
                .chain(b.keys().filter(|k| !a.contains_key(*k)));
            for key in keys {
                if a.get(key) != b.get(key) {
                    return Err(refuse(
                        key,
                        format!(
                            "the state was taken with {key} = {}, this sampler has {}; it changes the batch stream",
                            shown(a.get(key)),
                            shown(b.get(key))
                        ),
                    ));
                }
            }
        }
        if self.config_hash != mine.hash() {
            return Err(refuse(
                "config_hash",
                format!(
                    "{} does not match the state's config ({})",
                    self.config_hash,
                    mine.hash()
                ),
            ));
        }
        Ok(())
    }

    /// The stream of `split`, checked against this sampler's pool sizes.
    pub fn stream(&self, split: Split, sizes: &[u64], window: usize) -> Result<StreamState> {
        let name = split.name();
        let rec = self
            .splits
            .get(name)
            .ok_or_else(|| refuse("splits", format!("the state has no {name} split")))?;
        let field = |f: &str| format!("splits.{name}.{f}");
        if rec.pools.len() != sizes.len() {
            return Err(refuse(
                &field("pools"),
                format!("{} pools for {} tasks", rec.pools.len(), sizes.len()),
            ));
        }
        let n = sizes.len();
        let mut st = StreamState::new(n, 1, window);
        st.step = rec.step;
        for (k, (p, &size)) in rec.pools.iter().zip(sizes).enumerate() {
            if p.size != size {
                return Err(refuse(
                    &field("pools.size"),
                    format!(
                        "task {:?} had {} seeds in the state, {size} here",
                        p.task, p.size
                    ),
                ));
            }
            if p.cursor > size || (size == 0 && p.epoch > 0) {
                return Err(refuse(
                    &field("pools.cursor"),
                    format!(
                        "task {:?}: epoch {} cursor {} outside a pool of {size}",
                        p.task, p.epoch, p.cursor
                    ),
                ));
            }
            if p.last_picked.is_some_and(|s| s >= rec.step) {
                return Err(refuse(
                    &field("pools.last_picked"),
                    format!("task {:?} picked at or after step {}", p.task, rec.step),
                ));
            }
            st.drawn[k] = p.epoch * size + p.cursor;
            st.last_picked[k] = p.last_picked;
        }
        let spans_ok = rec.world_sizes.first().is_some_and(|s| s.0 == 0)
            && rec.world_sizes.windows(2).all(|w| w[0].0 < w[1].0)
            && rec.world_sizes.iter().all(|s| s.1 > 0 && s.0 <= rec.step);
        if !spans_ok {
            return Err(refuse(
                &field("world_sizes"),
                format!(
                    "{:?} is not a history of (first step, world size) spans from step 0",
                    rec.world_sizes
                ),
            ));
        }
        st.world_sizes.clone_from(&rec.world_sizes);
        if rec.mix_window.len() > window || rec.mix_window.iter().any(|&k| k as usize >= n) {
            return Err(refuse(
                &field("mix_window"),
                format!(
                    "{:?} is not a window of at most {window} task indices",
                    rec.mix_window
                ),
            ));
        }
        for &k in &rec.mix_window {
            st.mix.push(k);
        }
        st.resumes = rec.resumes;
        Ok(st)
    }
}
