//! `headwater bench --ranker-recall`: how close a ranker's examples come
//! to the `walks` ranker's (docs/contexts.md).
//!
//! For `seeds` seeds of each task with examples (evenly spaced over the
//! task's seeds, each with its own key and recipe draw), the context is
//! built three times: with `walks` (the reference), with `walks` again on
//! an independent walk generator (the ceiling: `walks` is random too), and
//! with the ranker measured (on a third generator, or on the reference's
//! with `same_key`). `k` is the number of tier-1 examples the reference
//! takes; recall@k is the share of them among the first `k` tier-1
//! examples of the other build, summed over the seeds. Each ranker's
//! builds are timed on the thread's CPU clock, one thread.

use serde::Serialize;

use crate::context::{
    build_in_context, BfsScratch, ExampleParams, ExampleScratch, SeqRecipe, Subgraph,
};
use crate::error::Result;
use crate::maker::SamplerCore;
use crate::ranking::rankers::Ranker;
use crate::rng::mix64;
use crate::seeds::Split;

/// One task's recall and rates.
#[derive(Debug, Clone, Serialize)]
pub struct TaskRecall {
    /// The task's name.
    pub task: String,
    /// Seeds measured.
    pub seeds: usize,
    /// Seeds whose reference context took a tier-1 example.
    pub with_examples: usize,
    /// Mean `k` (tier-1 examples of the reference) over those seeds.
    pub k_mean: f64,
    /// recall@k of the measured ranker against the reference (`None`:
    /// no seed took an example).
    pub recall: Option<f64>,
    /// recall@k of an independent `walks` run against it (the ceiling).
    pub recall_walks: Option<f64>,
    /// Walk steps per context of the measured ranker and of `walks`.
    pub steps_per_context: f64,
    /// The same for `walks`.
    pub walks_steps_per_context: f64,
    /// Contexts built per CPU-second by the measured ranker.
    pub contexts_per_cpu_s: f64,
    /// The same for `walks`.
    pub walks_contexts_per_cpu_s: f64,
}

/// The calling thread's CPU time (s).
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Recall and time sums of one task.
#[derive(Default)]
struct Sums {
    k: usize,
    hits: usize,
    hits_walks: usize,
    with: usize,
    steps: [u64; 2],
    cpu: [f64; 2],
}

impl SamplerCore {
    /// recall@k of `ranker` against `walks`, per task with examples (see
    /// the module doc); `same_key`: on the reference's walk generator.
    pub fn ranker_recall(
        &self,
        seeds: usize,
        ranker: Ranker,
        same_key: bool,
    ) -> Result<Vec<TaskRecall>> {
        let mut out = Vec::new();
        for k in 0..self.tasks.len() {
            if self.weights()[k] > 0.0 {
                out.extend(self.task_recall(k, seeds, ranker, same_key)?);
            }
        }
        Ok(out)
    }

    /// [`ranker_recall`](Self::ranker_recall) of task `k` (`None`: a query
    /// task, without examples).
    fn task_recall(
        &self,
        k: usize,
        seeds: usize,
        ranker: Ranker,
        same_key: bool,
    ) -> Result<Option<TaskRecall>> {
        let plan = &self.tasks[k];
        let task = self.dbs[plan.db].db.task(plan.local)?;
        let n = task.anchor_rows.len();
        let seeds = seeds.min(n);
        let c = &self.cfg;
        // Seeds of every split, each shown every split's labels (test's
        // rule): the rankers are compared, not a split's contexts.
        let len = self.cfg.default_sequence_length;
        let sums = self.with_example_params((k, len), Split::Test, |g, p| {
            let mut s = Sums::default();
            // The reference, the ceiling's independent run, the ranker.
            let runs = [
                ExampleParams { ..*p },
                ExampleParams { walk_salt: 1, ..*p },
                ExampleParams {
                    ranker,
                    walk_salt: if same_key { 0 } else { 2 },
                    ..*p
                },
            ];
            let mut subs: [Subgraph; 3] = Default::default();
            let (mut bs, mut ex) = (BfsScratch::default(), ExampleScratch::default());
            for i in 0..seeds {
                let j = i * n / seeds;
                let (row, obs) = (task.anchor_rows[j], task.obs_times[j]);
                let key = mix64(0x7265_6361_6c6c ^ i as u64);
                let r =
                    SeqRecipe::draw(key, &c.local_context_sizes, &c.bfs_widths, &c.prefer_latest);
                for (m, (run, sub)) in runs.iter().zip(subs.iter_mut()).enumerate() {
                    let t0 = thread_cpu_s();
                    build_in_context(
                        g,
                        row,
                        obs,
                        key,
                        &r,
                        run,
                        c.bfs_child_width,
                        &mut bs,
                        &mut ex,
                        sub,
                    );
                    // Slot 0 the measured ranker, slot 1 the reference.
                    let slot = [Some(1), None, Some(0)][m];
                    if let Some(slot) = slot {
                        s.cpu[slot] += thread_cpu_s() - t0;
                        s.steps[slot] += sub.walk_steps;
                    }
                }
                s.add(&subs);
            }
            s
        })?;
        let Some(s) = sums else { return Ok(None) };
        let per = |x: u64| x as f64 / seeds.max(1) as f64;
        let share = |h: usize| (s.k > 0).then(|| h as f64 / s.k as f64);
        Ok(Some(TaskRecall {
            task: self.task_names()[k].clone(),
            seeds,
            with_examples: s.with,
            k_mean: if s.with == 0 {
                0.0
            } else {
                s.k as f64 / s.with as f64
            },
            recall: share(s.hits),
            recall_walks: share(s.hits_walks),
            steps_per_context: per(s.steps[0]),
            walks_steps_per_context: per(s.steps[1]),
            contexts_per_cpu_s: seeds as f64 / s.cpu[0].max(1e-9),
            walks_contexts_per_cpu_s: seeds as f64 / s.cpu[1].max(1e-9),
        }))
    }
}

impl Sums {
    /// Count one seed: the reference's tier-1 examples (`subs[0]`) found
    /// among the first `k` of the ceiling run's and the measured ranker's.
    fn add(&mut self, subs: &[Subgraph; 3]) {
        let tier1 = |s: &Subgraph| {
            s.example_rows
                .iter()
                .filter(|e| e.1 == 1)
                .map(|e| e.0)
                .collect::<Vec<u32>>()
        };
        let reference = tier1(&subs[0]);
        let k = reference.len();
        if k == 0 {
            return;
        }
        let hits = |s: &Subgraph| {
            tier1(s)
                .iter()
                .take(k)
                .filter(|r| reference.contains(r))
                .count()
        };
        self.k += k;
        self.with += 1;
        self.hits_walks += hits(&subs[1]);
        self.hits += hits(&subs[2]);
    }
}
