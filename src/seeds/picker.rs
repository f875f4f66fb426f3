//! Choosing one task per batch: a pure function of the step, the same on
//! every rank.

use super::hot::HotSets;
use crate::config::TaskPick;
use crate::rng::mix64;

/// (task index, cumulative weight) of the tasks one table draws from.
type Table = Vec<(u32, f64)>;

/// Picks the task of each step among the tasks with weight > 0 whose global
/// pool in the split is not empty. Stateless: `pick(step)` depends only on
/// the construction arguments and `step`, so every rank picks the same task
/// at the same step whatever its rank, world size or history.
#[derive(Debug, Clone)]
pub struct TaskPicker {
    mode: TaskPick,
    /// (task index, cumulative weight) of eligible tasks with weight > 0.
    cumulative: Vec<(u32, f64)>,
    key: u64,
    /// With hot sets: the schedule, and each group's own `cumulative`.
    hot: Option<(HotSets, Vec<Table>)>,
}

impl TaskPicker {
    /// `weights[k]` for every task; `eligible[k]` = task has seeds in the
    /// split; `key` seeds the weighted choice (derived from seed and split).
    pub fn new(mode: TaskPick, weights: &[f64], eligible: &[bool], key: u64) -> Self {
        let mut acc = 0.0;
        let mut cumulative = Vec::new();
        for (k, (&w, &ok)) in weights.iter().zip(eligible).enumerate() {
            if ok && w > 0.0 {
                acc += w;
                cumulative.push((k as u32, acc));
            }
        }
        TaskPicker {
            mode,
            cumulative,
            key,
            hot: None,
        }
    }

    /// This picker drawing one hot set at a time (`crate::seeds::HotSets`):
    /// the databases (`task_db[k]`: task `k`'s) cut into groups of at most
    /// `budget` of their `db_bytes`, over cycles of `cycle` steps; a step
    /// draws among its group's tasks by their weights.
    #[must_use]
    pub fn with_hot_sets(
        mut self,
        db_bytes: &[u64],
        budget: u64,
        cycle: u64,
        task_db: &[usize],
    ) -> Self {
        let mut w = vec![0.0; db_bytes.len()];
        for (k, own) in own_weights(&self.cumulative) {
            if let Some(x) = task_db.get(k as usize).and_then(|&d| w.get_mut(d)) {
                *x += own;
            }
        }
        let hot = HotSets::new(db_bytes, budget, &w, cycle);
        let mut tables = vec![Vec::new(); hot.len()];
        for (k, own) in own_weights(&self.cumulative) {
            let g = hot.group_of(task_db.get(k as usize).copied().unwrap_or(0));
            let t: &mut Table = &mut tables[g];
            let acc = t.last().map_or(0.0, |x| x.1);
            t.push((k, acc + own));
        }
        self.hot = Some((hot, tables));
        self
    }

    /// The hot sets this picker draws, if any.
    pub fn hot_sets(&self) -> Option<&HotSets> {
        self.hot.as_ref().map(|h| &h.0)
    }

    /// With hot sets, the task mix the schedule expects over `steps` (each
    /// step's group's weights, normalised, averaged over the steps; `n`
    /// tasks): what a window of recent picks is measured against, since a
    /// span draws one group only. `None` without hot sets.
    pub fn expected_mix(&self, steps: std::ops::Range<u64>, n: usize) -> Option<Vec<f64>> {
        self.hot.as_ref()?;
        let mut w = vec![0.0; n];
        let len = steps.end.saturating_sub(steps.start).max(1) as f64;
        for step in steps {
            let table = self.table(step);
            let total = table.last().map_or(0.0, |c| c.1);
            for (k, own) in own_weights(table) {
                if let Some(x) = w.get_mut(k as usize) {
                    *x += own / total / len;
                }
            }
        }
        Some(w)
    }

    /// The (task, cumulative weight) table of `step`: its hot set's, or
    /// every eligible task's.
    fn table(&self, step: u64) -> &[(u32, f64)] {
        match &self.hot {
            Some((h, tables)) => match tables.get(h.at(step)) {
                Some(t) if !t.is_empty() => t,
                _ => &self.cumulative,
            },
            None => &self.cumulative,
        }
    }

    /// Tasks that can be picked.
    pub fn tasks(&self) -> impl Iterator<Item = u32> + '_ {
        self.cumulative.iter().map(|&(k, _)| k)
    }

    /// No task can be picked (no weighted task has seeds here).
    pub fn is_empty(&self) -> bool {
        self.cumulative.is_empty()
    }

    /// The task of `step` (the picker must not be empty). Round robin cycles
    /// through the eligible tasks in index order; weighted draws
    /// `u = mix64(key ^ mix64(step)) / 2^64` and takes the first task whose
    /// cumulative weight exceeds `u · total`.
    pub fn pick(&self, step: u64) -> u32 {
        let table = self.table(step);
        match self.mode {
            TaskPick::RoundRobin => table[(step % table.len() as u64) as usize].0,
            TaskPick::Weighted => weighted(
                table,
                mix64(self.key ^ mix64(step.wrapping_add(0xD1B5_4A32_D192_ED03))),
            ),
        }
    }
}

impl TaskPicker {
    /// The task of global sequence slot `slot` of step `step` when each
    /// sequence draws its own (`task_mixing = "sequence"`), with
    /// `per_step` slots per step: weighted, from its own hash of (step,
    /// slot); round robin, cycling over the step's slots in order.
    pub fn pick_slot(&self, step: u64, slot: u64, per_step: u64) -> u32 {
        let table = self.table(step);
        match self.mode {
            TaskPick::RoundRobin => {
                let n = table.len() as u64;
                let i = step.wrapping_mul(per_step).wrapping_add(slot) % n;
                table[i as usize].0
            }
            TaskPick::Weighted => {
                let h = mix64(step.wrapping_add(0x9E37_79B9_7F4A_7C15))
                    ^ slot.wrapping_mul(0xA24B_AED4_963E_E407);
                weighted(table, mix64(self.key ^ 0x5EC5_0000_0000_0001 ^ mix64(h)))
            }
        }
    }
}

/// Each task of a cumulative `table` with its own weight.
fn own_weights(table: &[(u32, f64)]) -> impl Iterator<Item = (u32, f64)> + '_ {
    table.iter().scan(0.0, |prev, &(k, c)| {
        Some((k, c - std::mem::replace(prev, c)))
    })
}

/// The first task of `table` whose cumulative weight exceeds `u · total`,
/// `u` the top 53 bits of `bits` as a fraction of 1.
fn weighted(table: &[(u32, f64)], bits: u64) -> u32 {
    let total = table.last().map_or(0.0, |c| c.1);
    let x = (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * total;
    let i = table.partition_point(|&(_, c)| c <= x);
    table[i.min(table.len() - 1)].0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_follows_weights_and_skips_ineligible() {
        let p = TaskPicker::new(
            TaskPick::Weighted,
            &[1.0, 3.0, 5.0, 0.0],
            &[true, true, false, true],
            1,
        );
        let mut c = [0u32; 4];
        for step in 0..40_000 {
            c[p.pick(step) as usize] += 1;
        }
        assert_eq!((c[2], c[3]), (0, 0));
        assert!((c[1] as f64 / c[0] as f64 - 3.0).abs() < 0.15, "{c:?}");
        // A pure function of the step.
        assert_eq!(p.pick(12_345), p.clone().pick(12_345));
        let rr = TaskPicker::new(
            TaskPick::RoundRobin,
            &[1.0, 1.0, 1.0],
            &[true, false, true],
            1,
        );
        let seq: Vec<u32> = (0..4).map(|s| rr.pick(s)).collect();
        assert_eq!(seq, vec![0, 2, 0, 2]);
    }

    /// With hot sets a step draws only its group's tasks, and over whole
    /// cycles the tasks keep their weights.
    #[test]
    fn hot_sets_draw_one_group_at_a_time_and_keep_the_weights() {
        let w = [1.0, 1.0, 2.0, 4.0];
        let base = TaskPicker::new(TaskPick::Weighted, &w, &[true; 4], 5);
        // Tasks 0, 1 in database 0; 2 in 1; 3 in 2; databases of 60, 50, 70
        // bytes under a 110-byte budget: groups {0, 1}, {2}.
        let p = base
            .clone()
            .with_hot_sets(&[60, 50, 70], 110, 400, &[0, 0, 1, 2]);
        assert_eq!(p.hot_sets().map(HotSets::len), Some(2));
        let mut c = [0u32; 4];
        for step in 0..40_000 {
            let k = p.pick(step) as usize;
            let g = usize::from(k == 3);
            assert_eq!(p.hot_sets().unwrap().at(step), g, "step {step} task {k}");
            for slot in 0..4 {
                let ks = p.pick_slot(step, slot, 4);
                assert_eq!(usize::from(ks == 3), g);
            }
            c[k] += 1;
        }
        let share = |k: usize| f64::from(c[k]) / 40_000.0;
        for (k, want) in [0.125, 0.125, 0.25, 0.5].into_iter().enumerate() {
            assert!((share(k) - want).abs() < 0.01, "task {k}: {c:?}");
        }
        assert_eq!(
            base.pick(77),
            TaskPicker::new(TaskPick::Weighted, &w, &[true; 4], 5).pick(77)
        );
        // The expected mix of a span is its group's; of a whole cycle, the weights.
        let near =
            |got: &[f64], want: [f64; 4]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-9);
        let first = p.expected_mix(0..10, 4).unwrap();
        assert!(
            near(&first, [0.25, 0.25, 0.5, 0.0]),
            "steps 0..10, the first group: {first:?}"
        );
        let cycle = p.expected_mix(0..400, 4).unwrap();
        assert!(
            near(&cycle, [0.125, 0.125, 0.25, 0.5]),
            "a whole cycle: {cycle:?}"
        );
        assert!(base.expected_mix(0..10, 4).is_none());
    }
}
