//! Golomb–Rice codes, the bits of a stored item's rows (`item.rs`): a value
//! `x` under parameter `k` is `x >> k` in unary (that many 1 bits, then a
//! 0) and its low `k` bits; a quotient of [`ESCAPE`] or more is written as
//! [`ESCAPE`] 1 bits and the value in 32 bits, so one outlier costs 56 bits,
//! never thousands. For values spread like a geometric distribution (the
//! gaps between an item's rows, its visit ranks) the best `k` comes within
//! a bit or so of the entropy, where a varint rounds every value up to 7 or
//! 14 bits. Bits are written least significant first.
//!
//! Never: a read past the bytes (a cut stream reads as `None`).

/// Quotients at and above this are escaped.
const ESCAPE: u64 = 24;

/// The `k` of `xs` with the fewest bits, and that many bits.
pub fn best_k(xs: impl Iterator<Item = u32> + Clone) -> (u32, u64) {
    (0..32)
        .map(|k| (k, xs.clone().map(|x| cost(u64::from(x), k)).sum::<u64>()))
        .min_by_key(|&(k, bits)| (bits, k))
        .unwrap_or((0, 0))
}

/// Bits of `x` under `k`.
fn cost(x: u64, k: u32) -> u64 {
    let q = x >> k;
    if q >= ESCAPE {
        ESCAPE + 32
    } else {
        q + 1 + u64::from(k)
    }
}

/// Bits appended to a byte vector.
pub struct Writer<'o> {
    out: &'o mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl<'o> Writer<'o> {
    pub fn new(out: &'o mut Vec<u8>) -> Self {
        Writer { out, acc: 0, n: 0 }
    }

    /// The low `width` (at most 32) bits of `v`.
    fn bits(&mut self, v: u64, width: u32) {
        debug_assert!(width <= 32);
        self.acc |= (v & ((1u64 << width) - 1)) << self.n;
        self.n += width;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// `x` under `k`.
    pub fn rice(&mut self, x: u32, k: u32) {
        let x = u64::from(x);
        let q = x >> k;
        if q >= ESCAPE {
            self.bits((1 << ESCAPE) - 1, ESCAPE as u32);
            self.bits(x, 32);
        } else {
            self.bits((1 << q) - 1, q as u32);
            self.bits(0, 1);
            self.bits(x, k);
        }
    }

    /// Flush the last partial byte (its high bits 0).
    pub fn finish(mut self) {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.n = 0;
    }
}

/// Bits read from a byte slice.
pub struct Reader<'b> {
    b: &'b [u8],
    pos: usize,
}

impl<'b> Reader<'b> {
    pub fn new(b: &'b [u8]) -> Self {
        Reader { b, pos: 0 }
    }

    /// The 57 or more bits from the position on (zeros past the end).
    fn peek(&self) -> u64 {
        let at = self.pos / 8;
        let mut word = [0u8; 8];
        let have = self.b.len().saturating_sub(at).min(8);
        word[..have].copy_from_slice(&self.b[at..at + have]);
        u64::from_le_bytes(word) >> (self.pos % 8)
    }

    /// Move past `n` bits, if the bytes hold them.
    fn skip(&mut self, n: usize) -> Option<()> {
        let end = self.pos + n;
        (end <= 8 * self.b.len()).then(|| self.pos = end)
    }

    /// The next value under `k` (at most 31): its quotient's 1 bits
    /// counted at once, its low bits taken from the same word.
    pub fn rice(&mut self, k: u32) -> Option<u32> {
        let w = self.peek();
        let q = u64::from(w.trailing_ones());
        if q >= ESCAPE {
            self.skip(ESCAPE as usize)?;
            let x = self.peek() & 0xffff_ffff;
            self.skip(32)?;
            return u32::try_from(x).ok();
        }
        // q + 1 + k <= 56 bits, all within the word.
        let low = (w >> (q + 1)) & ((1u64 << k) - 1);
        self.skip((q + 1) as usize + k as usize)?;
        u32::try_from((q << k) | low).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Xoshiro256pp;

    #[test]
    fn codes_round_trip_with_escapes_and_stop_at_a_cut() {
        let mut rng = Xoshiro256pp::seed_from_u64(3);
        for k in [0, 1, 5, 9, 20, 31] {
            let xs: Vec<u32> = (0..300)
                .map(|i| match i % 50 {
                    0 => u32::MAX,
                    1 => 0,
                    _ => rng.below(1 << (k + 2).min(31)) as u32,
                })
                .collect();
            let mut b = Vec::new();
            let mut w = Writer::new(&mut b);
            for &x in &xs {
                w.rice(x, k);
            }
            w.finish();
            let bits: u64 = xs.iter().map(|&x| cost(u64::from(x), k)).sum();
            assert_eq!(b.len() as u64, bits.div_ceil(8), "k {k}");
            let mut r = Reader::new(&b);
            let back: Vec<u32> = (0..xs.len()).map_while(|_| r.rice(k)).collect();
            assert_eq!(back, xs, "k {k}");
            let mut cut = Reader::new(&b[..b.len() / 2]);
            assert!((0..xs.len()).map_while(|_| cut.rice(k)).count() < xs.len());
        }
    }

    #[test]
    fn the_best_k_fits_the_spread() {
        let small = [1u32, 2, 3, 1, 0, 2];
        assert!(best_k(small.iter().copied()).0 <= 1);
        let wide: Vec<u32> = (0..100).map(|i| 600 + 7 * i).collect();
        let (k, bits) = best_k(wide.iter().copied());
        assert!((8..=10).contains(&k), "{k}");
        assert!(bits < 100 * 12, "{bits}");
    }
}
