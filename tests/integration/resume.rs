//! Resume: the sampler state as of delivery, exact continuation at the same
//! world size (any thread count), elastic continuation at another world size
//! (each seed once per epoch across ranks), refusals naming the field,
//! resume-neutral telemetry, `skip` and `replay_batch` across a resume.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use headwater::preprocess::SynthSpec;
use headwater::sampler::{BatchMaker, MadeBatch, SamplerCore};
use headwater::seeds::split_seeds;
use headwater::stream::{SamplerState, STATE_VERSION};
use headwater::{Error, Sampler, SamplerConfig, Split, TaskPick};
use proptest::prelude::*;

use crate::oracle::{arb_spec, build, config, same_batch, SynthDb};

fn fp(b: &MadeBatch) -> u64 {
    b.fingerprint
}

/// `n` batches of `split` from a running sampler.
fn take(s: &Sampler, split: Split, n: u64) -> Vec<MadeBatch> {
    (0..n).map(|_| s.next_batch(split).unwrap()).collect()
}

/// Config for the rank `rank` of `world_size`.
fn on(cfg: &SamplerConfig, rank: u32, world_size: u32) -> SamplerConfig {
    SamplerConfig {
        rank,
        world_size,
        ..cfg.clone()
    }
}

fn has_seeds(db: &Arc<headwater::Database>, cfg: &SamplerConfig) -> bool {
    [Split::Train, Split::Val].iter().all(|&split| {
        let core = SamplerCore::with_database(db.clone(), cfg.clone()).unwrap();
        BatchMaker::new(Arc::new(core), split)
            .next()
            .unwrap()
            .is_ok()
    })
}

proptest! {
    #![proptest_config(config(16))]

    /// N steps uninterrupted vs. (k steps, state, a new sampler from the
    /// state, N − k steps), for every rank of world sizes 1..=3, with the
    /// resumed sampler on another thread count: identical batches and
    /// fingerprints for train and val, and the same state at the end (up to
    /// the resume count). Prefetched batches are not consumed by the state.
    #[test]
    fn resume_continues_bit_identically(
        spec in arb_spec(),
        world_size in 1u32..=3,
        (n, k) in (1u64..=8).prop_flat_map(|n| (Just(n), 0..=n)),
        (vn, vk) in (0u64..=3).prop_flat_map(|n| (Just(n), 0..=n)),
        b in 1usize..=5,
        rr in any::<bool>(),
        seed in any::<u64>(),
        threads in 1usize..=2,
    ) {
        let Some(sdb) = build(&spec) else { return Ok(()) };
        let cfg = SamplerConfig {
            default_batch_size: b,
            default_sequence_length: 48,
            max_hops: 2,
            bfs_child_width: 3,
            task_pick: if rr { TaskPick::RoundRobin } else { TaskPick::Weighted },
            seed,
            num_threads: Some(threads),
            num_prefetch: 3,
            ..SamplerConfig::default()
        };
        if !has_seeds(&sdb.db, &cfg) {
            return Ok(());
        }
        for rank in 0..world_size {
            let c = on(&cfg, rank, world_size);
            let whole = Sampler::new(&sdb.dir, c.clone()).unwrap();
            let want_train = take(&whole, Split::Train, n);
            let want_val = take(&whole, Split::Val, vn);
            let first = Sampler::new(&sdb.dir, c.clone()).unwrap();
            take(&first, Split::Train, k);
            take(&first, Split::Val, vk);
            let state = first.state();
            prop_assert_eq!(state.splits["train"].step, k, "prefetched batches counted as consumed");
            prop_assert_eq!(state.splits["val"].step, vk);
            drop(first);
            let state = SamplerState::from_json(&state.to_json()).unwrap();
            let c2 = SamplerConfig { num_threads: Some(3 - threads), num_prefetch: 1, ..c.clone() };
            let resumed = Sampler::with_state(&sdb.dir, c2, Some(&state)).unwrap();
            let got_train = take(&resumed, Split::Train, n - k);
            let got_val = take(&resumed, Split::Val, vn - vk);
            for (a, b) in want_train[k as usize..].iter().zip(&got_train) {
                prop_assert_eq!((a.step, fp(a)), (b.step, fp(b)), "train, rank {} of {}", rank, world_size);
                prop_assert!(same_batch(a, b), "train step {} differs after resume", a.step);
            }
            for (a, b) in want_val[vk as usize..].iter().zip(&got_val) {
                prop_assert_eq!((a.step, fp(a)), (b.step, fp(b)), "val, rank {} of {}", rank, world_size);
                prop_assert!(same_batch(a, b), "val step {} differs after resume", a.step);
            }
            let (mut s1, mut s2) = (whole.state(), resumed.state());
            for r in s2.splits.values_mut() {
                prop_assert_eq!(r.resumes, 1);
                r.resumes = 0;
            }
            s1.splits.values_mut().for_each(|r| r.resumes = 0);
            prop_assert_eq!(s1, s2, "states differ after the same deliveries");
        }
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// `skip_batches(n)` lands exactly where `n` built batches do, for any
    /// rank and world size, and so does a replay of the step after it.
    #[test]
    fn skip_lands_where_building_does(
        spec in arb_spec(),
        (world_size, rank) in (1u32..=3).prop_flat_map(|w| (Just(w), 0..w)),
        n in 0u64..12,
        b in 1usize..=4,
        seed in any::<u64>(),
    ) {
        let Some(sdb) = build(&spec) else { return Ok(()) };
        let cfg = SamplerConfig {
            rank,
            world_size,
            default_batch_size: b,
            default_sequence_length: 24,
            max_hops: 1,
            seed,
            num_threads: Some(1),
            ..SamplerConfig::default()
        };
        let core = Arc::new(SamplerCore::with_database(sdb.db.clone(), cfg).unwrap());
        let mut built = BatchMaker::new(core.clone(), Split::Train);
        let mut skipped = BatchMaker::new(core.clone(), Split::Train);
        let mut want = None;
        for _ in 0..=n {
            match built.next().unwrap() {
                Ok(batch) => want = Some(batch),
                Err(_) => return Ok(()), // no train seeds: nothing to skip over
            }
        }
        let want = want.unwrap();
        core.skip_batches(&mut skipped.state, n).unwrap();
        let got = skipped.next().unwrap().unwrap();
        prop_assert_eq!((got.step, fp(&got)), (n, fp(&want)));
        prop_assert!(same_batch(&got, &want));
        let again = core.replay_batch(Split::Train, n).unwrap();
        prop_assert!(same_batch(&again, &want) && fp(&again) == fp(&want));
    }
}

/// A database with several tasks of a few hundred seeds each.
fn elastic_db() -> SynthDb {
    build(&SynthSpec {
        null_fk: 0.0,
        ..SynthSpec::small(3, 120, 23)
    })
    .expect("synthesizes")
}

fn elastic_cfg() -> SamplerConfig {
    SamplerConfig {
        default_batch_size: 5,
        default_sequence_length: 32,
        max_hops: 1,
        bfs_child_width: 2,
        num_threads: Some(1),
        num_prefetch: 2,
        seed: 99,
        ..SamplerConfig::default()
    }
}

/// Every rank's `split` batches for `steps` steps, by step.
fn run_ranks(
    dir: &Path,
    cfg: &SamplerConfig,
    world: u32,
    state: Option<&SamplerState>,
    split: Split,
    steps: u64,
) -> (Vec<Vec<MadeBatch>>, Vec<SamplerState>) {
    let mut per_step: Vec<Vec<MadeBatch>> = (0..steps).map(|_| Vec::new()).collect();
    let mut states = Vec::new();
    for rank in 0..world {
        let s = Sampler::with_state(dir, on(cfg, rank, world), state).unwrap();
        for (t, b) in take(&s, split, steps).into_iter().enumerate() {
            per_step[t].push(b);
        }
        states.push(s.state());
    }
    (per_step, states)
}

/// 4 ranks for k steps, then 2 (or 3) ranks from rank 0's state: per task,
/// the seeds delivered across ranks in global order (step, then rank) form
/// whole epochs that are each the pool exactly once, across the reshard —
/// no seed repeated, none skipped. Every rank's state is the same value.
#[test]
fn reshard_delivers_each_seed_once_per_epoch() {
    let sdb = elastic_db();
    let cfg = elastic_cfg();
    let core = SamplerCore::with_database(sdb.db.clone(), cfg.clone()).unwrap();
    for split in [Split::Train, Split::Val] {
        let lens = core.split_state(split).pool_lens();
        let pools: Vec<Vec<u32>> = (0..lens.len())
            .map(|k| {
                let rows = sdb.db.task(k).unwrap().anchor_rows;
                split_seeds(k as u32, rows, split, cfg.split_seed, cfg.split_ratios)
            })
            .collect();
        assert!(lens.iter().all(|&l| l >= 8), "{split:?} pools {lens:?}");
        for (k_steps, after) in [(7u64, 2u32), (5, 3), (9, 1)] {
            let (before, states) = run_ranks(&sdb.dir, &cfg, 4, None, split, k_steps);
            assert!(
                states.windows(2).all(|w| w[0] == w[1]),
                "ranks disagree on the state"
            );
            let saved = &states[0];
            // Long enough for every pool to run three epochs (picks are
            // weighted at random: a generous margin).
            let most = lens.iter().max().unwrap() * lens.len() as u64;
            let more = 6 * most / (after as u64 * cfg.default_batch_size as u64) + 20;
            let (later, resumed) = run_ranks(&sdb.dir, &cfg, after, Some(saved), split, more);
            let spans = &resumed[0].splits[split.name()].world_sizes;
            assert_eq!(spans, &vec![(0, 4), (k_steps, after)]);
            let mut seq: HashMap<usize, Vec<u32>> = HashMap::new();
            for step in before.iter().chain(&later) {
                let task = step[0].task_idx as usize;
                assert!(
                    step.iter().all(|b| b.task_idx as usize == task),
                    "ranks picked different tasks"
                );
                assert!(step.iter().all(|b| b.readings.duplicate_seeds == 0));
                for b in step {
                    seq.entry(task).or_default().extend_from_slice(&b.seeds);
                }
            }
            assert_eq!(seq.len(), lens.len(), "every task picked");
            for (task, seeds) in seq {
                let len = lens[task] as usize;
                assert!(seeds.len() >= 3 * len, "task {task}: fewer than 3 epochs");
                let chunks: Vec<&[u32]> = seeds.chunks(len).collect();
                for (e, chunk) in chunks.iter().enumerate() {
                    let mut got = chunk.to_vec();
                    got.sort_unstable();
                    let before_dedup = got.len();
                    got.dedup();
                    assert_eq!(got.len(), before_dedup, "{split:?} task {task} epoch {e}: a seed repeated (reshard 4 -> {after} at {k_steps})");
                    if chunk.len() == len {
                        assert_eq!(
                            &got, &pools[task],
                            "{split:?} task {task} epoch {e}: not the pool once"
                        );
                    } else {
                        assert!(got.iter().all(|x| pools[task].binary_search(x).is_ok()));
                    }
                }
            }
        }
    }
}

/// A state taken on one database, with one config, checked against others.
#[test]
fn incompatible_states_are_refused_naming_the_field() {
    let sdb = elastic_db();
    let cfg = elastic_cfg();
    let s = Sampler::new(&sdb.dir, cfg.clone()).unwrap();
    take(&s, Split::Train, 3);
    let state = s.state();
    drop(s);
    let ntasks = sdb.db.metadata().tasks.len();
    let mut weights = vec![1.0; ntasks];
    weights[0] = 2.0;
    let changes: Vec<(&str, SamplerConfig)> = vec![
        (
            "split_ratios",
            SamplerConfig {
                split_ratios: [0.7, 0.2, 0.1],
                ..cfg.clone()
            },
        ),
        (
            "split_seed",
            SamplerConfig {
                split_seed: 1,
                ..cfg.clone()
            },
        ),
        (
            "seed",
            SamplerConfig {
                seed: 100,
                ..cfg.clone()
            },
        ),
        (
            "task_weights",
            SamplerConfig {
                task_weights: Some(weights.into()),
                ..cfg.clone()
            },
        ),
        (
            "task_pick",
            SamplerConfig {
                task_pick: TaskPick::RoundRobin,
                ..cfg.clone()
            },
        ),
        (
            "default_batch_size",
            SamplerConfig {
                default_batch_size: 6,
                ..cfg.clone()
            },
        ),
        (
            "default_sequence_length",
            SamplerConfig {
                default_sequence_length: 64,
                ..cfg.clone()
            },
        ),
        (
            "bfs_child_width",
            SamplerConfig {
                bfs_child_width: 3,
                ..cfg.clone()
            },
        ),
        (
            "max_hops",
            SamplerConfig {
                max_hops: 2,
                ..cfg.clone()
            },
        ),
        (
            "temporal_filter",
            SamplerConfig {
                temporal_filter: false,
                ..cfg.clone()
            },
        ),
        (
            "pool_fraction",
            SamplerConfig {
                pool_fraction: 0.5,
                ..cfg.clone()
            },
        ),
    ];
    for (field, c) in changes {
        match Sampler::with_state(&sdb.dir, c, Some(&state)) {
            Err(Error::State { field: f, what }) => {
                assert_eq!(f, field, "{what}");
                assert!(what.contains(field), "{what}");
            }
            other => panic!(
                "{field}: expected a state refusal, got {:?}",
                other.map(|_| ())
            ),
        }
    }
    // Harmless changes are accepted.
    let harmless = SamplerConfig {
        num_prefetch: 5,
        num_threads: Some(2),
        telemetry: false,
        debug_batch_delay_ms: 1.0,
        max_rss_bytes: Some(1 << 40),
        rank: 1,
        world_size: 3,
        ..cfg.clone()
    };
    Sampler::with_state(&sdb.dir, harmless, Some(&state)).unwrap();
    // Another snapshot.
    let other = build(&SynthSpec {
        null_fk: 0.0,
        ..SynthSpec::small(3, 120, 24)
    })
    .unwrap();
    match Sampler::with_state(&other.dir, cfg.clone(), Some(&state)) {
        Err(Error::State { field, .. }) => assert_eq!(field, "content_hash"),
        other => panic!(
            "expected a content_hash refusal, got {:?}",
            other.map(|_| ())
        ),
    }
    // Unknown versions, another format, a malformed state.
    let json: serde_json::Value = serde_json::from_str(&state.to_json()).unwrap();
    let edit = |key: &str, v: serde_json::Value| {
        let mut j = json.clone();
        j[key] = v;
        SamplerState::from_json(&j.to_string())
    };
    let newer = edit("version", (STATE_VERSION + 1).into()).unwrap_err();
    assert!(
        matches!(&newer, Error::State { field, what } if field == "version" && what.contains("newer")),
        "{newer}"
    );
    let older = edit("version", 0.into()).unwrap_err();
    assert!(
        matches!(&older, Error::State { field, .. } if field == "version"),
        "{older}"
    );
    let fmt = edit("format", "something-else".into()).unwrap_err();
    assert!(
        matches!(&fmt, Error::State { field, .. } if field == "format"),
        "{fmt}"
    );
    let bad = edit("splits", serde_json::json!({"train": {"step": 1}})).unwrap_err();
    assert!(
        matches!(&bad, Error::State { field, .. } if field == "state"),
        "{bad}"
    );
    // A cursor outside its pool.
    let mut j = json.clone();
    j["splits"]["train"]["pools"][0]["cursor"] = 1_000_000.into();
    let st = SamplerState::from_json(&j.to_string()).unwrap();
    match Sampler::with_state(&sdb.dir, cfg, Some(&st)) {
        Err(Error::State { field, .. }) => assert_eq!(field, "splits.train.pools.cursor"),
        other => panic!("expected a cursor refusal, got {:?}", other.map(|_| ())),
    }
}

fn drains(s: &Sampler, n: u64) -> Vec<HashMap<String, f64>> {
    (0..n)
        .map(|_| {
            s.next_batch(Split::Train).unwrap();
            s.drain_step_metrics(Split::Train)
                .unwrap()
                .into_iter()
                .collect()
        })
        .collect()
}

/// After a resume the pool, pick and mix telemetry continue from the saved
/// values (no spurious exhaust event, no reset of `steps_since_pick`), and
/// `sampler/resumes` counts the resume once.
#[test]
fn telemetry_continues_across_a_resume() {
    let sdb = elastic_db();
    let ntasks = sdb.db.metadata().tasks.len();
    let mut weights = vec![1.0; ntasks];
    weights[ntasks - 1] = 0.05; // rarely picked: a long steps_since_pick
    let cfg = SamplerConfig {
        task_weights: Some(weights.into()),
        pool_fraction: 0.2,
        ..elastic_cfg()
    };
    let (n, k) = (40u64, 23u64);
    let whole = drains(&Sampler::new(&sdb.dir, cfg.clone()).unwrap(), n);
    let first = Sampler::new(&sdb.dir, cfg.clone()).unwrap();
    drains(&first, k);
    let state = first.state();
    drop(first);
    let resumed = drains(
        &Sampler::with_state(&sdb.dir, cfg, Some(&state)).unwrap(),
        n - k,
    );
    let neutral = |key: &str| {
        let name = &key["sampler/".len()..];
        name.starts_with("pool/")
            || name.starts_with("mix/")
            || name.starts_with("tasks/")
            || name.starts_with("invariants/")
            || name == "batches"
    };
    let exhausts: f64 = whole.iter().map(|d| d["sampler/pool/exhaust_events"]).sum();
    assert!(exhausts > 0.0, "the run should cross an epoch boundary");
    assert!(whole[k as usize]["sampler/pool/steps_since_pick_max"] > 1.0);
    for (i, (a, b)) in whole[k as usize..].iter().zip(&resumed).enumerate() {
        for (key, va) in a.iter().filter(|(key, _)| neutral(key)) {
            assert_eq!(
                va.to_bits(),
                b[key].to_bits(),
                "{key} at step {} after the resume",
                k as usize + i
            );
        }
        assert_eq!(a["sampler/resumes"], 0.0);
        assert_eq!(
            b["sampler/resumes"],
            (i == 0) as u8 as f64,
            "resumes at drain {i}"
        );
    }
}

/// `skip(n)` on a running sampler (with batches queued) continues exactly
/// where an unskipped stream is `n` steps later; `replay_batch` rebuilds
/// batches delivered before a resume and a reshard, by any old rank.
#[test]
fn skip_and_replay_across_a_resume() {
    let sdb = elastic_db();
    let cfg = SamplerConfig {
        num_prefetch: 4,
        ..elastic_cfg()
    };
    let whole: Vec<Vec<MadeBatch>> = (0..2)
        .map(|rank| {
            take(
                &Sampler::new(&sdb.dir, on(&cfg, rank, 2)).unwrap(),
                Split::Train,
                16,
            )
        })
        .collect();
    let s = Sampler::new(&sdb.dir, on(&cfg, 1, 2)).unwrap();
    take(&s, Split::Train, 3);
    let t0 = Instant::now();
    while s.queue_depth(Split::Train).unwrap() < 4 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    s.skip(Split::Train, 4).unwrap();
    assert_eq!(s.state().splits["train"].step, 7);
    let b = s.next_batch(Split::Train).unwrap();
    assert_eq!((b.step, fp(&b)), (7, fp(&whole[1][7])));
    assert!(same_batch(&b, &whole[1][7]));
    s.skip(Split::Train, 0).unwrap();
    assert_eq!(s.next_batch(Split::Train).unwrap().step, 8);
    let state = s.state();
    drop(s);
    // Reshard 2 -> 3 at step 9; rank 2 did not exist before.
    let r = Sampler::with_state(&sdb.dir, on(&cfg, 2, 3), Some(&state)).unwrap();
    let after = take(&r, Split::Train, 3);
    for old_rank in 0..2u32 {
        for step in [0u64, 5, 8] {
            let b = r.replay_batch(Split::Train, step, Some(old_rank)).unwrap();
            assert!(
                same_batch(&b, &whole[old_rank as usize][step as usize]),
                "rank {old_rank} step {step}"
            );
            assert_eq!(fp(&b), fp(&whole[old_rank as usize][step as usize]));
        }
    }
    for b in &after {
        let again = r.replay_batch(Split::Train, b.step, None).unwrap();
        assert!(
            same_batch(&again, b) && fp(&again) == fp(b),
            "step {}",
            b.step
        );
    }
    match r.replay_batch(Split::Train, 3, Some(2)) {
        Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, "rank"),
        other => panic!(
            "rank 2 did not exist at step 3, got {:?}",
            other.map(|_| ())
        ),
    }
    // load_state_dict on a running sampler: back to step 9 on rank 2 of 3.
    take(&r, Split::Train, 2);
    r.load_state(&state).unwrap();
    let again = take(&r, Split::Train, 3);
    for (a, b) in after.iter().zip(&again) {
        assert!(
            same_batch(a, b) && fp(a) == fp(b),
            "step {} after load_state",
            a.step
        );
    }
    // The resume count is the saved state's plus one (not this process's).
    assert_eq!(r.state().splits["train"].resumes, 1);
}
