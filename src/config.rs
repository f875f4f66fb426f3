//! Sampler configuration: the schema of the `[sampler]` table of training
//! configs and of the Python `Sampler(...)` keywords (same snake_case names).
//!
//! Invariant: a `SamplerConfig` that passed [`SamplerConfig::validate`] is
//! safe to sample with; every rejection names the key and the allowed range.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How the task of each batch is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskPick {
    /// Weighted random by `task_weights` (uniform by default).
    Weighted,
    /// Cycle through the tasks (those with seeds in the split), by step.
    RoundRobin,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplerConfig {
    pub rank: u32,
    pub world_size: u32,
    /// Train / val / test shares of each task's seeds (sum to 1).
    pub split_ratios: [f64; 3],
    /// Seed of the split hash; independent of `seed`, `rank`, `world_size`.
    pub split_seed: u64,
    /// Seed of all sampling randomness (combined with rank and split).
    pub seed: u64,
    /// Capacity of each prefetch channel (batches).
    pub num_prefetch: usize,
    pub default_batch_size: usize,
    pub default_sequence_length: usize,
    /// At most this many children sampled per row per hop.
    pub bfs_child_width: usize,
    pub max_hops: usize,
    /// One weight per task (metadata order); `None` = uniform.
    pub task_weights: Option<Vec<f64>>,
    pub task_pick: TaskPick,
    /// Threads in the sampler's pool; `None` = available parallelism.
    pub num_threads: Option<usize>,
    /// Fail fast when the process RSS exceeds this many bytes.
    pub max_rss_bytes: Option<u64>,
    /// Filter children by the seed's observation time. Turning it off is a
    /// diagnostic: the temporal-leak invariant then lights up.
    pub temporal_filter: bool,
    /// Record step telemetry (drain API, Prometheus). Off only to measure
    /// its cost.
    pub telemetry: bool,
    /// Serve Prometheus `/metrics` on `prometheus_port + local_rank`.
    pub prometheus_port: Option<u16>,
    /// Address the exporter binds (loopback by default).
    pub prometheus_host: String,
    /// Rank within this machine (default: `rank`), offsets the port.
    pub local_rank: Option<u32>,
    /// OTLP/HTTP base URL for stage spans (else `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub otlp_endpoint: Option<String>,
    /// Keep this share of each global seed pool (an evenly spaced subset of
    /// the split's seeds, at least one): a diagnostic knob for tiny pools.
    /// Part of the stream: every rank must use the same value (ranks with
    /// different values would read different pools and repeat or skip
    /// seeds; compare `state_dict()["config_hash"]` across ranks).
    pub pool_fraction: f64,
    /// Diagnostic: the producer sleeps this long per batch (inside the timed
    /// stage), to simulate a slow sampler and starve the prefetch queue.
    pub debug_batch_delay_ms: f64,
    /// Test hook: the producer panics when making this step (fault tests).
    #[serde(skip)]
    #[doc(hidden)]
    pub debug_panic_at_step: Option<u64>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            rank: 0,
            world_size: 1,
            split_ratios: [0.8, 0.1, 0.1],
            split_seed: 0,
            seed: 0,
            num_prefetch: 3,
            default_batch_size: 32,
            default_sequence_length: 1024,
            bfs_child_width: 16,
            max_hops: 3,
            task_weights: None,
            task_pick: TaskPick::Weighted,
            num_threads: None,
            max_rss_bytes: None,
            temporal_filter: true,
            telemetry: true,
            prometheus_port: None,
            prometheus_host: "127.0.0.1".into(),
            local_rank: None,
            otlp_endpoint: None,
            pool_fraction: 1.0,
            debug_batch_delay_ms: 0.0,
            debug_panic_at_step: None,
        }
    }
}

fn bad(key: &str, what: String) -> Error {
    Error::InvalidArgument {
        name: key.to_string(),
        what,
    }
}

impl SamplerConfig {
    /// Check every value; `num_tasks` is the database's task count.
    pub fn validate(&self, num_tasks: usize) -> Result<()> {
        if self.world_size == 0 {
            return Err(bad("world_size", "must be >= 1, got 0".into()));
        }
        if self.rank >= self.world_size {
            return Err(bad(
                "rank",
                format!(
                    "must be in 0..{} (world_size), got {}",
                    self.world_size, self.rank
                ),
            ));
        }
        let r = self.split_ratios;
        if r.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(bad(
                "split_ratios",
                format!("must be three finite non-negative numbers, got {r:?}"),
            ));
        }
        let sum: f64 = r.iter().sum();
        if (sum - 1.0).abs() > 1e-6 {
            return Err(bad(
                "split_ratios",
                format!("must sum to 1, got {r:?} (sum {sum})"),
            ));
        }
        if self.num_prefetch == 0 || self.num_prefetch > 1024 {
            return Err(bad(
                "num_prefetch",
                format!("must be in 1..=1024, got {}", self.num_prefetch),
            ));
        }
        if self.default_batch_size == 0 || self.default_batch_size > 65_536 {
            return Err(bad(
                "default_batch_size",
                format!("must be in 1..=65536, got {}", self.default_batch_size),
            ));
        }
        if self.default_sequence_length == 0 || self.default_sequence_length > 65_535 {
            return Err(bad(
                "default_sequence_length",
                format!(
                    "must be in 1..=65535 (cell positions are u16), got {}",
                    self.default_sequence_length
                ),
            ));
        }
        if self.bfs_child_width == 0 {
            return Err(bad("bfs_child_width", "must be >= 1, got 0".into()));
        }
        if self.max_hops > 64 {
            return Err(bad(
                "max_hops",
                format!("must be in 0..=64, got {}", self.max_hops),
            ));
        }
        if let Some(n) = self.num_threads {
            if n == 0 || n > 1024 {
                return Err(bad("num_threads", format!("must be in 1..=1024, got {n}")));
            }
        }
        if let Some(w) = &self.task_weights {
            if w.len() != num_tasks {
                return Err(bad(
                    "task_weights",
                    format!("needs one weight per task ({num_tasks}), got {}", w.len()),
                ));
            }
            if let Some((i, x)) = w
                .iter()
                .enumerate()
                .find(|(_, x)| !x.is_finite() || **x < 0.0)
            {
                return Err(bad(
                    "task_weights",
                    format!("weight {i} is {x}; weights must be finite and >= 0"),
                ));
            }
            if w.iter().all(|&x| x == 0.0) {
                return Err(bad(
                    "task_weights",
                    "all weights are 0; at least one task must have weight > 0".into(),
                ));
            }
        }
        if let Some(p) = self.prometheus_port {
            let port = p as u32 + self.local_rank.unwrap_or(self.rank);
            if p == 0 || port > u16::MAX as u32 {
                return Err(bad(
                    "prometheus_port",
                    format!("{p} + local rank must be a port in 1..=65535"),
                ));
            }
            if self.prometheus_host.parse::<std::net::IpAddr>().is_err() {
                return Err(bad(
                    "prometheus_host",
                    format!("{:?} is not an IP address", self.prometheus_host),
                ));
            }
        }
        if !(self.pool_fraction > 0.0 && self.pool_fraction <= 1.0) {
            return Err(bad(
                "pool_fraction",
                format!("must be in (0, 1], got {}", self.pool_fraction),
            ));
        }
        if !(self.debug_batch_delay_ms >= 0.0 && self.debug_batch_delay_ms <= 60_000.0) {
            return Err(bad(
                "debug_batch_delay_ms",
                format!("must be in 0..=60000, got {}", self.debug_batch_delay_ms),
            ));
        }
        if let Some(m) = self.max_rss_bytes {
            if m == 0 {
                return Err(bad("max_rss_bytes", "must be > 0 when set".into()));
            }
        }
        Ok(())
    }
}

impl SamplerConfig {
    /// The exporter address for this rank, when Prometheus is on.
    pub fn prometheus_addr(&self) -> Option<std::net::SocketAddr> {
        let p = self.prometheus_port? as u32 + self.local_rank.unwrap_or(self.rank);
        let ip: std::net::IpAddr = self.prometheus_host.parse().ok()?;
        Some(std::net::SocketAddr::new(ip, p as u16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejections_name_the_key() {
        let ok = SamplerConfig::default();
        ok.validate(2).unwrap();
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
                    task_weights: Some(vec![1.0]),
                    ..ok.clone()
                },
                "task_weights",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![1.0, -1.0]),
                    ..ok.clone()
                },
                "task_weights",
            ),
            (
                SamplerConfig {
                    task_weights: Some(vec![0.0, 0.0]),
                    ..ok.clone()
                },
                "task_weights",
            ),
        ];
        for (c, key) in cases {
            match c.validate(2) {
                Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, key),
                other => panic!("{key}: expected InvalidArgument, got {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_toml_keys_are_rejected() {
        let e = toml_like_json(r#"{"rank": 0, "bogus": 1}"#).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }

    fn toml_like_json(s: &str) -> std::result::Result<SamplerConfig, serde_json::Error> {
        serde_json::from_str(s)
    }
}
