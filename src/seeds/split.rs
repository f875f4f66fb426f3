//! Hash splits and rank shards.

use xxhash_rust::xxh3::xxh3_64_with_seed;

// `Split` is defined on the ground floor, with the stored split codes of
// the format; re-exported here so `crate::seeds::Split` keeps working.
pub use crate::format::Split;

/// The stable hash bucket (0..1000) of a seed.
#[inline]
pub fn bucket(task_idx: u32, anchor_row: u32, split_seed: u64) -> u32 {
    let mut key = [0u8; 8];
    key[..4].copy_from_slice(&task_idx.to_le_bytes());
    key[4..].copy_from_slice(&anchor_row.to_le_bytes());
    (xxh3_64_with_seed(&key, split_seed) % 1000) as u32
}

/// The split of a seed under `ratios` (train, val, test).
#[inline]
pub fn split_of(task_idx: u32, anchor_row: u32, split_seed: u64, ratios: [f64; 3]) -> Split {
    let b = bucket(task_idx, anchor_row, split_seed);
    let train = (ratios[0] * 1000.0).round() as u32;
    let val = ((ratios[0] + ratios[1]) * 1000.0).round() as u32;
    if b < train {
        Split::Train
    } else if b < val {
        Split::Val
    } else {
        Split::Test
    }
}

/// Whether the hash rule under `ratios` gives `split` any bucket (a split
/// without one holds no seed of any task): the thresholds of [`split_of`].
pub fn split_has_buckets(split: Split, ratios: [f64; 3]) -> bool {
    let train = (ratios[0] * 1000.0).round() as u32;
    let val = ((ratios[0] + ratios[1]) * 1000.0).round() as u32;
    match split {
        Split::Train => train > 0,
        Split::Val => val > train,
        Split::Test => val < 1000,
    }
}

/// Positions (into the task's seed list) of the seeds in `split`, ascending:
/// the split's global pool, the same on every rank.
pub fn split_seeds(
    task_idx: u32,
    anchor_rows: &[u32],
    split: Split,
    split_seed: u64,
    ratios: [f64; 3],
) -> Vec<u32> {
    anchor_rows
        .iter()
        .enumerate()
        .filter(|&(_, &row)| split_of(task_idx, row, split_seed, ratios) == split)
        .map(|(pos, _)| pos as u32)
        .collect()
}

/// Positions of the seeds in `split`, ascending, for a task whose seeds may
/// carry a stored split (`stored`: one code per seed, see
/// [`Split::from_code`]; a RelBench task keeps the split of the label file
/// each row came from). With stored codes the split is theirs and
/// `split_seed`/`ratios` do not apply; without, the hash rule
/// ([`split_seeds`]). Codes are validated when the database is opened; an
/// unknown code (not reachable through an opened database) is in no split.
pub fn task_split_seeds(
    task_idx: u32,
    anchor_rows: &[u32],
    stored: Option<&[u8]>,
    split: Split,
    split_seed: u64,
    ratios: [f64; 3],
) -> Vec<u32> {
    match stored {
        None => split_seeds(task_idx, anchor_rows, split, split_seed, ratios),
        Some(codes) => codes
            .iter()
            .enumerate()
            .filter(|&(_, &c)| Split::from_code(c) == Some(split))
            .map(|(pos, _)| pos as u32)
            .collect(),
    }
}

/// The split code (0 train, 1 val, 2 test; [`NO_SPLIT`] for an unknown
/// stored code) of every seed of a task, by the rule of
/// [`task_split_seeds`]: the stored codes where the task keeps them, else
/// the hash rule. In-context examples read it (a seed shows the labels of
/// examples of its own split or an earlier one only).
pub fn task_split_codes(
    task_idx: u32,
    anchor_rows: &[u32],
    stored: Option<&[u8]>,
    split_seed: u64,
    ratios: [f64; 3],
) -> Vec<u8> {
    let code = |s: Split| s.index() as u8;
    match stored {
        None => anchor_rows
            .iter()
            .map(|&row| code(split_of(task_idx, row, split_seed, ratios)))
            .collect(),
        Some(codes) => codes
            .iter()
            .map(|&c| Split::from_code(c).map_or(NO_SPLIT, code))
            .collect(),
    }
}

/// The split code of a seed in no split (an unknown stored code).
pub const NO_SPLIT: u8 = u8::MAX;

/// The global pool positions rank `rank` draws at a step whose pool counter
/// stands at `drawn`: `batch_size` consecutive positions starting at
/// `drawn + rank · batch_size`. Over ranks `0..world_size` the slices are
/// disjoint and cover `drawn .. drawn + world_size · batch_size`, which is
/// what the step consumes.
pub fn rank_slice(drawn: u64, rank: u32, batch_size: usize) -> std::ops::Range<u64> {
    let start = drawn + rank as u64 * batch_size as u64;
    start..start + batch_size as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_splits_override_the_hash_rule() {
        let rows: Vec<u32> = (0..6).collect();
        let codes = [2u8, 0, 1, 0, 2, 1];
        let got: Vec<Vec<u32>> = [Split::Train, Split::Val, Split::Test]
            .iter()
            .map(|&s| task_split_seeds(0, &rows, Some(&codes), s, 9, [0.8, 0.1, 0.1]))
            .collect();
        assert_eq!(got, vec![vec![1, 3], vec![2, 5], vec![0, 4]]);
        assert_eq!(
            task_split_seeds(0, &rows, None, Split::Val, 9, [0.8, 0.1, 0.1]),
            split_seeds(0, &rows, Split::Val, 9, [0.8, 0.1, 0.1]),
            "no stored codes: the hash rule"
        );
        assert_eq!(Split::from_code(3), None);
        // Each seed's code is the split whose pool holds it.
        for stored in [Some(&codes[..]), None] {
            let all = task_split_codes(0, &rows, stored, 9, [0.5, 0.25, 0.25]);
            for split in [Split::Train, Split::Val, Split::Test] {
                let pool = task_split_seeds(0, &rows, stored, split, 9, [0.5, 0.25, 0.25]);
                let coded: Vec<u32> = (0..6u32)
                    .filter(|&i| all[i as usize] == split.index() as u8)
                    .collect();
                assert_eq!(pool, coded, "{split:?}");
            }
        }
        assert_eq!(
            task_split_codes(0, &rows[..1], Some(&[7]), 9, [0.8, 0.1, 0.1]),
            [NO_SPLIT]
        );
    }

    #[test]
    fn a_split_without_buckets_holds_no_seed() {
        let rows: Vec<u32> = (0..3000).collect();
        for ratios in [
            [0.8, 0.1, 0.1],
            [1.0, 0.0, 0.0],
            [0.0, 0.5, 0.5],
            [0.5, 0.5, 0.0],
        ] {
            for split in [Split::Train, Split::Val, Split::Test] {
                let any = !split_seeds(0, &rows, split, 3, ratios).is_empty();
                assert_eq!(
                    split_has_buckets(split, ratios),
                    any,
                    "{ratios:?} {split:?}"
                );
            }
        }
    }

    #[test]
    fn splits_partition_and_rank_slices_partition_a_step() {
        let rows: Vec<u32> = (0..5000).map(|i| i * 7 + 3).collect();
        let ratios = [0.8, 0.1, 0.1];
        let mut seen = vec![0u8; rows.len()];
        let mut per_split = [0usize; 3];
        for split in [Split::Train, Split::Val, Split::Test] {
            for p in split_seeds(1, &rows, split, 9, ratios) {
                seen[p as usize] += 1;
                per_split[split.index()] += 1;
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "every seed in exactly one split"
        );
        assert!(
            (per_split[0] as f64 / 5000.0 - 0.8).abs() < 0.03,
            "{per_split:?}"
        );
        assert_ne!(
            split_seeds(1, &rows, Split::Val, 9, ratios),
            split_seeds(1, &rows, Split::Val, 10, ratios),
            "the split depends on the split seed"
        );
        for world in 1..=5u32 {
            let mut all: Vec<u64> = (0..world).flat_map(|r| rank_slice(40, r, 3)).collect();
            all.sort_unstable();
            assert_eq!(all, (40..40 + 3 * world as u64).collect::<Vec<_>>());
        }
    }
}
