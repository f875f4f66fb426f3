//! Hash splits and rank shards.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A data split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    /// Training seeds.
    Train,
    /// Validation seeds.
    Val,
    /// Test seeds (never produced by the sampler).
    Test,
}

impl Split {
    /// `train`, `val` or `test`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
    }

    /// 0, 1 or 2.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The split named `s`, if any.
    pub fn parse(s: &str) -> Option<Split> {
        match s {
            "train" => Some(Split::Train),
            "val" => Some(Split::Val),
            "test" => Some(Split::Test),
            _ => None,
        }
    }
}

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

/// Positions (into the task's seed list) this rank owns in `split`: the
/// split's seeds in task order, every `world_size`-th starting at `rank`.
pub fn shard(
    task_idx: u32,
    anchor_rows: &[u32],
    split: Split,
    split_seed: u64,
    ratios: [f64; 3],
    rank: u32,
    world_size: u32,
) -> Vec<u32> {
    let mut out = Vec::new();
    let mut i = 0u64;
    for (pos, &row) in anchor_rows.iter().enumerate() {
        if split_of(task_idx, row, split_seed, ratios) == split {
            if i % world_size as u64 == rank as u64 {
                out.push(pos as u32);
            }
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_partition_and_shards_partition() {
        let rows: Vec<u32> = (0..5000).map(|i| i * 7 + 3).collect();
        let ratios = [0.8, 0.1, 0.1];
        let mut seen = vec![0u8; rows.len()];
        let mut per_split = [0usize; 3];
        for split in [Split::Train, Split::Val, Split::Test] {
            for rank in 0..3 {
                for p in shard(1, &rows, split, 9, ratios, rank, 3) {
                    seen[p as usize] += 1;
                    per_split[split.index()] += 1;
                }
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "every seed in exactly one (split, rank)"
        );
        assert!(
            (per_split[0] as f64 / 5000.0 - 0.8).abs() < 0.03,
            "{per_split:?}"
        );
        // Split membership does not depend on world size or rank.
        let a: Vec<u32> = shard(1, &rows, Split::Val, 9, ratios, 0, 1);
        let mut b: Vec<u32> = (0..4)
            .flat_map(|r| shard(1, &rows, Split::Val, 9, ratios, r, 4))
            .collect();
        b.sort_unstable();
        assert_eq!(a, b);
        // ... but does depend on the split seed.
        assert_ne!(a, shard(1, &rows, Split::Val, 10, ratios, 0, 1));
    }
}
