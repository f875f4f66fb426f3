//! Lookups over the sampler keys' table ([`FIELDS`]): a key's row
//! ([`field`]), the config error for a bad value of a key ([`bad`], stating
//! the row's range), the known key closest to a typo, every key's name.
//!
//! Invariants: every error for a key states the range its row makes
//! ([`FieldDoc::range`]). Never: a range written here.

use std::borrow::Cow;

use super::fields::FieldDoc;
use super::keys::FIELDS;
use crate::error::Error;

/// The [`FIELDS`] row of `key`.
pub fn field(key: &str) -> Option<&'static FieldDoc> {
    FIELDS.iter().find(|f| f.name == key)
}

/// The config error for `key` holding `value` (shown as given).
pub fn bad(key: &str, value: impl std::fmt::Display) -> Error {
    let range = field(key).map_or(Cow::Borrowed("see the docs"), FieldDoc::range);
    let what = format!("got {value}, allowed: {range}");
    Error::config_value(key, value.to_string(), what)
}

/// The known key closest to the unknown `key` in edit distance, when it
/// is close enough to be a typo (at most a third of its length, at least 1).
pub(super) fn closest(key: &str) -> Option<&'static str> {
    let d = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    };
    let limit = (key.chars().count() / 3).max(1);
    FIELDS
        .iter()
        .map(|f| (d(key, f.name), f.name))
        .filter(|&(dist, _)| dist <= limit)
        .min()
        .map(|(_, name)| name)
}

/// Every key, comma-separated (for the unknown-key error).
pub(super) fn names() -> String {
    FIELDS.iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::fields::Check;
    use super::super::SamplerConfig;
    use super::*;

    /// Every plain range is the check itself: each end is accepted, one
    /// step past it is refused naming the key and the row's text.
    #[test]
    #[allow(clippy::cast_precision_loss)]
    fn a_plain_range_is_both_the_check_and_its_text() {
        let mut checked = 0;
        for row in FIELDS {
            let (ends, past): (Vec<serde_json::Value>, Vec<serde_json::Value>) = match row.check {
                Check::Int { lo, hi } => (
                    vec![lo.into(), hi.into()],
                    [lo.checked_sub(1), hi.checked_add(1)]
                        .into_iter()
                        .flatten()
                        .map(Into::into)
                        .collect(),
                ),
                Check::Number { lo, hi, open_lo } => {
                    let low = if open_lo { lo + hi * 1e-9 } else { lo };
                    let below = if open_lo { lo } else { lo - 1.0 };
                    (
                        vec![low.into(), hi.into()],
                        vec![below.into(), (hi * 1.5 + 1.0).into()],
                    )
                }
                _ => continue,
            };
            checked += 1;
            let with = |v: &serde_json::Value| {
                SamplerConfig::from_json(&serde_json::json!({ row.name: v }))
                    .and_then(|c| c.validate(None))
            };
            for v in &ends {
                with(v).unwrap_or_else(|e| panic!("{} = {v}: {e}", row.name));
            }
            for v in &past {
                // A value past a type's own bound is refused when read, with
                // the same text.
                match with(v) {
                    Err(Error::Config { key, what, .. }) => {
                        assert_eq!(key, row.name, "{what}");
                        assert!(what.contains(&*row.range()), "{what}");
                    }
                    other => panic!("{} = {v}: {other:?}", row.name),
                }
            }
        }
        assert!(checked >= 30, "{checked} plain ranges");
    }

    #[test]
    fn a_nan_in_an_optional_number_is_refused_not_read_as_none() {
        let c = SamplerConfig::default();
        let listed: Vec<&str> = c.optional_numbers().iter().map(|x| x.0).collect();
        let rows: Vec<&str> = FIELDS
            .iter()
            .filter(|f| matches!(f.check, Check::Number { .. }) && f.optional())
            .map(|f| f.name)
            .collect();
        assert_eq!(listed, rows);
        for bad_value in [f64::NAN, f64::INFINITY] {
            let with = |key: &str| match key {
                "context_deadline_ms" => SamplerConfig {
                    context_deadline_ms: Some(bad_value),
                    ..c.clone()
                },
                _ => SamplerConfig {
                    stall_after_ms: Some(bad_value),
                    ..c.clone()
                },
            };
            for key in &listed {
                match with(key).validate(None) {
                    Err(Error::Config { key: k, what, .. }) => {
                        assert_eq!(&k, key, "{what}");
                        assert!(what.contains(&*field(key).unwrap().range()), "{what}");
                    }
                    other => panic!("{key} = {bad_value}: {other:?}"),
                }
            }
        }
    }
}
