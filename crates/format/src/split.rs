//! The data split (train, val, test) and its stored code.
//!
//! Defined here, on the ground floor, because the format stores it: a task
//! that keeps its source's splits has a `split: u8[n]` section whose codes
//! are [`Split::from_code`]'s (see [`crate`]). `seeds` re-exports it
//! and owns the rules that assign seeds to splits. Never: depend on anything
//! above `format`.

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

    /// The split a stored split code names (0 train, 1 val, 2 test), if any.
    pub fn from_code(code: u8) -> Option<Split> {
        match code {
            0 => Some(Split::Train),
            1 => Some(Split::Val),
            2 => Some(Split::Test),
            _ => None,
        }
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
