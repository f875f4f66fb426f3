//! The `walks` ranker's engine against a plain reference walker: the
//! per-row visit frequencies of many walks agree (RT-J's semantics: a step
//! uniform over the row's parents and its children visible at the seed's
//! time), and the comparison is sharp enough to tell a walker that ignores
//! the time apart. The `expected` ranker's counts against the same walker.

use headwater::format::GraphView;
use headwater::preprocess::SynthSpec;
use headwater::ranking::expected::Spread;
use headwater::ranking::walks::{WalkCounts, WalkGraph, WalkParams};
use headwater::rng::Xoshiro256pp;
use headwater::SamplerConfig;

use crate::oracle::build;

/// Visit counts of every row of `table` over `n` walks of `len` rows from
/// `seed`, one walk at a time over the graph's own CSR.
fn reference(
    g: &GraphView<'_>,
    seed: u32,
    cutoff: i64,
    n: usize,
    len: usize,
    table: (u32, u32),
) -> Vec<f64> {
    let mut rng = Xoshiro256pp::seed_from_u64(99);
    let mut counts = vec![0.0; (table.1 - table.0) as usize];
    let mut next = Vec::new();
    for _ in 0..n {
        let mut u = seed;
        for step in 0..len {
            if (table.0..table.1).contains(&u) {
                counts[(u - table.0) as usize] += 1.0;
            }
            if step + 1 == len {
                break;
            }
            next.clear();
            next.extend_from_slice(g.parents(u));
            next.extend_from_slice(g.children_visible_at(u, cutoff));
            if next.is_empty() {
                break;
            }
            u = next[rng.below(next.len() as u64) as usize];
        }
    }
    counts
}

/// Half the L1 distance between two count vectors as distributions.
fn tvd(a: &[f64], b: &[f64]) -> f64 {
    let (sa, sb) = (a.iter().sum::<f64>(), b.iter().sum::<f64>());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x / sa - y / sb).abs())
        .sum::<f64>()
        / 2.0
}

/// For three seeds of a synthetic database's table 1, `count` fills the
/// counts for the seed's walk parameters: they must be within 0.03 (total
/// variation) of the reference walker's over the same number of walks and,
/// for some seed, more than 0.1 from a walker that ignores time (so the
/// comparison can fail).
fn matches_the_reference(
    what: &str,
    mut count: impl FnMut(&WalkGraph, u32, &WalkParams, &mut WalkCounts),
) {
    let sdb = build(&SynthSpec {
        null_fk: 0.0,
        ..SynthSpec::small(4, 150, 21)
    })
    .expect("synthesizes");
    let g = sdb.db.graph();
    let wg = WalkGraph::new(&g).unwrap();
    let table = g.table_rows[1];
    let (n, len) = (40_000, 6);
    let mut w = WalkCounts::default();
    let mut timeless_gap = 0.0f64;
    for seed in [table.0 + 30, table.0 + 75, table.0 + 140] {
        let cutoff = g.row_time[seed as usize];
        let p = WalkParams {
            num_walks: n,
            walk_length: len,
            cutoff,
            bound: cutoff,
            table,
        };
        count(&wg, seed, &p, &mut w);
        let ours: Vec<f64> = (table.0..table.1).map(|r| f64::from(w.get(r))).collect();
        let theirs = reference(&g, seed, cutoff, n, len, table);
        let d = tvd(&ours, &theirs);
        assert!(
            d < 0.03,
            "{what}, seed {seed}: visit counts differ (TVD {d:.4})"
        );
        let timeless = reference(&g, seed, i64::MAX, n, len, table);
        timeless_gap = timeless_gap.max(tvd(&ours, &timeless));
    }
    assert!(
        timeless_gap > 0.1,
        "{what}: the comparison cannot tell a walker ignoring time apart (TVD {timeless_gap:.4})"
    );
}

#[test]
fn walk_visit_frequencies_match_a_reference_walker_and_tell_a_timeless_one_apart() {
    let mut rng = Xoshiro256pp::seed_from_u64(5);
    matches_the_reference("walks", |wg, seed, p, w| {
        w.walk(wg, seed, p, &mut rng, None).unwrap();
    });
}

#[test]
fn expected_visits_match_the_reference_walker_and_tell_a_timeless_one_apart() {
    let mut spread = Spread::default();
    let prune = SamplerConfig::default().expected_prune as f32;
    matches_the_reference("expected", |wg, seed, p, w| {
        let updates = spread.expected(wg, seed, p, prune, w, None).unwrap();
        assert!(updates > 0);
        // Never more visits than the walks can make.
        let total: f64 = (p.table.0..p.table.1).map(|r| f64::from(w.get(r))).sum();
        assert!(
            total <= (p.num_walks * p.walk_length) as f64 * 1.0001,
            "{total}"
        );
        // Deterministic: the same counts again, and none left over.
        let first: Vec<u32> = (p.table.0..p.table.1).map(|r| w.get(r)).collect();
        let again = spread.expected(wg, seed, p, prune, w, None).unwrap();
        assert_eq!(again, updates);
        let second: Vec<u32> = (p.table.0..p.table.1).map(|r| w.get(r)).collect();
        assert_eq!(first, second);
    });
}

#[test]
fn a_passed_deadline_stops_the_expected_ranker() {
    let sdb = build(&SynthSpec::small(4, 150, 21)).expect("synthesizes");
    let g = sdb.db.graph();
    let wg = WalkGraph::new(&g).unwrap();
    let table = g.table_rows[1];
    let (n, len) = (40_000, 6);
    let mut w = WalkCounts::default();
    let mut spread = Spread::default();
    let prune = SamplerConfig::default().expected_prune as f32;
    let p = WalkParams {
        num_walks: n,
        walk_length: len,
        cutoff: 0,
        bound: 0,
        table,
    };
    let now = std::time::Instant::now();
    assert!(
        spread
            .expected(&wg, table.0, &p, prune, &mut w, Some(now))
            .is_err(),
        "a passed deadline stops it"
    );
}
