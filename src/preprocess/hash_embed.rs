//! The deterministic offline embedder (`--embedder hash`).
//!
//! Feature hashing: a string's vector is the normalised sum of pseudo-random
//! ±1 vectors, one per lower-cased word and one per character trigram of each
//! word, each vector generated from the xxh3 hash of its feature. Strings
//! sharing words or spellings therefore land close together, which makes the
//! embedding usable for tests and smoke runs without a model. Same input,
//! same bytes, on every machine.

use half::f16;
use rayon::prelude::*;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::rng::SplitMix64;

fn add_feature(acc: &mut [f32], feature: &[u8], salt: u64, weight: f32) {
    let mut rng = SplitMix64(xxh3_64_with_seed(feature, salt));
    let mut bits = 0u64;
    for (i, a) in acc.iter_mut().enumerate() {
        if i % 64 == 0 {
            bits = rng.next_u64();
        }
        *a += if bits & 1 == 1 { weight } else { -weight };
        bits >>= 1;
    }
}

fn embed_one(s: &str, out: &mut [f16], acc: &mut Vec<f32>) {
    acc.clear();
    acc.resize(out.len(), 0.0);
    let lower = s.to_lowercase();
    let mut any = false;
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        any = true;
        add_feature(acc, word.as_bytes(), 1, 1.0);
        let chars: Vec<char> = format!("<{word}>").chars().collect();
        for tri in chars.windows(3) {
            let t: String = tri.iter().collect();
            add_feature(acc, t.as_bytes(), 2, 0.5);
        }
    }
    if !any {
        // Punctuation-only or empty: hash the raw string so it still differs.
        add_feature(acc, s.as_bytes(), 3, 1.0);
    }
    let norm = acc.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = f16::from_f32(a / norm);
    }
}

/// Embed `texts` into a row-major `f16 [texts.len(), dim]` buffer.
pub fn hash_embed<S: AsRef<str> + Sync>(texts: &[S], dim: usize) -> Vec<f16> {
    let mut out = vec![f16::ZERO; texts.len() * dim];
    if dim == 0 {
        return out;
    }
    out.par_chunks_mut(dim)
        .zip(texts.par_iter())
        .for_each_init(Vec::new, |acc, (row, t)| embed_one(t.as_ref(), row, acc));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &[f16], b: &[f16]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x.to_f32() * y.to_f32()).sum()
    }

    #[test]
    fn deterministic_unit_and_similarity_aware() {
        let texts = ["red steel bolt", "red steel bolts", "green paper cup", ""];
        let a = hash_embed(&texts, 64);
        let b = hash_embed(&texts, 64);
        assert_eq!(a, b);
        let row = |i: usize| &a[i * 64..(i + 1) * 64];
        for i in 0..4 {
            assert!((cos(row(i), row(i)) - 1.0).abs() < 1e-2);
        }
        assert!(cos(row(0), row(1)) > cos(row(0), row(2)) + 0.3);
    }
}
