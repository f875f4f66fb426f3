//! What a row of the sampler keys' table (`FIELDS`, in `keys.rs`) is:
//! name, type, group, the check as data ([`Check`]), doc, and the range
//! text made from the check.
//!
//! Invariants: a key's allowed range is stated once, in its row: a plain range
//! ([`Check::Int`], [`Check::Number`]) is both the check
//! `SamplerConfig::validate` runs and the text every error for the key
//! states ([`FieldDoc::range`]); a [`Check::Rule`] is a rule over several
//! keys, checked in `validate.rs`, stated by its text. Never: a number of
//! a plain range written anywhere else.

use std::borrow::Cow;

use serde::Serialize;

/// What a key is for: the reference and the stub list keys by group, and
/// the [`Group::Debug`] keys (fault injection, for diagnostics) are kept
/// out of the public keyword list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    /// Which seeds each rank draws: ranks, splits, seeds, weights, pools.
    Seeds,
    /// The shape of a step: `B`, `S`, variable lengths, packing.
    Shape,
    /// How a context is built: BFS, walks, examples, masking.
    Recipe,
    /// Threads, memory, prefetch and how the files are read.
    Resources,
    /// What the sampler reports and where: series, exporters, stalls.
    Telemetry,
    /// Fault injection: faults the diagnostic configs force on purpose.
    Debug,
}

impl Group {
    /// The group's name, as the schema and the reference write it.
    pub fn name(self) -> &'static str {
        match self {
            Group::Seeds => "seeds",
            Group::Shape => "shape",
            Group::Recipe => "recipe",
            Group::Resources => "resources",
            Group::Telemetry => "telemetry",
            Group::Debug => "debug",
        }
    }
}

/// A key's allowed values, as data.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Check {
    /// An integer in `lo..=hi` (or `None`, when the type allows it).
    Int {
        /// Smallest allowed value.
        lo: u64,
        /// Largest allowed value.
        hi: u64,
    },
    /// A finite number in `[lo, hi]`, or `(lo, hi]` with `open_lo` (or
    /// `None`, when the type allows it).
    Number {
        /// Lower end.
        lo: f64,
        /// Upper end (included).
        hi: f64,
        /// Whether `lo` itself is refused.
        open_lo: bool,
    },
    /// `true` or `false` (its type is the whole check).
    Bool,
    /// One of these strings (or `None`, when the type allows it); the
    /// enum's deserialisation is the check.
    Choices {
        /// The allowed strings.
        choices: &'static [&'static str],
    },
    /// A rule over this key (and others) in `validate.rs` (or the open
    /// against a database), stated by this text.
    Rule {
        /// The allowed values, as every error for this key states them.
        text: &'static str,
    },
}

/// One key's type, group, allowed values and meaning.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FieldDoc {
    /// Key (TOML key, Rust field, Python keyword).
    pub name: &'static str,
    /// Python-style type.
    #[serde(rename = "type")]
    pub ty: &'static str,
    /// What the key is for.
    pub group: Group,
    /// Allowed values.
    pub check: Check,
    /// Words after the range (what a value means, a condition checked at
    /// open); empty for none.
    pub note: &'static str,
    /// What it does.
    pub doc: &'static str,
}

impl FieldDoc {
    /// Whether `None` is allowed (the type says so).
    pub fn optional(&self) -> bool {
        self.ty.ends_with("| None")
    }

    /// The allowed values, as every error for this key states them: made
    /// from [`Check`] (and [`note`](Self::note)), so the text and the check
    /// cannot disagree.
    pub fn range(&self) -> Cow<'static, str> {
        let none = if self.optional() { "None or " } else { "" };
        let base = match self.check {
            Check::Rule { text } => return Cow::Borrowed(text),
            Check::Int { lo, hi } => format!("an integer in {}..={}", number(lo), number(hi)),
            Check::Number { lo, hi, open_lo } => {
                let open = if open_lo { "(" } else { "[" };
                format!("a number in {open}{lo}, {hi}]")
            }
            Check::Bool => "true or false".to_string(),
            Check::Choices { choices } => {
                let quoted: Vec<String> = choices.iter().map(|c| format!("\"{c}\"")).collect();
                match quoted.split_last() {
                    Some((last, rest)) if !rest.is_empty() => {
                        format!("{} or {last}", rest.join(", "))
                    }
                    _ => quoted.concat(),
                }
            }
        };
        Cow::Owned(format!("{none}{base}{}", self.note))
    }
}

/// An integer bound as the range text writes it: `2^64-1` for the largest
/// `u64`, `2^k` for a power of two from 2^20 up, else the number.
fn number(x: u64) -> String {
    if x == u64::MAX {
        "2^64-1".to_string()
    } else if x.is_power_of_two() && x >= 1 << 20 {
        format!("2^{}", x.trailing_zeros())
    } else {
        x.to_string()
    }
}
