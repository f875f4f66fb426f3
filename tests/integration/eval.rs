//! Evaluation passes on random synthetic databases: every seed of a split
//! once across ranks, in list order, equal batch counts per rank, padded
//! sequences marked invalid, deterministic, the training stream untouched by
//! interleaved passes, and a pass recorded in its split's drain only.

use std::sync::Arc;

use headwater::sampler::{eval_list, BatchMaker, EvalPass, Sampler, SamplerCore};
use headwater::{SamplerConfig, Split};
use proptest::prelude::*;

use crate::oracle::{arb_spec, build, config};

fn core(db: &Arc<headwater::Database>, cfg: SamplerConfig) -> Arc<SamplerCore> {
    Arc::new(SamplerCore::with_database(db.clone(), cfg).unwrap())
}

proptest! {
    #![proptest_config(config(12))]

    /// The eval shard rule: over `world` ranks, the valid sequences of a
    /// pass are the (capped) pass list, each entry exactly once, each rank
    /// in list order; every rank yields the same number of batches per
    /// task; only a task's last batch has padded (`seq_valid = 0`) rows.
    #[test]
    fn a_pass_covers_each_split_seed_once_across_ranks(
        spec in arb_spec(),
        world in 1u32..=3,
        b in 1usize..=5,
        cap in prop_oneof![Just(None), (1usize..=20).prop_map(Some)],
        test_split in any::<bool>(),
    ) {
        let Some(sdb) = build(&spec) else { return Ok(()) };
        let split = if test_split { Split::Test } else { Split::Val };
        let base = SamplerConfig {
            default_batch_size: b,
            default_sequence_length: 32,
            num_threads: Some(1),
            ..SamplerConfig::default()
        };
        let ntasks = sdb.db.metadata().tasks.len();
        let whole = core(&sdb.db, base.clone());
        let mut per_rank_counts = Vec::new();
        let mut seen: Vec<Vec<u32>> = vec![Vec::new(); ntasks];
        for rank in 0..world {
            let c = core(&sdb.db, SamplerConfig { rank, world_size: world, ..base.clone() });
            let pass = EvalPass::new(c, split, None, cap).unwrap();
            let counts: Vec<usize> = pass.tasks().iter().map(|t| t.batches).collect();
            let n = pass.len();
            let mut got = 0;
            for batch in pass {
                let batch = batch.unwrap();
                got += 1;
                prop_assert_eq!(batch.split, split);
                prop_assert_eq!(batch.seq_valid.len(), b);
                let k = batch.task_idx as usize;
                let valid: Vec<u32> = batch.seeds.iter().zip(&batch.seq_valid)
                    .filter(|(_, &v)| v == 1).map(|(&s, _)| s).collect();
                prop_assert!(batch.seq_valid.windows(2).all(|w| w[0] >= w[1]), "valid rows first");
                seen[k].extend(valid);
            }
            prop_assert_eq!(got, n);
            per_rank_counts.push(counts);
        }
        prop_assert!(per_rank_counts.windows(2).all(|w| w[0] == w[1]), "{:?}", per_rank_counts);
        for (k, s) in seen.iter_mut().enumerate() {
            let list = eval_list(&whole, k, split, cap).unwrap();
            let mut want = list.clone();
            want.sort_unstable();
            s.sort_unstable();
            prop_assert_eq!(&*s, &want, "task {} over {} ranks", k, world);
        }
    }
}

#[test]
fn a_pass_is_deterministic_and_leaves_the_training_stream_alone() {
    let spec = headwater::preprocess::SynthSpec {
        tables: 3,
        rows: vec![40, 60, 80],
        fks_per_table: 2,
        null_fk: 0.0,
        temporal: vec![false, true, true],
        hub_share: 0.0,
        seed: 7,
    };
    let sdb = build(&spec).expect("spec has seeds");
    let cfg = SamplerConfig {
        default_batch_size: 4,
        default_sequence_length: 64,
        num_threads: Some(2),
        ..SamplerConfig::default()
    };
    let c = core(&sdb.db, cfg);
    let prints = |mk: &mut BatchMaker, n: usize| -> Vec<u64> {
        (0..n)
            .map(|_| mk.next().unwrap().unwrap().fingerprint)
            .collect()
    };
    let mut alone = BatchMaker::new(c.clone(), Split::Train);
    let want = prints(&mut alone, 6);
    let pass_prints = |split| -> Vec<u64> {
        EvalPass::new(c.clone(), split, None, None)
            .unwrap()
            .map(|b| b.unwrap().fingerprint)
            .collect()
    };
    let first = pass_prints(Split::Val);
    assert!(!first.is_empty());
    let mut mixed = BatchMaker::new(c.clone(), Split::Train);
    let mut got = prints(&mut mixed, 3);
    assert_eq!(pass_prints(Split::Val), first, "a pass repeats exactly");
    let _ = pass_prints(Split::Test);
    got.extend(prints(&mut mixed, 3));
    assert_eq!(got, want, "evaluation does not move the training stream");
    assert!(EvalPass::new(c.clone(), Split::Train, None, None).is_err());
    assert!(EvalPass::new(c, Split::Val, Some(99), None).is_err());
}

fn value(drain: &[(String, f64)], key: &str) -> f64 {
    drain
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{key} not drained"))
        .1
}

/// A pass opened by the sampler is recorded in its split's drain: exactly
/// its batches and seeds per task (padded sequences in the batch size), the
/// pool rows reading the pass's progress; the train drain does not move.
#[test]
fn a_pass_feeds_its_splits_drain_and_not_the_train_drain() {
    let spec = headwater::preprocess::SynthSpec {
        tables: 3,
        rows: vec![40, 60, 80],
        fks_per_table: 2,
        null_fk: 0.0,
        temporal: vec![false, true, true],
        hub_share: 0.0,
        seed: 11,
    };
    let sdb = build(&spec).expect("spec has seeds");
    let b = 4;
    let cfg = SamplerConfig {
        default_batch_size: b,
        default_sequence_length: 64,
        num_threads: Some(1),
        ..SamplerConfig::default()
    };
    let s = Sampler::new(&sdb.dir, cfg).unwrap();
    for _ in 0..3 {
        s.next_batch(Split::Train).unwrap();
    }
    let train_before = s.drain_step_metrics(Split::Train).unwrap();
    assert_eq!(value(&train_before, "sampler/batches"), 3.0);
    let names: Vec<String> = sdb
        .db
        .metadata()
        .tasks
        .iter()
        .map(|t| t.name.clone())
        .collect();
    for split in [Split::Val, Split::Test] {
        assert!(
            s.drain_step_metrics(split).unwrap().is_empty(),
            "nothing before a pass"
        );
        let pass = s.eval_pass(split, None, Some(7)).unwrap();
        let per_task: Vec<(usize, usize)> =
            pass.tasks().iter().map(|t| (t.task, t.batches)).collect();
        let n = pass.len();
        assert!(n > 0);
        for batch in pass {
            batch.unwrap();
        }
        let drain = s.drain_step_metrics(split).unwrap();
        #[allow(clippy::cast_precision_loss)]
        {
            assert_eq!(value(&drain, "sampler/batches"), n as f64, "{split:?}");
            for &(k, batches) in &per_task {
                let key = format!("sampler/tasks/{}", names[k]);
                assert_eq!(value(&drain, &key), (batches * b) as f64, "{key}");
            }
        }
        // The last batch ends its task's share: nothing left in the pass.
        assert_eq!(value(&drain, "sampler/pool/remaining_min"), 0.0);
        assert_eq!(value(&drain, "sampler/pool/steps_to_exhaust_min"), 0.0);
        assert_eq!(value(&drain, "sampler/queue/depth_min"), 0.0);
        assert_eq!(value(&drain, "sampler/invariants/duplicate_seeds"), 0.0);
        assert!(value(&drain, "sampler/queue/wait_seconds") > 0.0);
    }
    assert!(
        s.drain_step_metrics(Split::Train).unwrap().is_empty(),
        "passes are not train batches"
    );
    assert!(s.eval_pass(Split::Train, None, None).is_err());
}
