//! The sampler core's side of a saved state: its stream keys and
//! databases as a state records them, the capture of its splits' streams
//! into a [`SamplerState`], and the restore that refuses a state it cannot
//! continue (naming the field) and otherwise continues each split's stream
//! at this sampler's world size.
//!
//! What a state holds, its JSON and its refusals are `crate::stream`'s; this
//! file only fills it from, and checks it against, the sampler core.

use super::{SamplerCore, SplitState, MIX_WINDOW};
use crate::error::{Error, Result};
use crate::seeds::Split;
use crate::stream::{DatabaseRecord, SamplerState, StreamConfig, StreamState};

impl SamplerCore {
    /// The stream keys of this sampler's config (effective task weights,
    /// after any mid-run drop).
    pub fn stream_config(&self) -> StreamConfig {
        let now = self.drop_set();
        StreamConfig::of(&self.cfg, &now.weights, &now.shares)
    }

    /// The mixture's databases as a state records them (name, content hash).
    pub fn database_records(&self) -> Vec<DatabaseRecord> {
        self.dbs
            .iter()
            .map(|d| DatabaseRecord {
                name: d.name.clone(),
                content_hash: d.db.content_hash().to_string(),
            })
            .collect()
    }

    /// The saved form of `streams` (split, stream, global pool sizes). The
    /// drop set is read once, after the streams: a batch delivered past
    /// them under a newer one is remade first (`crate::sampler`), so the
    /// state never records fewer drops than the batches after it saw.
    pub fn capture(&self, streams: &[(Split, &StreamState, &[u64])]) -> SamplerState {
        let now = self.drop_set();
        let mut state = SamplerState::capture(
            &self.content_hash(),
            &self.database_records(),
            StreamConfig::of(&self.cfg, &now.weights, &now.shares),
            self.task_names(),
            streams,
        );
        state.dropped_databases = self
            .dropped_under(&now)
            .into_iter()
            .map(|d| d.name)
            .collect();
        state
    }

    /// The streams of `fresh`'s splits restored from `saved` (refusing an
    /// incompatible state), continued at this sampler's world size, each
    /// counting one more resume; logs the resume (and a reshard).
    pub fn restore(&self, saved: &SamplerState, fresh: &[SplitState]) -> Result<Vec<StreamState>> {
        let (out, notes) = self.restored_streams(saved, fresh)?;
        let msg = format!(
            "rank {} resumed from a saved sampler state: {}",
            self.cfg.rank,
            notes.join(", ")
        );
        crate::say::info(&msg);
        Ok(out)
    }

    /// What [`restore`](Self::restore) would restore, with one note per
    /// split (its step, and the reshard when the world size changes);
    /// logs nothing (`Sampler::check_state` only asks whether it fits).
    pub fn restored_streams(
        &self,
        saved: &SamplerState,
        fresh: &[SplitState],
    ) -> Result<(Vec<StreamState>, Vec<String>)> {
        let dropped = self.dropped_databases();
        let mine: Vec<&str> = dropped.iter().map(|d| d.name.as_str()).collect();
        if saved.dropped_databases != mine {
            return Err(Error::State {
                field: "dropped_databases".into(),
                what: format!(
                    "the state was taken with the databases {:?} dropped, this sampler dropped \
                     {mine:?} (a state that drops databases is restored by opening a sampler \
                     with it: Sampler(..., state=...))",
                    saved.dropped_databases
                ),
            });
        }
        saved.check(
            &self.content_hash(),
            &self.database_records(),
            &self.stream_config(),
            self.task_names(),
        )?;
        let mut out = Vec::with_capacity(fresh.len());
        let mut notes = Vec::new();
        for f in fresh {
            let mut st = saved.stream(f.split, &f.pool_lens(), MIX_WINDOW)?;
            let before = st.world_size_at(st.step);
            st.reshard(self.cfg.world_size);
            st.resumes += 1;
            notes.push(if before == self.cfg.world_size {
                format!("{} at step {}", f.split.name(), st.step)
            } else {
                format!(
                    "{} at step {} (reshard: world size {before} -> {})",
                    f.split.name(),
                    st.step,
                    self.cfg.world_size
                )
            });
            out.push(st);
        }
        Ok((out, notes))
    }
}
