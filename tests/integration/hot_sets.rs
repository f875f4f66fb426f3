//! Hot sets (`hot_set_bytes`): a train step draws only its group's
//! databases, the groups take turns in spans as long as their weights'
//! shares, whole cycles follow the mixture, the validation split keeps every
//! database, the readings count each span and the next group's read-ahead
//! and measure the mix against the schedule, and a resumed run continues
//! the same schedule.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use headwater::config::TaskWeights;
use headwater::preprocess::{synth_database, SynthSpec};
use headwater::sampler::{BatchMaker, SamplerCore};
use headwater::{SamplerConfig, Split};

use crate::oracle::scratch_dir;

const CYCLE: u64 = 100;

/// Four tiny databases and a config whose hot sets are {db0, db1} and
/// {db2, db3}: the budget holds two of them, not three.
fn hot() -> (tempfile::TempDir, Vec<PathBuf>, SamplerConfig) {
    let tmp = scratch_dir();
    let paths: Vec<PathBuf> = (0..4)
        .map(|i| {
            let p = tmp.path().join(format!("db{i}"));
            synth_database(&p, &SynthSpec::small(2, 30, 200 + i as u64)).unwrap();
            p
        })
        .collect();
    let base = SamplerConfig {
        default_batch_size: 4,
        default_sequence_length: 48,
        num_threads: Some(2),
        telemetry: true,
        database_weights: Some(TaskWeights::List(vec![1.0, 1.0, 1.0, 1.0])),
        ..SamplerConfig::default()
    };
    let core = SamplerCore::open_mixture(&paths, base.clone()).unwrap();
    let size: Vec<u64> = core.dbs.iter().map(|d| d.db.bytes_on_disk()).collect();
    let budget = (size[0] + size[1]).max(size[2] + size[3]);
    assert!(size[..3].iter().sum::<u64>() > budget, "{size:?}");
    let cfg = SamplerConfig {
        hot_set_bytes: Some(budget),
        hot_set_steps: CYCLE,
        ..base
    };
    (tmp, paths, cfg)
}

#[test]
fn train_steps_draw_one_group_at_a_time_and_cycles_follow_the_weights() {
    let (_tmp, paths, cfg) = hot();
    let core = SamplerCore::open_mixture(&paths, cfg).unwrap();
    let train = core.split_state(Split::Train);
    let db_of = |step: u64| core.task_database(train.pick(step).unwrap());
    let mut counts = [0u32; 4];
    for step in 0..4 * CYCLE {
        let d = db_of(step);
        counts[d] += 1;
        // Equal weights: the first half of each cycle is {db0, db1}.
        let first_half = step % CYCLE < CYCLE / 2;
        assert_eq!(d < 2, first_half, "step {step} drew db{d}");
    }
    // Each database near its quarter (binomial, 200 draws per group half).
    for c in counts {
        assert!((70..=130).contains(&c), "{counts:?}");
    }
    // The validation split is not scheduled: a span of it reaches both groups.
    let val = core.split_state(Split::Val);
    let seen: BTreeSet<usize> = (0..CYCLE / 2)
        .map(|s| core.task_database(val.pick(s).unwrap()))
        .collect();
    assert!(seen.contains(&0) && seen.contains(&3), "{seen:?}");
}

#[test]
fn each_span_is_counted_and_the_next_group_read_ahead() {
    let (_tmp, paths, cfg) = hot();
    let core = Arc::new(SamplerCore::open_mixture(&paths, cfg).unwrap());
    let (mut rotations, mut prefetched, mut tv) = (0u32, 0u64, (0f64, 0f64));
    let mut waited = 0f64;
    let mut maker = BatchMaker::new(core.clone(), Split::Train);
    for step in 0..2 * CYCLE {
        let made = maker.next().unwrap().unwrap();
        rotations += made.readings.hot_set_rotations;
        prefetched += made.readings.prefetched_bytes;
        waited = waited.max(made.readings.draw.database_steps_since_pick_max);
        // Once the mix window is full (a few picks are far from any mix).
        if step >= headwater::sampler::MIX_WINDOW as u64 {
            let d = &made.readings.draw;
            tv = (tv.0.max(d.tv_distance), tv.1.max(d.database_tv_distance));
        }
    }
    // Steps 0, 50, 100, 150 start spans.
    assert_eq!(rotations, 4);
    // The mix is measured against the schedule: a span of one group is no
    // skew (against the whole mixture's weights it would read about 0.5).
    assert!(
        tv.0 < 0.25 && tv.1 < 0.25,
        "tasks {}, databases {}",
        tv.0,
        tv.1
    );
    // A database waiting for its span is not starved: the wait counts its
    // group's steps only (the other group's span alone is CYCLE / 2 steps;
    // one of two databases missed 40 steps running is a 2^-40 chance).
    assert!(waited < 40.0, "{waited}");
    // The read-ahead thread reports its bytes with a later batch.
    let group: u64 = core.dbs[2..].iter().map(|d| d.db.bytes_on_disk()).sum();
    for _ in 0..500 {
        if prefetched > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        prefetched += maker.next().unwrap().unwrap().readings.prefetched_bytes;
    }
    assert!(prefetched >= group, "{prefetched} of at least {group}");
    // Without hot sets: nothing counted.
    let plain = SamplerConfig {
        hot_set_bytes: None,
        ..core.cfg.clone()
    };
    let core = Arc::new(SamplerCore::open_mixture(&paths, plain).unwrap());
    let mut maker = BatchMaker::new(core, Split::Train);
    let quiet: u32 = (0..CYCLE)
        .map(|_| maker.next().unwrap().unwrap().readings.hot_set_rotations)
        .sum();
    assert_eq!(quiet, 0);
}

#[test]
fn a_resumed_run_continues_the_schedule_and_other_hot_sets_are_refused() {
    let (_tmp, paths, cfg) = hot();
    let core = Arc::new(SamplerCore::open_mixture(&paths, cfg.clone()).unwrap());
    let straight: Vec<u64> = BatchMaker::new(core.clone(), Split::Train)
        .take(60)
        .map(|b| b.unwrap().fingerprint)
        .collect();
    let mut mk = BatchMaker::new(core.clone(), Split::Train);
    for _ in 0..45 {
        mk.next().unwrap().unwrap();
    }
    let lens = mk.state.pool_lens();
    let saved = core.capture(&[(Split::Train, &mk.state.stream, &lens)]);
    let back = headwater::sampler::SamplerState::from_json(&saved.to_json()).unwrap();
    let again = SamplerCore::open_mixture(&paths, cfg.clone()).unwrap();
    let fresh = again.split_state(Split::Train);
    let stream = again.restore(&back, std::slice::from_ref(&fresh)).unwrap();
    let mut state = fresh;
    state.stream = stream.into_iter().next().unwrap();
    let rest: Vec<u64> = (0..15)
        .map(|_| again.make_batch(&mut state).unwrap().fingerprint)
        .collect();
    assert_eq!(rest, straight[45..], "across the span boundary at step 50");
    for other in [
        SamplerConfig {
            hot_set_steps: CYCLE + 1,
            ..cfg.clone()
        },
        SamplerConfig {
            hot_set_bytes: None,
            ..cfg.clone()
        },
    ] {
        let o = SamplerCore::open_mixture(&paths, other).unwrap();
        let f = o.split_state(Split::Train);
        match o.restore(&back, std::slice::from_ref(&f)) {
            Err(headwater::Error::State { field, .. }) => {
                assert!(field.starts_with("hot_set"), "{field}");
            }
            r => panic!("restored across other hot sets: {:?}", r.map(|_| ())),
        }
    }
}
