//! Named recipes (`recipe`): a set of keys that belong together, applied
//! to the keys the user did not give, consistently with the run's `S`.
//!
//! `"rt-j"` is the relational-transformer pretraining recipe of RT-J:
//! in-context contexts (`examples`) with walk-ranked examples (10,000 walks
//! of 20 rows), per-sequence draws of the local context size from
//! 256 / 512 / 1024 cells and of the BFS width from 8 … 256 children, and
//! recency-first ranking on or off. A list value above the run's longest `S`
//! is left out (all of them: the list is `[S]`), so the recipe holds for any
//! sequence length; a task that cannot have examples (a query task, whose
//! target is outside its anchor table, without a label `window`) gets
//! weight 0 with one warning naming it instead of refusing the config.

use serde::{Deserialize, Serialize};

use super::{ExampleRanker, SamplerConfig};

/// A named recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recipe {
    /// RT-J's in-context pretraining recipe.
    #[serde(rename = "rt-j")]
    RtJ,
}

/// RT-J's per-sequence local context sizes (cells).
const RTJ_LOCAL: [usize; 3] = [256, 512, 1024];
/// RT-J's per-sequence BFS widths.
const RTJ_WIDTHS: [usize; 6] = [8, 16, 32, 64, 128, 256];

/// `values` up to `s`, or `[s]` when none is.
fn up_to(values: &[usize], s: usize) -> Vec<usize> {
    let kept: Vec<usize> = values.iter().copied().filter(|&v| v <= s).collect();
    if kept.is_empty() {
        vec![s]
    } else {
        kept
    }
}

impl SamplerConfig {
    /// Apply `recipe` to every key of it not in `given` (the keys the user
    /// set).
    pub(super) fn apply_recipe(&mut self, given: &dyn Fn(&str) -> bool) {
        let Some(Recipe::RtJ) = self.recipe else {
            return;
        };
        let s = self.max_sequence_length();
        if !given("examples") {
            self.examples = true;
        }
        if !given("local_context_sizes") {
            self.local_context_sizes = up_to(&RTJ_LOCAL, s);
        }
        if !given("bfs_widths") {
            self.bfs_widths = up_to(&RTJ_WIDTHS, s);
        }
        if !given("prefer_latest") {
            self.prefer_latest = vec![false, true];
        }
        if !given("num_walks") {
            self.num_walks = 10_000;
        }
        if !given("walk_length") {
            self.walk_length = 20;
        }
        if !given("example_ranker") {
            self.example_ranker = ExampleRanker::Walks;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recipe_fits_the_run_and_leaves_given_keys_alone() {
        let cfg = SamplerConfig::from_json(&serde_json::json!({
            "recipe": "rt-j", "default_sequence_length": 600, "num_walks": 50
        }))
        .unwrap();
        assert!(cfg.examples);
        assert_eq!(cfg.local_context_sizes, [256, 512]);
        assert_eq!(cfg.bfs_widths, [8, 16, 32, 64, 128, 256]);
        assert_eq!(cfg.num_walks, 50, "a given key wins");
        cfg.validate(None).unwrap();
        let small = SamplerConfig::from_json(&serde_json::json!({
            "recipe": "rt-j", "default_sequence_length": 64
        }))
        .unwrap();
        assert_eq!(small.local_context_sizes, [64]);
        assert_eq!(small.bfs_widths, [8, 16, 32, 64]);
        small.validate(None).unwrap();
        let off = SamplerConfig::from_json(&serde_json::json!({
            "recipe": "rt-j", "examples": false
        }))
        .unwrap();
        assert!(!off.examples);
        assert!(SamplerConfig::from_json(&serde_json::json!({"recipe": "rtj"})).is_err());
    }

    #[test]
    fn a_recipe_set_over_a_whole_config_sets_its_keys() {
        // `headwater bench --sampler-set recipe=rt-j`: the base config has
        // every key, but only the keys set over it are choices.
        let base = SamplerConfig {
            default_sequence_length: 512,
            ..SamplerConfig::default()
        };
        let over = serde_json::json!({"recipe": "rt-j", "num_walks": 70});
        let cfg = base.with_keys(over.as_object().unwrap()).unwrap();
        assert!(cfg.examples);
        assert_eq!(cfg.local_context_sizes, [256, 512]);
        assert_eq!(cfg.num_walks, 70);
        assert_eq!(cfg.default_sequence_length, 512);
        let plain = base
            .with_keys(serde_json::json!({"seed_windows": 4}).as_object().unwrap())
            .unwrap();
        assert!(!plain.examples && plain.seed_windows == 4);
    }
}
