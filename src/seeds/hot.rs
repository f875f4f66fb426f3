//! Hot sets of a corpus larger than memory (`hot_set_bytes`,
//! docs/sampling.md): the databases of a mixture cut, in mixture order, into
//! **groups** whose files fit `hot_set_bytes`, and a schedule that trains
//! on one group at a time.
//!
//! The schedule is a cycle of `hot_set_steps` train steps in which each
//! group holds one contiguous **span** of steps, as long as its share of the
//! mixture's weight: step `t` belongs to the group whose slice of the
//! cumulative weight holds `((t mod C) + ½) / C`. Inside its span a step
//! draws among the group's tasks only, by their weights. Over a cycle each
//! database therefore gets its weight's share of the steps (its group's
//! share, split by weight inside the group), and a window of whole cycles
//! follows the mixture; inside a span the run reads one group, a working
//! set of at most `hot_set_bytes`. The next group is announced
//! [`lead`](HotSets::prefetch_at) steps before its span, so its files can be
//! read into the page cache while the current group trains.
//!
//! Determinism: the groups depend only on the databases' sizes on disk and
//! the keys, never on the host (its memory, its cgroup): every rank of
//! every host draws the same group at the same step, so the global batch
//! follows the weights whatever each host's budget. The schedule is a pure
//! function of the step: resume, replay and thread counts see the same
//! groups.
//!
//! Never: a step of a group whose tasks have no weight, or a database in
//! two groups.

/// The groups and their spans.
#[derive(Debug, Clone, PartialEq)]
pub struct HotSets {
    /// Per database of the mixture: its group.
    group_of: Vec<usize>,
    /// Groups of the cut.
    groups: usize,
    /// The cycle's spans: (first position in the cycle, group), ascending.
    spans: Vec<(u64, usize)>,
    /// Steps of a cycle.
    cycle: u64,
}

impl HotSets {
    /// Cut databases of sizes `bytes` (mixture order) into groups of at
    /// most `budget` bytes each (a database larger than `budget` is a group
    /// of its own), with `weights[d]`, each database's share of the
    /// mixture's weight (summing to more than 0), over cycles of `cycle`
    /// steps (at least 1).
    pub fn new(bytes: &[u64], budget: u64, weights: &[f64], cycle: u64) -> Self {
        let (mut group_of, mut filled, mut group) = (Vec::with_capacity(bytes.len()), 0u64, 0);
        for (d, &b) in bytes.iter().enumerate() {
            if d > 0 && filled.saturating_add(b) > budget {
                group += 1;
                filled = 0;
            }
            filled = filled.saturating_add(b);
            group_of.push(group);
        }
        let mut w = vec![0.0; group + 1];
        for (d, &g) in group_of.iter().enumerate() {
            w[g] += weights.get(d).copied().unwrap_or(0.0).max(0.0);
        }
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let cumulative: Vec<f64> = w
            .iter()
            .map(|&x| {
                acc += x;
                if total > 0.0 {
                    acc / total
                } else {
                    1.0
                }
            })
            .collect();
        let cycle = cycle.max(1);
        let mut spans: Vec<(u64, usize)> = Vec::new();
        for pos in 0..cycle {
            let u = (pos as f64 + 0.5) / cycle as f64;
            let g = cumulative.partition_point(|&c| c <= u).min(group);
            if spans.last().is_none_or(|s| s.1 != g) {
                spans.push((pos, g));
            }
        }
        HotSets {
            group_of,
            groups: group + 1,
            spans,
            cycle,
        }
    }

    /// Groups of the cut.
    pub fn len(&self) -> usize {
        self.groups
    }

    /// Whether the cut holds no group (no database).
    pub fn is_empty(&self) -> bool {
        self.group_of.is_empty()
    }

    /// Database `d`'s group.
    pub fn group_of(&self, d: usize) -> usize {
        self.group_of.get(d).copied().unwrap_or(0)
    }

    /// The databases of group `g`, in mixture order.
    pub fn members(&self, g: usize) -> impl Iterator<Item = usize> + '_ {
        self.group_of
            .iter()
            .enumerate()
            .filter(move |x| *x.1 == g)
            .map(|x| x.0)
    }

    /// The span of `step`'s position in the cycle: its index in `spans`.
    fn span(&self, step: u64) -> usize {
        let pos = step % self.cycle;
        self.spans.partition_point(|s| s.0 <= pos).saturating_sub(1)
    }

    /// The group of train step `step`.
    pub fn at(&self, step: u64) -> usize {
        self.spans.get(self.span(step)).map_or(0, |s| s.1)
    }

    /// Whether `step` starts a new span (another group than the step
    /// before; step 0 opens the first).
    pub fn rotates_at(&self, step: u64) -> bool {
        step == 0 || self.at(step) != self.at(step - 1)
    }

    /// Steps of `from..to` that belong to group `g`'s spans: how long a
    /// database of `g` has been scheduled since a step, which is what its
    /// starvation readings count (a group waiting for its span is not
    /// starved). O(spans).
    pub fn steps_on(&self, g: usize, from: u64, to: u64) -> u64 {
        self.steps_before(g, to)
            .saturating_sub(self.steps_before(g, from))
    }

    /// Steps of `0..n` in group `g`'s spans.
    fn steps_before(&self, g: usize, n: u64) -> u64 {
        let (cycles, pos) = (n / self.cycle, n % self.cycle);
        let mut per_cycle = 0;
        let mut partial = 0;
        for (i, &(start, group)) in self.spans.iter().enumerate() {
            if group != g {
                continue;
            }
            let end = self.spans.get(i + 1).map_or(self.cycle, |s| s.0);
            per_cycle += end - start;
            partial += pos.clamp(start, end) - start;
        }
        cycles * per_cycle + partial
    }

    /// The group to read ahead at `step`, if `step` is the one a quarter of
    /// the current span (at least one step) before the next span starts.
    pub fn prefetch_at(&self, step: u64) -> Option<usize> {
        let i = self.span(step);
        let (start, g) = *self.spans.get(i)?;
        let end = self.spans.get(i + 1).map_or(self.cycle, |s| s.0);
        let next = self.spans.get(i + 1).unwrap_or(&self.spans[0]).1;
        let lead = ((end - start) / 4).max(1);
        (next != g && step % self.cycle + lead == end).then_some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_fit_the_budget_in_mixture_order() {
        let h = HotSets::new(&[40, 50, 30, 200, 10], 100, &[1.0; 5], 100);
        let groups: Vec<usize> = (0..5).map(|d| h.group_of(d)).collect();
        assert_eq!(
            groups,
            vec![0, 0, 1, 2, 3],
            "a database over budget is alone"
        );
        assert_eq!(h.members(0).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(h.len(), 4);
    }

    /// Over a cycle each group holds its weight's share of the steps, in
    /// one span, and a cycle's spans come back every cycle.
    #[test]
    fn spans_follow_the_weights_and_repeat() {
        let w = [0.1, 0.2, 0.3, 0.4];
        let h = HotSets::new(&[1, 1, 1, 1], 1, &w, 1000);
        let mut steps = [0u32; 4];
        let mut rotations = 0;
        for t in 0..3000 {
            steps[h.at(t)] += 1;
            rotations += u32::from(h.rotates_at(t));
            assert_eq!(h.at(t), h.at(t + 1000));
        }
        assert_eq!(steps, [300, 600, 900, 1200]);
        assert_eq!(rotations, 12, "one span per group per cycle");
        let zero = HotSets::new(&[1, 1, 1], 1, &[1.0, 0.0, 1.0], 10);
        assert!(
            (0..100).all(|t| zero.at(t) != 1),
            "no step for a weightless group"
        );
    }

    /// The steps a group is scheduled, over any range, are its spans'.
    #[test]
    fn steps_on_counts_a_group_s_scheduled_steps() {
        let h = HotSets::new(&[1, 1, 1], 1, &[0.5, 0.25, 0.25], 100);
        for (from, to) in [(0, 0), (0, 1), (10, 260), (49, 51), (75, 375), (0, 1000)] {
            for g in 0..3 {
                let want = (from..to).filter(|&t| h.at(t) == g).count() as u64;
                assert_eq!(h.steps_on(g, from, to), want, "group {g}, {from}..{to}");
            }
        }
        assert_eq!(h.steps_on(1, 300, 200), 0, "an empty range");
    }

    #[test]
    fn the_next_group_is_announced_once_a_quarter_span_ahead() {
        let h = HotSets::new(&[1, 1], 1, &[0.5, 0.5], 100);
        let due: Vec<(u64, usize)> = (0..200)
            .filter_map(|t| h.prefetch_at(t).map(|g| (t, g)))
            .collect();
        assert_eq!(due, vec![(38, 1), (88, 0), (138, 1), (188, 0)]);
        let one = HotSets::new(&[1, 1], 10, &[0.5, 0.5], 100);
        assert_eq!(one.len(), 1);
        assert!((0..200).all(|t| one.prefetch_at(t).is_none() && !one.rotates_at(t + 1)));
    }
}
