//! Building a drawn step: each context's BFS, packing's placement and cuts,
//! the sequences' assembly and the batch's text collation — on any thread,
//! from the step's draws alone (a batch is a function of its plan), with the
//! readings of each stage (`crate::readings`) taken where it happens.
//!
//! Never: a random choice of its own (every generator is keyed by the draw),
//! or state that outlives a batch besides the per-thread scratch.

use std::cell::RefCell;
use std::time::Instant;

use rayon::prelude::*;

use super::draw::{BuildBuffers, Draws, Planned};
use super::plan::{SamplerCore, TaskGroup};
use super::MadeBatch;
use crate::batch::pack_contexts;
use crate::context::{bfs, BfsParams, BfsScratch, Subgraph};
use crate::error::{Error, Result};
use crate::format::GraphView;
use crate::readings::{stage, BatchReadings, IntegrityReadings, TASK_KINDS};
use crate::rng::Xoshiro256pp;
use crate::seeds::Split;
use crate::stalls::{Stage, Watched};

thread_local! {
    static SCRATCH: RefCell<BfsScratch> = RefCell::new(BfsScratch::default());
}

/// Builds task contexts: one BFS from a seed row, with this thread's
/// scratch (the probe of `pack_factor = 0` and every batch use it).
pub(super) struct ContextBuilder<'a> {
    pub(super) graph: GraphView<'a>,
    pub(super) row_cells: &'a [u16],
    pub(super) seed_cells: usize,
    pub(super) params: BfsParams,
}

impl ContextBuilder<'_> {
    /// The context of anchor `row` observed at `obs_time` under `budget`
    /// cells, its RNG keyed by `rng_seed`, into `sub`.
    pub(super) fn build(
        &self,
        row: u32,
        obs_time: i64,
        rng_seed: u64,
        budget: usize,
        sub: &mut Subgraph,
    ) {
        SCRATCH.with(|sc| {
            let mut rng = Xoshiro256pp::seed_from_u64(rng_seed);
            let p = BfsParams {
                max_cells: budget,
                ..self.params
            };
            bfs(
                &self.graph,
                self.row_cells,
                row,
                self.seed_cells,
                obs_time,
                &p,
                &mut rng,
                &mut sc.borrow_mut(),
                sub,
            );
        });
    }
}

impl SamplerCore {
    /// The [`ContextBuilder`] of task `k` (budget `S` unless given).
    pub(super) fn context_builder(&self, k: usize) -> ContextBuilder<'_> {
        let plan = &self.tasks[k];
        let mdb = &self.dbs[plan.db];
        ContextBuilder {
            graph: mdb.db.graph(),
            row_cells: &mdb.row_cells,
            seed_cells: plan.seed_cells,
            params: BfsParams {
                max_cells: self.cfg.default_sequence_length,
                max_hops: self.cfg.max_hops,
                child_width: self.cfg.bfs_child_width,
                temporal_filter: self.cfg.temporal_filter,
            },
        }
    }

    /// The stall detector's mark for the calling thread's work on `step`
    /// (`None` when the detector is off).
    pub(super) fn watch(&self, stage: Stage, step: u64) -> Option<Watched<'_>> {
        self.stalls.as_ref().map(|w| w.enter(stage, step))
    }

    /// Build the planned batch with `buffers` (one set per batch in flight).
    pub(super) fn build(
        &self,
        p: Planned,
        buffers: &mut BuildBuffers,
        split_up: bool,
    ) -> Result<MadeBatch> {
        let Planned {
            draws:
                Draws {
                    task: k,
                    seq_len,
                    step,
                    key,
                    world_size,
                    exhaust_events,
                    window_rotations,
                    hot_set_rotations,
                    duplicates,
                    groups,
                    drawn,
                },
            jobs,
            draw,
            split,
            rank,
            planning,
            stall,
        } = p;
        // Stage times count planning and building, not the time the plan
        // waited for a thread (a pipelined stream plans ahead).
        let t0 = Instant::now()
            .checked_sub(planning)
            .unwrap_or_else(Instant::now);
        let batch_span = tracing::info_span!(
            "batch",
            split = split.name(),
            step = step as i64,
            rank = rank as i64,
            task = self.task_names[k].as_str(),
            rows = tracing::field::Empty,
            cells = tracing::field::Empty,
        );
        let _batch = batch_span.enter();
        let watched = self.watch(Stage::Bfs, step);
        if self.cfg.debug_stall_step == Some(step) && split == Split::Train {
            crate::faults::injected_stall(self.cfg.debug_stall_ms);
        }
        let one = [(k, 0..jobs.len())];
        let bc = BuildCtx {
            seq_len,
            split,
            batch_span: &batch_span,
            t0,
            split_up,
            watched: watched.as_ref(),
        };
        let g = if groups.is_empty() {
            &one[..]
        } else {
            &groups[..]
        };
        let mut made = self.build_groups(g, &jobs, self.cfg.pack, buffers, &bc)?;
        let out = watched.map(Watched::finish).unwrap_or_default();
        made.readings.stalls += u32::from(stall.stalled) + u32::from(out.stalled);
        made.readings.stall_dump_failures = stall.dump_failures + out.dump_failures;
        if let Some(d) = draw {
            made.readings.draw = d;
        }
        made.readings.exhaust_events = exhaust_events;
        made.readings.window_rotations = window_rotations;
        made.readings.hot_set_rotations = hot_set_rotations;
        made.readings.prefetched_bytes = self.take_prefetched();
        made.readings.duplicate_seeds = duplicates;
        let batch = &mut made.batch;
        batch.fingerprint =
            fingerprint([key, step, rank as u64, world_size as u64], k, &batch.seeds);
        if !groups.is_empty() {
            batch.fingerprint = super::mixing::mixed_fingerprint(batch.fingerprint, &groups);
            batch.drawn = drawn;
        }
        batch.split = split;
        batch.step = step;
        if self.cfg.mask_prob_max > 0.0 {
            self.mask_cells(&mut made, super::derive(key, &[u64::from(rank), MASK_TAG]));
        }
        Ok(made)
    }

    /// BFS, assemble and collate the sequences of `jobs` (seed, anchor row,
    /// observation time, per-context RNG seed) of task `k` at length `s`
    /// (the step's `S`), `packed` into
    /// `B` sequences of up to [`segment_slots`](Self::segment_slots)
    /// contexts (`crate::batch::pack`) or one sequence per job, into a batch
    /// with its readings and stage timings (from `t0`): the part of a batch
    /// that does not depend on how its seeds were drawn, shared by the
    /// training stream and evaluation passes. `split_up`: spread the batch's
    /// sequences over the pool (one batch at a time); otherwise the calling
    /// thread builds all of them (a pipelined stream, one batch per thread,
    /// where splitting a batch only adds work-stealing between batches).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build_batch(
        &self,
        (k, s): (usize, usize),
        split: Split,
        jobs: &[(u32, u32, i64, u64)],
        packed: bool,
        buffers: &mut BuildBuffers,
        batch_span: &tracing::Span,
        t0: Instant,
        split_up: bool,
        watched: Option<&Watched<'_>>,
    ) -> Result<MadeBatch> {
        let groups = [(k, 0..jobs.len())];
        let ctx = BuildCtx {
            seq_len: s,
            split,
            batch_span,
            t0,
            split_up,
            watched,
        };
        self.build_groups(&groups, jobs, packed, buffers, &ctx)
    }

    /// [`build_batch`](Self::build_batch) of a batch whose sequences are
    /// `groups` (task, its jobs' range: contiguous, in job order) — one
    /// group for a one-task step, one per task for `task_mixing =
    /// "sequence"` (never packed).
    pub(super) fn build_groups(
        &self,
        groups: &[TaskGroup],
        jobs: &[(u32, u32, i64, u64)],
        packed: bool,
        buffers: &mut BuildBuffers,
        bc: &BuildCtx<'_, '_>,
    ) -> Result<MadeBatch> {
        let BuildCtx {
            seq_len: s,
            batch_span,
            t0,
            split_up,
            watched,
            ..
        } = *bc;
        let k = groups[0].0;
        let min_len = if split_up { 1 } else { usize::MAX };
        let usage0 = crate::probes::usage(split_up);
        let t_probe = Instant::now();
        if self.cfg.debug_spin_ms > 0.0 {
            // Inside the probed window: the kernel's account sees the work.
            crate::faults::injected_spin(self.cfg.debug_spin_ms);
        }
        let stage_to = |st: Stage| {
            if let Some(w) = watched {
                w.stage(st);
            }
        };
        let b = if packed {
            self.cfg.default_batch_size
        } else {
            jobs.len()
        };
        let subgraphs = &mut buffers.subgraphs;
        let bfs_span = tracing::info_span!("bfs", seeds = jobs.len() as i64).entered();
        self.build_group_contexts(groups, (s, bc.split), jobs, subgraphs, min_len)?;
        let (seq_seeds, start) = if packed && self.segment_slots > 1 {
            stage_to(Stage::Packing);
            self.pack(k, jobs, subgraphs)
        } else {
            (jobs.iter().map(|j| j.0).collect(), (0..=b).collect())
        };
        drop(bfs_span);
        let t_bfs = Instant::now();
        let layout = super::assembly::Layout {
            start: &start,
            seeds: &seq_seeds,
            subgraphs,
            slots: if packed { self.segment_slots } else { 1 },
        };
        stage_to(Stage::Assembly);
        let (mut batch, seqs, probed) = self.assemble(groups, s, jobs, &layout, min_len)?;
        let t_asm = Instant::now();
        stage_to(Stage::Collate);
        let collate_span =
            tracing::info_span!("collate", unique_texts = tracing::field::Empty).entered();
        self.collate(&mut batch, groups, buffers)?;
        collate_span.record("unique_texts", batch.num_text as i64);
        drop(collate_span);
        let t_end = Instant::now();
        batch_span.record("rows", seqs.iter().map(|q| q.rows as i64).sum::<i64>());
        batch_span.record("cells", seqs.iter().map(|q| q.cells as i64).sum::<i64>());
        let stage_ns = stage_times(t0, t_bfs, t_asm, t_end);
        let end = crate::probes::usage(split_up);
        let used = end.since(usage0);
        // The run-queue wait before the build started (woken for this job,
        // waiting for a CPU): a starved thread waits there, between builds.
        let start_wait_ns = crate::probes::runqueue_since_last(usage0, end);
        // A context past `context_deadline_ms` is a stall too (the
        // in-context builds' own deadline feeds the same counter).
        let deadline_hits = seqs.iter().map(|q| q.deadline_hits).sum();
        let storage = self.storage_readings(&batch, &seqs, probed);
        let readings = BatchReadings {
            task: k as u32,
            db: self.tasks[k].db as u32,
            seeds: jobs.len() as u32,
            seq_len: s as u32,
            stage_ns,
            major_faults: used.major_faults,
            read_bytes: used.read_bytes,
            cpu_ns: used.cpu_ns,
            runqueue_ns: used.runqueue_ns + start_wait_ns,
            start_wait_ns,
            probed_ns: t_probe.elapsed().as_nanos() as u64 + start_wait_ns,
            integrity: self.integrity_readings(),
            stalls: deadline_hits,
            tasks: groups.len() as u32,
            seqs,
            ..self.group_seeds(groups, storage)
        };
        Ok(MadeBatch { batch, readings })
    }

    /// The block checks of every database so far (see
    /// `crate::format::Integrity`), summed over the mixture.
    fn integrity_readings(&self) -> IntegrityReadings {
        let mut r = IntegrityReadings::default();
        for d in &self.dbs {
            r.blocks_verified += d.db.integrity().blocks_verified();
            r.unverified_reads += d.db.integrity().unverified_reads();
        }
        r
    }

    /// A seed row is used only if it is a row of task `k`'s anchor table
    /// (payloads are not hashed at open; O(1), never out of bounds).
    fn check_anchors(&self, k: usize, jobs: &[(u32, u32, i64, u64)]) -> Result<()> {
        let plan = &self.tasks[k];
        let db = &*self.dbs[plan.db].db;
        let graph = db.graph();
        let anchor_table = db.metadata().tasks[plan.local].anchor_table as usize;
        match jobs
            .iter()
            .find(|j| graph.table_of(j.1) != Some(anchor_table))
        {
            None => Ok(()),
            Some(&(i, row, _, _)) => {
                let file = db.task_path(plan.local).unwrap_or(db.dir());
                let what = format!(
                    "seed {i}: anchor row {row} is not a row of the anchor table by graph.bin's row_table (a corrupt task or graph payload: run `headwater verify`)"
                );
                // A fault no block check finds (the payloads disagree): the
                // database is bad as a corrupt block makes it, so
                // `on_bad_database = "skip"` drops it (`drops.rs`).
                db.integrity().poison(file, what.clone());
                Err(Error::format(file, what))
            }
        }
    }

    /// Every context of `jobs` built as its unpacked self (budget `s`, the
    /// step's `S`) into `subgraphs`, in parallel (`min_len` contexts per job
    /// at least); with `examples`, as an in-context context (`examples.rs`).
    fn build_contexts(
        &self,
        (k, s): (usize, usize),
        split: Split,
        jobs: &[(u32, u32, i64, u64)],
        subgraphs: &mut [Subgraph],
        min_len: usize,
    ) -> Result<()> {
        if self.cfg.examples && self.build_in_context((k, s), split, jobs, subgraphs, min_len)? {
            return Ok(());
        }
        let builder = self.context_builder(k);
        self.pool.install(|| {
            subgraphs
                .par_iter_mut()
                .zip(jobs.par_iter())
                .with_min_len(min_len)
                .for_each(|(sub, job)| builder.build(job.1, job.2, job.3, s, sub));
        });
        Ok(())
    }

    /// Every context of `jobs` into `subgraphs`, group by group (each
    /// with its task's anchors checked and its task's builder).
    fn build_group_contexts(
        &self,
        groups: &[TaskGroup],
        (s, split): (usize, Split),
        jobs: &[(u32, u32, i64, u64)],
        subgraphs: &mut Vec<Subgraph>,
        min_len: usize,
    ) -> Result<()> {
        if subgraphs.len() != jobs.len() {
            subgraphs.resize_with(jobs.len(), Subgraph::default);
        }
        for (k, range) in groups {
            let r = range.clone();
            self.check_anchors(*k, &jobs[r.clone()])?;
            self.build_contexts((*k, s), split, &jobs[r.clone()], &mut subgraphs[r], min_len)?;
        }
        Ok(())
    }

    /// With `pack`: place the contexts (`crate::batch::pack`), cut the ones
    /// over their budgets to a prefix, and lay them out sequence after
    /// sequence, each sequence's contexts in draw order. Returns the seeds
    /// in that order and each sequence's first context
    /// (`start[q]..start[q + 1]`).
    fn pack(
        &self,
        k: usize,
        jobs: &[(u32, u32, i64, u64)],
        subgraphs: &mut Vec<Subgraph>,
    ) -> (Vec<u32>, Vec<usize>) {
        let (b, s) = (
            self.cfg.default_batch_size,
            self.cfg.default_sequence_length,
        );
        let builder = self.context_builder(k);
        let seed_cells = builder.seed_cells;
        let sizes: Vec<usize> = subgraphs.iter().map(|g| g.cells).collect();
        let plan = pack_contexts(&sizes, b, self.segment_slots, s, seed_cells);
        for ((sub, job), (&budget, &size)) in subgraphs
            .iter_mut()
            .zip(jobs)
            .zip(plan.budget.iter().zip(&sizes))
        {
            if budget < size {
                sub.keep_prefix(
                    budget,
                    builder.row_cells,
                    seed_cells,
                    builder.graph.row_time,
                    job.2,
                );
            }
        }
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_by_key(|&i| (plan.bin[i], i));
        let mut taken: Vec<Subgraph> = order
            .iter()
            .map(|&i| std::mem::take(&mut subgraphs[i]))
            .collect();
        std::mem::swap(subgraphs, &mut taken);
        let seq_seeds = order.iter().map(|&i| jobs[i].0).collect();
        let mut start = vec![0; b + 1];
        for &q in &plan.bin {
            start[q + 1] += 1;
        }
        for q in 0..b {
            start[q + 1] += start[q];
        }
        (seq_seeds, start)
    }
}

/// Tags the masking keys apart from a step's other keys.
const MASK_TAG: u64 = 0x6D61_736B;

/// Wall time of each stage (`crate::readings::stage`) from its marks.
fn stage_times(t0: Instant, t_bfs: Instant, t_asm: Instant, t_end: Instant) -> [u64; 4] {
    let mut stage_ns = [0; 4];
    stage_ns[stage::BFS] = (t_bfs - t0).as_nanos() as u64;
    stage_ns[stage::ASSEMBLE] = (t_asm - t_bfs).as_nanos() as u64;
    stage_ns[stage::COLLATE] = (t_end - t_asm).as_nanos() as u64;
    stage_ns[stage::TOTAL] = (t_end - t0).as_nanos() as u64;
    stage_ns
}

/// (task, seeds) of a batch of several tasks; empty for one task.
fn task_seeds(groups: &[TaskGroup]) -> Vec<(u32, u32)> {
    if groups.len() < 2 {
        return Vec::new();
    }
    groups
        .iter()
        .map(|(k, r)| (*k as u32, r.len() as u32))
        .collect()
}

impl SamplerCore {
    /// `r` with the seeds of each task, task kind and database of a batch
    /// whose tasks are `groups`.
    fn group_seeds(&self, groups: &[TaskGroup], r: BatchReadings) -> BatchReadings {
        BatchReadings {
            task_seeds: task_seeds(groups),
            kind_seeds: self.kind_seeds(groups),
            link_candidate_recall: self.link_candidate_recall(groups),
            db_seeds: self.db_seeds(groups),
            ..r
        }
    }

    /// Seeds of each task kind (`crate::readings::TASK_KINDS`) of a batch
    /// whose tasks are `groups`.
    fn kind_seeds(&self, groups: &[TaskGroup]) -> [u32; TASK_KINDS.len()] {
        let mut out = [0; TASK_KINDS.len()];
        for (k, r) in groups {
            out[self.tasks[*k].kind] += r.len() as u32;
        }
        out
    }

    /// The least stored candidate recall of the link tasks among `groups`.
    fn link_candidate_recall(&self, groups: &[TaskGroup]) -> Option<f64> {
        groups
            .iter()
            .filter_map(|(k, _)| {
                let plan = &self.tasks[*k];
                self.dbs[plan.db].db.metadata().tasks[plan.local].candidate_recall
            })
            .reduce(f64::min)
    }

    /// (database, seeds, reported) of a batch whose tasks span several
    /// databases (`task_mixing = "sequence"` over a mixture); empty for one.
    fn db_seeds(&self, groups: &[TaskGroup]) -> Vec<(u32, u32, bool)> {
        let mut out: Vec<(u32, u32, bool)> = Vec::new();
        for (k, r) in groups {
            let db = self.tasks[*k].db;
            match out.iter_mut().find(|e| e.0 as usize == db) {
                Some(e) => e.1 += r.len() as u32,
                None => out.push((db as u32, r.len() as u32, self.reported[db].is_some())),
            }
        }
        if out.len() < 2 {
            out.clear();
        }
        out
    }
}

/// Where a build reports: its span, start, threading and stall mark.
#[derive(Clone, Copy)]
pub(super) struct BuildCtx<'a, 'w> {
    /// The step's `S`.
    pub(super) seq_len: usize,
    /// The split of the batch's seeds (which examples they may see).
    pub(super) split: Split,
    pub(super) batch_span: &'a tracing::Span,
    pub(super) t0: Instant,
    pub(super) split_up: bool,
    pub(super) watched: Option<&'a Watched<'w>>,
}

/// Hash of the step's identity (its key, step, rank and world size), the
/// task and the drawn seeds.
#[allow(clippy::cast_possible_truncation)]
fn fingerprint(identity: [u64; 4], task: usize, seeds: &[u32]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for w in identity {
        h.update(&w.to_le_bytes());
    }
    h.update(&(task as u32).to_le_bytes());
    h.update(bytemuck::cast_slice(seeds));
    h.digest()
}
