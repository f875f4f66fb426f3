//! The 15-float timestamp encoding: 7 sin/cos pairs (second of minute,
//! minute of hour, hour of day, day of week, day of month, month of year, day
//! of year) and the epoch z-scored with database-wide statistics.

use std::sync::LazyLock;

/// Floats per encoded timestamp (calendar features and the z-scored time).
pub const TIMESTAMP_DIM: usize = 15;

/// The periods with integer positions: seconds and minutes (60), hours
/// (24), weekdays (7), months (12), month lengths (28..=31), year lengths.
const PERIODS: [u32; 10] = [60, 24, 7, 12, 28, 29, 30, 31, 365, 366];

/// `(sin, cos)` of `2π k / n` for every period `n` above and `k < n`, computed
/// exactly as the direct formula would, so a table lookup replaces the trig
/// on the hot path without changing a bit of the output.
static TURNS: LazyLock<(Vec<usize>, Vec<[f32; 2]>)> = LazyLock::new(|| {
    let mut offsets = Vec::new();
    let mut table = Vec::new();
    for n in PERIODS {
        offsets.push(table.len());
        for k in 0..n {
            table.push(turn(k as f64 / n as f64));
        }
    }
    (offsets, table)
});

#[inline]
fn turn(frac: f64) -> [f32; 2] {
    let (s, c) = (std::f64::consts::TAU * frac).sin_cos();
    [s as f32, c as f32]
}

#[inline]
fn turn_of(k: u32, n: u32) -> [f32; 2] {
    let (offsets, table) = &*TURNS;
    let i = match n {
        60 => 0,
        24 => 1,
        7 => 2,
        12 => 3,
        28..=31 => 4 + (n - 28) as usize,
        365 => 8,
        366 => 9,
        _ => unreachable!("period {n} is not tabulated"),
    };
    table[offsets[i] + k as usize]
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31) (Hinnant's
/// civil-from-days, proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

const CUM_DAYS: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
const MONTH_DAYS: [u32; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/// The 14 calendar floats of `us` (µs since the epoch): the encoding
/// without the z-scored time.
fn calendar(us: i64) -> [f32; CALENDAR_DIM] {
    const DAY: i64 = 86_400_000_000;
    let days = us.div_euclid(DAY);
    let in_day_us = us.rem_euclid(DAY);
    let secs = (in_day_us / 1_000_000) as u32; // whole seconds into the day
    let (y, m, d) = civil(days);
    let leap = is_leap(y);
    let month_len = MONTH_DAYS[m as usize - 1] + (m == 2 && leap) as u32;
    let yday = CUM_DAYS[m as usize - 1] + (m > 2 && leap) as u32 + d - 1;
    let weekday = (days + 3).rem_euclid(7) as u32; // 1970-01-01 was a Thursday; Monday = 0
    let second = if in_day_us % 1_000_000 == 0 {
        turn_of(secs % 60, 60)
    } else {
        turn(((in_day_us as f64 / 1e6) % 60.0) / 60.0)
    };
    let pairs = [
        second,
        turn_of((secs / 60) % 60, 60),
        turn_of(secs / 3600, 24),
        turn_of(weekday, 7),
        turn_of(d - 1, month_len),
        turn_of(m - 1, 12),
        turn_of(yday, 365 + leap as u32),
    ];
    let mut out = [0f32; CALENDAR_DIM];
    for (i, [s, c]) in pairs.into_iter().enumerate() {
        out[2 * i] = s;
        out[2 * i + 1] = c;
    }
    out
}

/// Calendar floats per timestamp (all but the z-scored time).
const CALENDAR_DIM: usize = TIMESTAMP_DIM - 1;

/// Encode `us` (µs since the epoch) into `out`.
pub fn encode_timestamp(us: i64, mean_us: f64, std_us: f64, out: &mut [f32]) {
    out[..CALENDAR_DIM].copy_from_slice(&calendar(us));
    out[CALENDAR_DIM] = ((us as f64 - mean_us) / std_us) as f32;
}

/// A per-worker memo of calendar encodings: a direct-mapped table of the
/// last timestamp seen in each of its slots. Databases repeat timestamp
/// values (dates, whole hours), so most cells copy 56 bytes instead of
/// computing the date and seven table lookups; the output is the same
/// bit for bit ([`encode_timestamp`] is the definition). 4096 slots
/// (256 KiB): seven years of distinct dates fit with few collisions.
#[derive(Debug, Default)]
pub struct TimestampMemo {
    keys: Vec<i64>,
    values: Vec<[f32; CALENDAR_DIM]>,
}

impl TimestampMemo {
    const BITS: u32 = 12;

    /// Encode `us` into `out`, exactly as [`encode_timestamp`] does.
    #[inline]
    pub fn encode(&mut self, us: i64, mean_us: f64, std_us: f64, out: &mut [f32]) {
        if self.keys.is_empty() {
            // Every slot starts as a valid entry (of i64::MIN), so a slot's
            // value always matches its key.
            self.keys = vec![i64::MIN; 1 << Self::BITS];
            self.values = vec![calendar(i64::MIN); 1 << Self::BITS];
        }
        let slot = ((us as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - Self::BITS)) as usize;
        if self.keys[slot] != us {
            self.keys[slot] = us;
            self.values[slot] = calendar(us);
        }
        out[..CALENDAR_DIM].copy_from_slice(&self.values[slot]);
        out[CALENDAR_DIM] = ((us as f64 - mean_us) / std_us) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_723), (2024, 1, 1));
        assert_eq!(civil(19_782), (2024, 2, 29));
        assert_eq!(civil(-1), (1969, 12, 31));
        let mut out = [0f32; 15];
        // 2024-01-01 (a Monday) 00:00:00.
        encode_timestamp(19_723 * 86_400_000_000, 0.0, 1.0, &mut out);
        for i in 0..7 {
            assert!(
                out[2 * i].abs() < 1e-6 && (out[2 * i + 1] - 1.0).abs() < 1e-6,
                "pair {i}: {out:?}"
            );
        }
        // Noon: hour pair at half a turn.
        encode_timestamp(
            19_723 * 86_400_000_000 + 12 * 3_600_000_000,
            0.0,
            1.0,
            &mut out,
        );
        assert!((out[5] + 1.0).abs() < 1e-6);
        encode_timestamp(1_000_000, 500_000.0, 250_000.0, &mut out);
        assert!((out[14] - 2.0).abs() < 1e-6);
    }

    /// The direct formula the table replaces.
    fn reference(us: i64, out: &mut [f32]) {
        const DAY: i64 = 86_400_000_000;
        let days = us.div_euclid(DAY);
        let in_day = us.rem_euclid(DAY) as f64 / 1e6;
        let (y, m, d) = civil(days);
        let leap = is_leap(y);
        let month_len = MONTH_DAYS[m as usize - 1] + (m == 2 && leap) as u32;
        let yday = CUM_DAYS[m as usize - 1] + (m > 2 && leap) as u32 + d - 1;
        let weekday = (days + 3).rem_euclid(7);
        let fracs = [
            (in_day % 60.0) / 60.0,
            ((in_day / 60.0).floor() % 60.0) / 60.0,
            (in_day / 3600.0).floor() / 24.0,
            weekday as f64 / 7.0,
            (d - 1) as f64 / month_len as f64,
            (m - 1) as f64 / 12.0,
            yday as f64 / (365 + leap as u32) as f64,
        ];
        for (i, f) in fracs.iter().enumerate() {
            let [s, c] = turn(*f);
            out[2 * i] = s;
            out[2 * i + 1] = c;
        }
    }

    #[test]
    fn table_matches_the_direct_formula_bit_for_bit() {
        let mut rng = crate::rng::Xoshiro256pp::seed_from_u64(5);
        let (mut a, mut b) = ([0f32; 15], [0f32; 15]);
        for i in 0..20_000 {
            // Whole days, whole seconds and arbitrary µs, before and after 1970.
            let span = 200 * 365 * 86_400_000_000u64;
            let mut us = rng.below(span) as i64 - (span / 2) as i64;
            match i % 3 {
                0 => us -= us.rem_euclid(86_400_000_000),
                1 => us -= us.rem_euclid(1_000_000),
                _ => {}
            }
            encode_timestamp(us, 0.0, 1.0, &mut a);
            reference(us, &mut b);
            assert_eq!(a[..14], b[..14], "{us}");
        }
    }

    #[test]
    fn the_memo_encodes_exactly_as_the_definition() {
        let mut rng = crate::rng::Xoshiro256pp::seed_from_u64(9);
        let mut memo = TimestampMemo::default();
        let (mut a, mut b) = ([0f32; 15], [0f32; 15]);
        // Few distinct values (hits and evictions) and i64::MIN (the
        // value empty slots start with).
        let values: Vec<i64> = (0..3000)
            .map(|_| rng.below(4000) as i64 * 86_400_000_000 - 3_000_000 + rng.below(3) as i64)
            .chain([i64::MIN, 0, i64::MAX])
            .collect();
        for _ in 0..4 {
            for &us in &values {
                memo.encode(us, 3.0, 7.0, &mut a);
                encode_timestamp(us, 3.0, 7.0, &mut b);
                assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "{us}");
            }
        }
    }
}
