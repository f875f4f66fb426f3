//! Packing (`pack = true`): every drawn seed is placed once, each sequence's
//! contexts in draw order;
//! segments are contiguous and isolated (rows, edges and the three
//! orderings never cross a segment); `pack_factor = 1` is the unpacked
//! layout; resume and replay stay exact.

use std::sync::Arc;

use headwater::sampler::{BatchMaker, MadeBatch, SamplerCore};
use headwater::stream::SamplerState;
use headwater::{Error, Sampler, SamplerConfig, Split};
use proptest::prelude::*;

use crate::oracle::{arb_spec, build, config, same_batch};

/// Check one packed batch's layout against the rules of `batch/pack.rs`.
#[allow(clippy::too_many_lines)]
fn check_packed(b: &MadeBatch, core: &SamplerCore) -> Result<(), TestCaseError> {
    let (s, k, r) = (b.seq_len, b.segments, b.max_rows);
    let per_task = core.seeds_per_step(b.task_idx as usize);
    let pf = core.cfg.pack_factor;
    prop_assert_eq!(k, core.segment_slots(), "segment slots");
    if pf > 0 {
        prop_assert_eq!(k, if pf == 1 { 1 } else { 2 * pf }, "2·pack_factor slots");
        prop_assert_eq!(per_task, b.batch_size * pf, "B·pack_factor seeds");
    } else {
        prop_assert!(per_task >= b.batch_size && per_task.div_ceil(b.batch_size) * 2 <= k.max(2));
    }
    prop_assert_eq!(b.seeds.len(), per_task, "the task's seeds per step drawn");
    // Every draw is placed once; a sequence's segments are its contexts in
    // draw order (checked where the batch drew no seed twice).
    let count = |q: usize| usize::from(b.target_count[q]);
    let mut placed: Vec<u32> = (0..b.batch_size)
        .flat_map(|q| b.segment_seeds[q * k..q * k + count(q)].iter().copied())
        .collect();
    let mut drawn = b.seeds.clone();
    placed.sort_unstable();
    drawn.sort_unstable();
    prop_assert_eq!(&placed, &drawn, "every drawn seed is placed once");
    let distinct = drawn.windows(2).all(|w| w[0] != w[1]);
    for q in 0..b.batch_size {
        let cells = q * s..(q + 1) * s;
        if distinct {
            let at: Vec<usize> = b.segment_seeds[q * k..q * k + count(q)]
                .iter()
                .map(|x| b.seeds.iter().position(|y| y == x).unwrap_or(usize::MAX))
                .collect();
            prop_assert!(
                at.windows(2).all(|w| w[0] < w[1]),
                "segments in draw order: {:?}",
                at
            );
        }
        let seg = &b.segment_ids[cells.clone()];
        let pad = &b.is_padding[cells.clone()];
        let rows = &b.seq_row_ids[cells.clone()];
        let tpos = &b.target_pos[q * k..q * k + count(q)];
        prop_assert!((1..=k).contains(&count(q)), "1 to K segments");
        prop_assert!(
            b.segment_seeds[q * k + count(q)..(q + 1) * k]
                .iter()
                .all(|&x| x == u32::MAX),
            "unused slots"
        );
        // Segments are contiguous runs in order, padding only at the tail.
        let used = pad.iter().take_while(|&&p| p == 0).count();
        prop_assert!(pad[used..].iter().all(|&p| p == 1), "padding is the tail");
        prop_assert_eq!(used as u32, b.readings.seqs[q].cells);
        prop_assert!(seg[used..].iter().all(|&x| x == u16::MAX));
        prop_assert!(seg[..used]
            .windows(2)
            .all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        for (j, &p) in tpos.iter().enumerate() {
            let p = usize::from(p);
            prop_assert!(
                p < used && usize::from(seg[p]) == j,
                "target of segment {} at {}",
                j,
                p
            );
            prop_assert!(
                p == 0 || usize::from(seg[p - 1]) == j - 1,
                "segment {} starts at its target",
                j
            );
        }
        let targets: Vec<usize> = (0..s).filter(|&p| b.is_target[q * s + p] == 1).collect();
        let want: Vec<usize> = tpos.iter().map(|&p| usize::from(p)).collect();
        prop_assert_eq!(
            targets,
            want,
            "is_target marks exactly the segments' targets"
        );
        // Rows: each segment owns a contiguous range, in segment order.
        let mut range = vec![(u16::MAX, 0u16); count(q)];
        for p in 0..used {
            let e = &mut range[usize::from(seg[p])];
            e.0 = e.0.min(rows[p]);
            e.1 = e.1.max(rows[p]);
        }
        prop_assert!(
            range.windows(2).all(|w| w[0].1 < w[1].0),
            "row ranges {:?}",
            range
        );
        let seg_of_row = |row: usize| {
            range
                .iter()
                .position(|&(lo, hi)| (lo as usize..=hi as usize).contains(&row))
        };
        for i in 0..r {
            for j in 0..r {
                if b.fk_adj[q * r * r + i * r + j] == 1 {
                    prop_assert!(
                        seg_of_row(i).is_some() && seg_of_row(i) == seg_of_row(j),
                        "edge {}->{} crosses segments",
                        i,
                        j
                    );
                }
            }
        }
        // Orderings: permutations that visit segment after segment, padding last.
        for perm in [&b.col_perm, &b.out_perm, &b.in_perm] {
            let perm = &perm[cells.clone()];
            let mut seen = vec![false; s];
            for &p in perm {
                prop_assert!(!seen[usize::from(p)], "not a permutation");
                seen[usize::from(p)] = true;
            }
            let segs: Vec<u16> = perm.iter().map(|&p| seg[usize::from(p)]).collect();
            prop_assert!(
                segs.windows(2).all(|w| w[0] <= w[1]),
                "an ordering interleaves segments"
            );
        }
        let col = &b.column_ids[cells];
        for w in b.col_perm[q * s..q * s + used].windows(2) {
            let (a, c) = (usize::from(w[0]), usize::from(w[1]));
            prop_assert!(
                seg[a] < seg[c] || col[a] <= col[c],
                "col_perm not by column within a segment"
            );
        }
    }
    Ok(())
}

/// A core for `cfg`, or `None` when the database's widest seed row does not
/// fit `pack_factor` times (a config error naming `pack_factor`).
fn core(sdb: &crate::oracle::SynthDb, cfg: SamplerConfig) -> Option<Arc<SamplerCore>> {
    match SamplerCore::with_database(sdb.db.clone(), cfg) {
        Ok(c) => Some(Arc::new(c)),
        Err(Error::Config { key, .. }) if key == "pack_factor" => None,
        Err(e) => panic!("{e}"),
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Packed batches of random databases follow the layout rules.
    #[test]
    fn packed_batches_place_every_seed_and_keep_segments_apart(
        spec in arb_spec(),
        b in 1usize..=3,
        pf in 0usize..=4,
        hops in 0usize..=3,
        seed in any::<u64>(),
    ) {
        let Some(sdb) = build(&spec) else { return Ok(()) };
        let cfg = SamplerConfig {
            default_batch_size: b,
            default_sequence_length: 96,
            max_hops: hops,
            bfs_child_width: 3,
            pack: true,
            pack_factor: pf,
            seed,
            num_threads: Some(2),
            ..SamplerConfig::default()
        };
        let Some(core) = core(&sdb, cfg) else { return Ok(()) };
        let mut maker = BatchMaker::new(core.clone(), Split::Train);
        for _ in 0..3 {
            let Ok(batch) = maker.next().unwrap() else { return Ok(()) };
            check_packed(&batch, &core)?;
        }
    }

    /// `pack = true, pack_factor = 1` makes the unpacked batches, byte for byte.
    #[test]
    fn pack_factor_one_is_the_unpacked_layout(spec in arb_spec(), b in 1usize..=4, seed in any::<u64>()) {
        let Some(sdb) = build(&spec) else { return Ok(()) };
        let cfg = SamplerConfig {
            default_batch_size: b,
            default_sequence_length: 40,
            max_hops: 2,
            bfs_child_width: 3,
            seed,
            num_threads: Some(1),
            ..SamplerConfig::default()
        };
        let packed = SamplerConfig { pack: true, pack_factor: 1, ..cfg.clone() };
        let (Some(a), Some(p)) = (core(&sdb, cfg), core(&sdb, packed)) else { return Ok(()) };
        let (mut a, mut p) = (BatchMaker::new(a, Split::Train), BatchMaker::new(p, Split::Train));
        for _ in 0..3 {
            match (a.next().unwrap(), p.next().unwrap()) {
                (Ok(x), Ok(y)) => {
                    prop_assert!(same_batch(&x, &y));
                    prop_assert_eq!(x.fingerprint, y.fingerprint);
                }
                (Err(_), Err(_)) => return Ok(()),
                _ => prop_assert!(false, "one errs, the other not"),
            }
        }
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// Packed: N steps uninterrupted vs. k steps, state, a new sampler from
    /// the state (other thread count), N − k steps — identical batches; and
    /// `replay_batch` rebuilds every delivered step exactly, on each rank.
    #[test]
    fn packed_resume_and_replay_are_exact(
        spec in arb_spec(),
        world_size in 1u32..=2,
        (n, k) in (1u64..=6).prop_flat_map(|n| (Just(n), 0..=n)),
        b in 1usize..=3,
        pf in prop_oneof![Just(0usize), 2usize..=3],
        seed in any::<u64>(),
    ) {
        let Some(sdb) = build(&spec) else { return Ok(()) };
        for rank in 0..world_size {
            let cfg = SamplerConfig {
                rank,
                world_size,
                default_batch_size: b,
                default_sequence_length: 96,
                max_hops: 2,
                bfs_child_width: 3,
                pack: true,
                pack_factor: pf,
                seed,
                num_threads: Some(1),
                num_prefetch: 2,
                ..SamplerConfig::default()
            };
            let Some(c) = core(&sdb, cfg.clone()) else { return Ok(()) };
            if BatchMaker::new(c.clone(), Split::Train).next().unwrap().is_err() {
                return Ok(());
            }
            let whole = Sampler::new(&sdb.dir, cfg.clone()).unwrap();
            let want: Vec<MadeBatch> = (0..n).map(|_| whole.next_batch(Split::Train).unwrap()).collect();
            for w in &want {
                check_packed(w, &c)?;
                let again = whole.replay_batch(Split::Train, w.step, None).unwrap();
                prop_assert!(same_batch(w, &again), "replay of step {} differs", w.step);
                prop_assert_eq!(w.fingerprint, again.fingerprint);
            }
            let first = Sampler::new(&sdb.dir, cfg.clone()).unwrap();
            for _ in 0..k {
                first.next_batch(Split::Train).unwrap();
            }
            let state = SamplerState::from_json(&first.state().to_json()).unwrap();
            drop(first);
            let c2 = SamplerConfig { num_threads: Some(2), ..cfg.clone() };
            let resumed = Sampler::with_state(&sdb.dir, c2, Some(&state)).unwrap();
            for a in &want[k as usize..] {
                let got = resumed.next_batch(Split::Train).unwrap();
                prop_assert_eq!((a.step, a.fingerprint), (got.step, got.fingerprint));
                prop_assert!(same_batch(a, &got), "step {} differs after resume", a.step);
            }
            // A state taken packed is refused by an unpacked sampler, naming the key.
            let unpacked = SamplerConfig { pack: false, ..cfg };
            match Sampler::with_state(&sdb.dir, unpacked, Some(&state)) {
                Err(e) => prop_assert!(e.to_string().contains("pack"), "{}", e),
                Ok(_) => prop_assert!(false, "a packed state resumed unpacked"),
            }
        }
    }
}
