//! [`SamplerConfig::validate`]: the only check of a sampler config.
//!
//! A config is checked whole: every plain range of [`FIELDS`] (a
//! [`Check::Int`] or [`Check::Number`] row, read off the row itself), then
//! every rule over several keys (one function per key below); every bad
//! key is reported at once ([`Error::Configs`] for more than one), one
//! error per key, in key order.
//!
//! Invariants: every rejection is an [`Error::Config`] naming the key, the
//! value and the key's allowed range from [`FIELDS`] (via [`bad`]).
//! Never: change a value (a config is accepted or refused as given); a
//! plain range restated here.

use super::fields::Check;
use super::{bad, ExampleRanker, FieldDoc, SamplerConfig, TaskWeights, FIELDS};
use crate::error::{Error, Result};

/// `value` of the key of `row` against its plain range ([`Check::Int`],
/// [`Check::Number`]); other checks pass here (their rules are below, or
/// the type is the check).
fn plain(row: &FieldDoc, value: &serde_json::Value) -> Result<()> {
    if value.is_null() && row.optional() {
        return Ok(());
    }
    let ok = match row.check {
        Check::Int { lo, hi } => value.as_u64().is_some_and(|x| (lo..=hi).contains(&x)),
        Check::Number { lo, hi, open_lo } => value
            .as_f64()
            .is_some_and(|x| x.is_finite() && x <= hi && (x > lo || (!open_lo && x >= lo))),
        Check::Bool | Check::Choices { .. } | Check::Rule { .. } => true,
    };
    if ok {
        Ok(())
    } else if value.is_null() {
        // A float that is not a number serialises as null.
        Err(bad(row.name, "NaN"))
    } else {
        Err(bad(row.name, value))
    }
}

/// The key an error is about (`None` for an error of another kind).
fn key_of(e: &Error) -> Option<&str> {
    match e {
        Error::Config { key, .. } => Some(key),
        _ => None,
    }
}

impl SamplerConfig {
    /// Check every value; with `task_names` (the database's tasks), also
    /// the task weights against them. Every bad key is reported, one error
    /// each ([`Error::Configs`] when there are several).
    pub fn validate(&self, task_names: Option<&[String]>) -> Result<()> {
        let json = self.to_json();
        let mut errors: Vec<Error> = FIELDS
            .iter()
            .filter_map(|row| plain(row, &json[row.name]).err())
            .collect();
        let rules = [
            self.check_rank(),
            self.check_split_ratios(),
            self.check_lengths(),
            self.check_telemetry_databases(),
            self.check_database_weights(),
            self.check_weights(task_names),
            self.check_prometheus(),
            self.check_task_mixing(),
            self.check_expected_store(),
            self.check_examples(),
            self.check_example_lists(),
            self.check_paths(),
            self.check_pin_cpu(),
            self.check_optional_numbers(),
        ];
        for e in rules.into_iter().filter_map(Result::err) {
            let key = key_of(&e);
            if key.is_none() || !errors.iter().any(|seen| key_of(seen) == key) {
                errors.push(e);
            }
        }
        let order = |e: &Error| key_of(e).and_then(|k| FIELDS.iter().position(|f| f.name == k));
        errors.sort_by_key(order);
        Error::all(errors)
    }

    fn check_rank(&self) -> Result<()> {
        if self.world_size > 0 && self.rank >= self.world_size {
            return Err(bad(
                "rank",
                format!("{} with world_size {}", self.rank, self.world_size),
            ));
        }
        Ok(())
    }

    fn check_split_ratios(&self) -> Result<()> {
        let r = self.split_ratios;
        let sum: f64 = r.iter().sum();
        if r.iter().any(|x| !x.is_finite() || *x < 0.0) || (sum - 1.0).abs() > 1e-6 {
            return Err(bad("split_ratios", format!("{r:?} (sum {sum})")));
        }
        Ok(())
    }

    fn check_database_weights(&self) -> Result<()> {
        if let Some(dw) = &self.database_weights {
            let w: Vec<f64> = match dw {
                TaskWeights::List(w) => w.clone(),
                TaskWeights::ByName(m) => m.values().copied().collect(),
            };
            if let Some(x) = w.iter().find(|x| !x.is_finite() || **x < 0.0) {
                return Err(bad("database_weights", format!("a weight of {x}")));
            }
        }
        Ok(())
    }

    /// The exporter's port (plus the local rank, still a port) and address.
    fn check_prometheus(&self) -> Result<()> {
        if let Some(p) = self.prometheus_port {
            let port = u32::from(p) + self.local_rank.unwrap_or(self.rank);
            if p == 0 || port > u32::from(u16::MAX) {
                return Err(bad(
                    "prometheus_port",
                    format!("{p} (+ local rank = {port})"),
                ));
            }
            if self.prometheus_host.parse::<std::net::IpAddr>().is_err() {
                return Err(bad(
                    "prometheus_host",
                    format!("{:?}", self.prometheus_host),
                ));
            }
        }
        Ok(())
    }

    /// A NaN or infinite value in an optional number: JSON writes it as
    /// null, so the plain pass over the rows would read it as `None`. The
    /// optional numbers, as fields (a test keeps them the optional
    /// [`Check::Number`] rows).
    pub(super) fn optional_numbers(&self) -> [(&'static str, Option<f64>); 2] {
        [
            ("context_deadline_ms", self.context_deadline_ms),
            ("stall_after_ms", self.stall_after_ms),
        ]
    }

    fn check_optional_numbers(&self) -> Result<()> {
        for (key, v) in self.optional_numbers() {
            if let Some(x) = v.filter(|x| !x.is_finite()) {
                return Err(bad(key, x));
            }
        }
        Ok(())
    }

    /// An empty path is a mistake, not "here" (`None` is the default).
    fn check_paths(&self) -> Result<()> {
        if self.stage_dir.as_deref() == Some("") {
            return Err(bad("stage_dir", "\"\""));
        }
        if self.stall_dump_dir.as_deref() == Some("") {
            return Err(bad("stall_dump_dir", "\"\""));
        }
        Ok(())
    }

    /// The CPU-starvation fault: a CPU this process may run on, and a hog
    /// only beside a pinned sampler.
    fn check_pin_cpu(&self) -> Result<()> {
        if let Some(cpu) = self.debug_pin_cpu {
            if !crate::probes::may_run_on(cpu) {
                return Err(bad("debug_pin_cpu", cpu));
            }
        }
        if self.debug_cpu_hog && self.debug_pin_cpu.is_none() {
            return Err(bad("debug_cpu_hog", "true without debug_pin_cpu"));
        }
        Ok(())
    }

    /// The longest `S` any batch can have: the largest of
    /// `sequence_lengths` (train steps) and `default_sequence_length` (the
    /// val stream and evaluation passes).
    pub fn max_sequence_length(&self) -> usize {
        let listed = self.sequence_lengths.iter().copied().max().unwrap_or(0);
        listed.max(self.default_sequence_length)
    }

    /// `sequence_lengths` and `tokens_per_batch`: every listed `S` must be
    /// a valid length and leave a whole number of sequences, at least one
    /// and at most the largest batch, in the token budget.
    fn check_lengths(&self) -> Result<()> {
        let list = &self.sequence_lengths;
        let Some(tokens) = self.tokens_per_batch else {
            if list.is_empty() {
                return Ok(());
            }
            return Err(bad(
                "tokens_per_batch",
                format!("None with sequence_lengths {list:?}"),
            ));
        };
        if list.is_empty() {
            return Err(bad(
                "sequence_lengths",
                format!("[] with tokens_per_batch {tokens}"),
            ));
        }
        if let Some(s) = list.iter().find(|&&s| !(1..=65_535).contains(&s)) {
            return Err(bad("sequence_lengths", format!("{list:?} (holds {s})")));
        }
        if let Some(i) = (1..list.len()).find(|&i| list[..i].contains(&list[i])) {
            return Err(bad(
                "sequence_lengths",
                format!("{list:?} ({} listed twice)", list[i]),
            ));
        }
        if self.pack {
            return Err(bad(
                "sequence_lengths",
                format!("{list:?} with pack = true"),
            ));
        }
        let longest = list.iter().copied().max().unwrap_or(0);
        if tokens < longest {
            return Err(bad(
                "tokens_per_batch",
                format!("{tokens}, smaller than one sequence of S = {longest}"),
            ));
        }
        if let Some(s) = list.iter().find(|&&s| tokens % s != 0) {
            return Err(bad(
                "tokens_per_batch",
                format!("{tokens}, not divisible by S = {s} of sequence_lengths {list:?}"),
            ));
        }
        let shortest = list.iter().copied().min().unwrap_or(1);
        if tokens / shortest > 65_536 {
            return Err(bad(
                "tokens_per_batch",
                format!(
                    "{tokens} (B = {} sequences of S = {shortest}, above 65536)",
                    tokens / shortest
                ),
            ));
        }
        Ok(())
    }

    fn check_task_mixing(&self) -> Result<()> {
        if self.task_mixing == super::TaskMixing::Sequence && self.pack {
            return Err(bad(
                "task_mixing",
                "\"sequence\" with pack on (a packed sequence holds one task's contexts); allowed: \"step\", or \"sequence\" with pack off",
            ));
        }
        Ok(())
    }

    fn check_expected_store(&self) -> Result<()> {
        if self.expected_store && !(self.examples && self.example_ranker == ExampleRanker::Expected)
        {
            return Err(bad(
                "expected_store",
                "true without examples and example_ranker \"expected\" (it stores the expected ranker's rankings)",
            ));
        }
        Ok(())
    }

    fn check_examples(&self) -> Result<()> {
        if self.examples && self.pack {
            return Err(bad("examples", "true with pack = true"));
        }
        Ok(())
    }

    /// The context recipe's lists, checked only with `examples` on, so the
    /// defaults never refuse a short `default_sequence_length` that does
    /// not use them.
    fn check_example_lists(&self) -> Result<()> {
        if !self.examples {
            return Ok(());
        }
        let s = self.max_sequence_length();
        for (key, list) in [
            ("local_context_sizes", &self.local_context_sizes),
            ("bfs_widths", &self.bfs_widths),
        ] {
            if list.is_empty() || list.iter().any(|&v| v == 0 || v > s) {
                return Err(bad(key, format!("{list:?} (longest S {s})")));
            }
        }
        if self.prefer_latest.is_empty() {
            return Err(bad("prefer_latest", "[]"));
        }
        Ok(())
    }

    fn check_telemetry_databases(&self) -> Result<()> {
        let names = &self.telemetry_databases;
        if names.len() > 1024 {
            return Err(bad(
                "telemetry_databases",
                format!("a list of {} names", names.len()),
            ));
        }
        if let Some(i) = (1..names.len()).find(|&i| names[..i].contains(&names[i])) {
            return Err(bad(
                "telemetry_databases",
                format!("{:?} listed twice in {names:?}", names[i]),
            ));
        }
        Ok(())
    }

    fn check_weights(&self, task_names: Option<&[String]>) -> Result<()> {
        let Some(tw) = &self.task_weights else {
            return Ok(());
        };
        let w: Vec<f64> = match (tw, task_names) {
            (_, Some(names)) => {
                let w = self.weights_for(names)?;
                if w.len() != names.len() {
                    return Err(bad(
                        "task_weights",
                        format!("{} weights for {} tasks {names:?}", w.len(), names.len()),
                    ));
                }
                w
            }
            (TaskWeights::List(w), None) => w.clone(),
            (TaskWeights::ByName(m), None) => m.values().copied().collect(),
        };
        if let Some(x) = w.iter().find(|x| !x.is_finite() || **x < 0.0) {
            return Err(bad("task_weights", format!("a weight of {x}")));
        }
        if task_names.is_some() && w.iter().all(|&x| x == 0.0) {
            return Err(bad("task_weights", "all weights 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::field;
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
    }

    #[test]
    fn every_bad_key_is_reported_at_once_in_key_order() {
        let c = SamplerConfig {
            max_hops: 65,
            default_batch_size: 0,
            pack: true,
            task_mixing: super::super::TaskMixing::Sequence,
            pool_fraction: f64::NAN,
            ..SamplerConfig::default()
        };
        let Err(Error::Configs(errors)) = c.validate(None) else {
            panic!("expected several errors");
        };
        let keys: Vec<&str> = errors.iter().filter_map(key_of).collect();
        assert_eq!(
            keys,
            [
                "default_batch_size",
                "max_hops",
                "task_mixing",
                "pool_fraction"
            ]
        );
        let text = Error::Configs(errors).to_string();
        assert!(text.starts_with("4 bad config keys:"), "{text}");
        assert!(text.contains("`pool_fraction`: got NaN"), "{text}");
        // One bad key is a plain Config error.
        let one = SamplerConfig {
            max_hops: 65,
            ..SamplerConfig::default()
        };
        assert!(matches!(one.validate(None), Err(Error::Config { .. })));
    }

    #[test]
    fn rejections_name_the_key() {
        let ok = SamplerConfig::default();
        ok.validate(Some(&names(2))).unwrap();
        let cases: Vec<(SamplerConfig, &str)> = vec![
            (
                SamplerConfig {
                    rank: 2,
                    world_size: 2,
                    ..ok.clone()
                },
                "rank",
            ),
            (
                SamplerConfig {
                    split_ratios: [0.5, 0.1, 0.1],
                    ..ok.clone()
                },
                "split_ratios",
            ),
            (
                SamplerConfig {
                    default_batch_size: 0,
                    ..ok.clone()
                },
                "default_batch_size",
            ),
            (
                SamplerConfig {
                    default_sequence_length: 0,
                    ..ok.clone()
                },
                "default_sequence_length",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![1.0].into()),
                    ..ok.clone()
                },
                "task_weights",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![1.0, -1.0].into()),
                    ..ok.clone()
                },
                "task_weights",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![0.0, 0.0].into()),
                    ..ok.clone()
                },
                "task_weights",
            ),
        ];
        for (c, key) in cases {
            match c.validate(Some(&names(2))) {
                Err(Error::Config { key: k, what, .. }) => {
                    assert_eq!(k, key);
                    assert!(what.contains(&*field(key).unwrap().range()), "{what}");
                }
                other => panic!("{key}: expected Config, got {other:?}"),
            }
        }
    }

    #[test]
    fn telemetry_databases_are_distinct_bounded_and_names_of_the_mixture() {
        let dbs: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let listed = |names: &[&str]| SamplerConfig {
            telemetry_databases: names.iter().map(|n| (*n).to_string()).collect(),
            ..SamplerConfig::default()
        };
        let c = listed(&["c", "a"]);
        c.validate(None).unwrap();
        assert_eq!(c.telemetry_databases_for(&dbs).unwrap(), Some(vec![2, 0]));
        let none = SamplerConfig::default();
        assert_eq!(none.telemetry_databases_for(&dbs).unwrap(), None);
        let range = &*field("telemetry_databases").unwrap().range();
        let e = listed(&["a", "b", "a"])
            .validate(None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`telemetry_databases`")
                && e.contains("\"a\" listed twice")
                && e.contains(range),
            "{e}"
        );
        let many: Vec<String> = (0..1025).map(|i| format!("d{i}")).collect();
        let names: Vec<&str> = many.iter().map(String::as_str).collect();
        let e = listed(&names).validate(None).unwrap_err().to_string();
        assert!(
            e.contains("a list of 1025 names") && e.contains(range),
            "{e}"
        );
        listed(&names[..1024]).validate(None).unwrap();
        let e = listed(&["b", "nope"])
            .telemetry_databases_for(&dbs)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`telemetry_databases`")
                && e.contains("unknown database \"nope\"")
                && e.contains(r#"["a", "b", "c"]"#),
            "{e}"
        );
    }

    #[test]
    fn length_recipes_are_checked_naming_key_value_and_range() {
        let varlen = |lengths: &[usize], tokens: Option<usize>| SamplerConfig {
            sequence_lengths: lengths.to_vec(),
            tokens_per_batch: tokens,
            ..SamplerConfig::default()
        };
        varlen(&[512, 1024, 2048, 4096, 8192], Some(1 << 17))
            .validate(None)
            .unwrap();
        varlen(&[], None).validate(None).unwrap();
        let cases: Vec<(SamplerConfig, &str, &str)> = vec![
            (
                varlen(&[], Some(1024)),
                "sequence_lengths",
                "got [] with tokens_per_batch 1024",
            ),
            (
                varlen(&[512], None),
                "tokens_per_batch",
                "got None with sequence_lengths [512]",
            ),
            (
                varlen(&[0, 512], Some(1024)),
                "sequence_lengths",
                "(holds 0)",
            ),
            (
                varlen(&[65_536], Some(65_536)),
                "sequence_lengths",
                "(holds 65536)",
            ),
            (
                varlen(&[512, 512], Some(1024)),
                "sequence_lengths",
                "512 listed twice",
            ),
            (
                varlen(&[512, 1536], Some(2048)),
                "tokens_per_batch",
                "not divisible by S = 1536",
            ),
            (
                varlen(&[512, 4096], Some(2048)),
                "tokens_per_batch",
                "smaller than one sequence of S = 4096",
            ),
            (
                varlen(&[1, 2], Some(1 << 17)),
                "tokens_per_batch",
                "B = 131072 sequences of S = 1",
            ),
            (
                SamplerConfig {
                    pack: true,
                    ..varlen(&[512], Some(1024))
                },
                "sequence_lengths",
                "with pack = true",
            ),
        ];
        for (c, key, value) in cases {
            match c.validate(None) {
                Err(Error::Config { key: k, what, .. }) => {
                    assert_eq!(k, key, "{what}");
                    assert!(what.contains(&*field(key).unwrap().range()), "{what}");
                    assert!(what.contains(value), "{what} lacks {value}");
                }
                other => panic!("{key}: expected Config, got {other:?}"),
            }
        }
        // The recipe's lists are checked against the longest S.
        let examples = SamplerConfig {
            examples: true,
            default_sequence_length: 256,
            local_context_sizes: vec![2048],
            ..varlen(&[512, 2048], Some(4096))
        };
        examples.validate(None).unwrap();
    }
}
