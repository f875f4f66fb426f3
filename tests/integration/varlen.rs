//! Variable length (`sequence_lengths` at a fixed `tokens_per_batch`): each
//! step's `S` is a function of (seed, split, step) — the same on every rank
//! and thread count, after an exact or elastic resume and on replay — every
//! batch fills the budget (`B·S = tokens_per_batch`), the lengths are drawn
//! uniformly, and a state saved under another length recipe is refused.

use headwater::sampler::{BatchMaker, MadeBatch, SamplerCore};
use headwater::{Error, Sampler, SamplerConfig, Split};

use crate::oracle::same_batch;
use crate::support::golden_v1;

const LENGTHS: [usize; 3] = [16, 32, 64];
const TOKENS: usize = 128;

fn cfg() -> SamplerConfig {
    SamplerConfig {
        sequence_lengths: LENGTHS.to_vec(),
        tokens_per_batch: Some(TOKENS),
        num_threads: Some(1),
        num_prefetch: 2,
        ..SamplerConfig::default()
    }
}

fn with(threads: usize, rank: u32, world_size: u32) -> SamplerConfig {
    SamplerConfig {
        num_threads: Some(threads),
        rank,
        world_size,
        ..cfg()
    }
}

fn take(s: &Sampler, n: usize) -> Vec<MadeBatch> {
    (0..n)
        .map(|_| s.next_batch(Split::Train).unwrap())
        .collect()
}

/// (step, S, B, fingerprint) of each batch.
fn shapes(bs: &[MadeBatch]) -> Vec<(u64, usize, usize, u64)> {
    bs.iter()
        .map(|b| (b.step, b.seq_len, b.batch_size, b.fingerprint))
        .collect()
}

#[test]
fn every_batch_fills_the_budget_at_its_drawn_length() {
    let s = Sampler::new(golden_v1(), cfg()).unwrap();
    let bs = take(&s, 24);
    let core = s.core();
    for b in &bs {
        assert_eq!(b.batch_size * b.seq_len, TOKENS, "step {}", b.step);
        assert_eq!(b.seq_len, core.step_seq_len(Split::Train, b.step));
        assert_eq!(b.semantic_types.len(), TOKENS);
        assert_eq!(b.seeds.len(), b.batch_size);
    }
    let seen: std::collections::BTreeSet<usize> = bs.iter().map(|b| b.seq_len).collect();
    assert_eq!(seen.len(), LENGTHS.len(), "24 steps drew {seen:?}");
    // Telemetry reads the step's S.
    let made = BatchMaker::new(core.clone(), Split::Train)
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(made.readings.seq_len as usize, made.seq_len);
}

#[test]
fn lengths_are_drawn_uniformly() {
    let core = SamplerCore::new(golden_v1(), cfg()).unwrap();
    let n = 6000u64;
    let mut counts = [0u64; 3];
    for step in 0..n {
        let s = core.step_seq_len(Split::Train, step);
        counts[LENGTHS.iter().position(|&x| x == s).unwrap()] += 1;
    }
    for c in counts {
        // Binomial(6000, 1/3): sd 36.5; ±150 is over 4 sd.
        assert!(c.abs_diff(n / 3) < 150, "{counts:?}");
    }
    let other = SamplerCore::new(golden_v1(), SamplerConfig { seed: 1, ..cfg() }).unwrap();
    let differs =
        (0..64).any(|t| core.step_seq_len(Split::Train, t) != other.step_seq_len(Split::Train, t));
    assert!(differs, "the draw ignores the seed");
}

#[test]
fn same_lengths_on_every_rank_and_thread_count() {
    let one = shapes(&take(
        &Sampler::new(golden_v1(), with(1, 0, 1)).unwrap(),
        12,
    ));
    let two = shapes(&take(
        &Sampler::new(golden_v1(), with(2, 0, 1)).unwrap(),
        12,
    ));
    assert_eq!(one, two, "thread count changed a batch");
    let r0 = shapes(&take(
        &Sampler::new(golden_v1(), with(1, 0, 2)).unwrap(),
        12,
    ));
    let r1 = shapes(&take(
        &Sampler::new(golden_v1(), with(2, 1, 2)).unwrap(),
        12,
    ));
    for ((a, b), c) in r0.iter().zip(&r1).zip(&one) {
        assert_eq!((a.0, a.1, a.2), (b.0, b.1, b.2), "ranks disagree");
        assert_eq!((a.1, a.2), (c.1, c.2), "world size changed S");
    }
}

#[test]
fn exact_and_elastic_resume_and_replay_keep_the_lengths() {
    let whole = take(&Sampler::new(golden_v1(), with(1, 0, 1)).unwrap(), 14);
    let s = Sampler::new(golden_v1(), with(1, 0, 1)).unwrap();
    take(&s, 5);
    let state = s.state();
    drop(s);
    // Exact: same world size, another thread count.
    let r = Sampler::with_state(golden_v1(), with(2, 0, 1), Some(&state)).unwrap();
    let after = take(&r, 9);
    for (a, w) in after.iter().zip(&whole[5..]) {
        assert!(
            same_batch(a, w) && a.fingerprint == w.fingerprint,
            "step {}",
            a.step
        );
    }
    for step in [0u64, 3, 5, 13] {
        let b = r.replay_batch(Split::Train, step, None).unwrap();
        let w = &whole[step as usize];
        assert!(
            same_batch(&b, w) && b.fingerprint == w.fingerprint,
            "replay of {step}"
        );
    }
    drop(r);
    // Elastic: two ranks continue the one-rank stream with the same S per
    // step and the budget per rank.
    for rank in 0..2 {
        let e = Sampler::with_state(golden_v1(), with(1, rank, 2), Some(&state)).unwrap();
        for (a, w) in take(&e, 9).iter().zip(&whole[5..]) {
            assert_eq!(
                (a.step, a.seq_len, a.batch_size),
                (w.step, w.seq_len, w.batch_size)
            );
        }
    }
}

#[test]
fn a_state_of_another_length_recipe_is_refused_naming_the_key() {
    let s = Sampler::new(golden_v1(), cfg()).unwrap();
    take(&s, 2);
    let state = s.state();
    drop(s);
    let fixed = SamplerConfig {
        num_threads: Some(1),
        ..SamplerConfig::default()
    };
    let changes = [
        (
            "sequence_lengths",
            SamplerConfig {
                sequence_lengths: vec![16, 32],
                ..cfg()
            },
        ),
        (
            "tokens_per_batch",
            SamplerConfig {
                tokens_per_batch: Some(256),
                ..cfg()
            },
        ),
        ("sequence_lengths", fixed.clone()),
    ];
    for (key, c) in changes {
        match Sampler::with_state(golden_v1(), c, Some(&state)) {
            Err(Error::State { field, .. }) => assert_eq!(field, key),
            other => panic!(
                "expected a refusal naming {key}, got {:?}",
                other.map(|_| ())
            ),
        }
    }
    // And a fixed-length state under a variable-length config.
    let f = Sampler::new(golden_v1(), fixed).unwrap();
    take(&f, 1);
    let fstate = f.state();
    drop(f);
    match Sampler::with_state(golden_v1(), cfg(), Some(&fstate)) {
        Err(Error::State { field, .. }) => assert_eq!(field, "sequence_lengths"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn the_val_stream_and_evaluation_passes_keep_the_fixed_shape() {
    let cfg = SamplerConfig {
        default_batch_size: 4,
        default_sequence_length: 48,
        ..cfg()
    };
    let s = Sampler::new(golden_v1(), cfg).unwrap();
    let pass: Vec<MadeBatch> = s
        .eval_pass(Split::Val, None, Some(7))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(!pass.is_empty());
    for b in &pass {
        assert_eq!((b.batch_size, b.seq_len), (4, 48));
    }
    // So does the val stream (its losses stay comparable step to step).
    for _ in 0..6 {
        let b = s.next_batch(Split::Val).unwrap();
        assert_eq!((b.batch_size, b.seq_len), (4, 48));
    }
}
