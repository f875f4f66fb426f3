//! [`SamplerConfig::validate`]: the only check of a sampler config.
//!
//! Invariants: every rejection is an [`Error::Config`](crate::error::Error::Config)
//! naming the key, the value and the key's allowed range from
//! [`FIELDS`](super::FIELDS) (via [`bad`]). Never: change a value; a config
//! is accepted or refused as given.

use super::{bad, ExampleRanker, SamplerConfig, TaskWeights};
use crate::error::Result;

impl SamplerConfig {
    /// The resource keys: threads, the RSS cap and the memory budget.
    fn validate_resources(&self) -> Result<()> {
        if let Some(n) = self.num_threads.filter(|n| !(1..=1024).contains(n)) {
            return Err(bad("num_threads", n));
        }
        if self.max_rss_bytes == Some(0) {
            return Err(bad("max_rss_bytes", 0));
        }
        if let Some(b) = self.memory_budget.filter(|&b| b < 1 << 20) {
            return Err(bad("memory_budget", b));
        }
        Ok(())
    }

    /// Check every value; with `task_names` (the database's tasks), also
    /// the task weights against them.
    pub fn validate(&self, task_names: Option<&[String]>) -> Result<()> {
        if self.world_size == 0 {
            return Err(bad("world_size", 0));
        }
        if self.rank >= self.world_size {
            return Err(bad(
                "rank",
                format!("{} with world_size {}", self.rank, self.world_size),
            ));
        }
        let r = self.split_ratios;
        let sum: f64 = r.iter().sum();
        if r.iter().any(|x| !x.is_finite() || *x < 0.0) || (sum - 1.0).abs() > 1e-6 {
            return Err(bad("split_ratios", format!("{r:?} (sum {sum})")));
        }
        let int_range = |key: &str, v: usize, lo: usize, hi: usize| -> Result<()> {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(bad(key, v))
            }
        };
        int_range("num_prefetch", self.num_prefetch, 1, 1024)?;
        int_range("default_batch_size", self.default_batch_size, 1, 65_536)?;
        int_range(
            "default_sequence_length",
            self.default_sequence_length,
            1,
            65_535,
        )?;
        self.validate_lengths()?;
        int_range("bfs_child_width", self.bfs_child_width, 1, usize::MAX)?;
        int_range("max_hops", self.max_hops, 0, 64)?;
        int_range("pack_factor", self.pack_factor, 0, 64)?;
        int_range(
            "telemetry_top_databases",
            self.telemetry_top_databases,
            0,
            1024,
        )?;
        self.validate_telemetry_databases()?;
        if let Some(dw) = &self.database_weights {
            let w: Vec<f64> = match dw {
                TaskWeights::List(w) => w.clone(),
                TaskWeights::ByName(m) => m.values().copied().collect(),
            };
            if let Some(x) = w.iter().find(|x| !x.is_finite() || **x < 0.0) {
                return Err(bad("database_weights", format!("a weight of {x}")));
            }
        }
        self.validate_resources()?;
        self.validate_weights(task_names)?;
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
        if !(self.pool_fraction > 0.0 && self.pool_fraction <= 1.0) {
            return Err(bad("pool_fraction", self.pool_fraction));
        }
        if !(1..=1 << 32).contains(&self.seed_windows) {
            return Err(bad("seed_windows", self.seed_windows));
        }
        self.validate_recipe()?;
        if !(self.debug_batch_delay_ms >= 0.0 && self.debug_batch_delay_ms <= 60_000.0) {
            return Err(bad("debug_batch_delay_ms", self.debug_batch_delay_ms));
        }
        self.validate_stalls()?;
        Ok(())
    }

    /// `stall_after_ms` below 10 ms would dump the stacks of healthy
    /// batches (a build takes milliseconds); NaN, ≤ 0 and absurd values are
    /// errors naming the key.
    fn validate_stalls(&self) -> Result<()> {
        if let Some(ms) = self.stall_after_ms {
            if !(10.0..=86_400_000.0).contains(&ms) {
                return Err(bad("stall_after_ms", ms));
            }
        }
        if self.stage_dir.as_deref() == Some("") {
            return Err(bad("stage_dir", "\"\""));
        }
        if self.stall_dump_dir.as_deref() == Some("") {
            return Err(bad("stall_dump_dir", "\"\""));
        }
        if !(self.debug_stall_ms >= 0.0 && self.debug_stall_ms <= 600_000.0) {
            return Err(bad("debug_stall_ms", self.debug_stall_ms));
        }
        if let Some(cpu) = self.debug_pin_cpu {
            if !crate::probes::may_run_on(cpu) {
                return Err(bad("debug_pin_cpu", cpu));
            }
        }
        if !(self.debug_spin_ms >= 0.0 && self.debug_spin_ms <= 60_000.0) {
            return Err(bad("debug_spin_ms", self.debug_spin_ms));
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
    fn validate_lengths(&self) -> Result<()> {
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

    /// The context recipe's keys (`examples` and the keys it reads); the
    /// lists are checked only with `examples` on, so the defaults never
    /// refuse a short `default_sequence_length` that does not use them.
    fn validate_recipe(&self) -> Result<()> {
        if self.task_mixing == super::TaskMixing::Sequence && self.pack {
            return Err(bad(
                "task_mixing",
                "\"sequence\" with pack on (a packed sequence holds one task's contexts); allowed: \"step\", or \"sequence\" with pack off",
            ));
        }
        if self.num_walks > 10_000_000 {
            return Err(bad("num_walks", self.num_walks));
        }
        if !(1..=1024).contains(&self.walk_length) {
            return Err(bad("walk_length", self.walk_length));
        }
        if !(0.0..=1.0).contains(&self.mask_prob_max) {
            return Err(bad("mask_prob_max", self.mask_prob_max));
        }
        if !(self.expected_prune > 0.0 && self.expected_prune <= 1000.0) {
            return Err(bad("expected_prune", self.expected_prune));
        }
        if self.expected_store && !(self.examples && self.example_ranker == ExampleRanker::Expected)
        {
            return Err(bad(
                "expected_store",
                "true without examples and example_ranker \"expected\" (it stores the expected ranker's rankings)",
            ));
        }
        if !(1..=65536).contains(&self.expected_store_rows) {
            return Err(bad("expected_store_rows", self.expected_store_rows));
        }
        if let Some(d) = self.context_deadline_ms {
            if !(d > 0.0 && d <= 3_600_000.0) {
                return Err(bad("context_deadline_ms", d));
            }
        }
        if !self.examples {
            return Ok(());
        }
        if self.pack {
            return Err(bad("examples", "true with pack = true"));
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

    fn validate_telemetry_databases(&self) -> Result<()> {
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

    fn validate_weights(&self, task_names: Option<&[String]>) -> Result<()> {
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
    use crate::error::Error;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("t{i}")).collect()
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
                    assert!(what.contains(field(key).unwrap().range), "{what}");
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
        let range = field("telemetry_databases").unwrap().range;
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
                    assert!(what.contains(field(key).unwrap().range), "{what}");
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
