//! What one dependent random read into a mapped database costs, by
//! database size: the floor under the sampler's per-batch cost, whose BFS
//! and cell gather are chains of such reads.
//!
//! Every regular file of each database directory is mapped read-only the
//! way `page_cache="populate"` maps it (huge pages advised before the
//! first read, then populated), and a chain of 8-byte reads walks the
//! concatenated bytes, each offset a hash of the value the previous read
//! returned, so no two reads overlap. Databases alternate for `--rounds`;
//! the best (lowest) nanoseconds per read of each is kept.
//!
//! ```text
//! cargo run --release --example random_access -- [--reads N] [--rounds R] DB...
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Mapped {
    maps: Vec<memmap2::Mmap>,
    /// Start of each map in the concatenation, plus the total.
    starts: Vec<u64>,
}

fn map_database(dir: &Path) -> std::io::Result<Mapped> {
    let mut paths: Vec<PathBuf> = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.metadata()?.len() >= 4096 {
                paths.push(p);
            }
        }
    }
    paths.sort();
    let mut maps = Vec::new();
    let mut starts = vec![0u64];
    for p in paths {
        // SAFETY: read-only maps of files nothing writes while this runs.
        let map = unsafe { memmap2::Mmap::map(&File::open(&p)?)? };
        #[cfg(target_os = "linux")]
        {
            let _ = map.advise(memmap2::Advice::HugePage);
            let _ = map.advise(memmap2::Advice::PopulateRead);
        }
        starts.push(starts.last().copied().unwrap_or(0) + map.len() as u64);
        maps.push(map);
    }
    Ok(Mapped { maps, starts })
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Nanoseconds per read of a chain of `reads` dependent random reads.
fn chase(m: &Mapped, reads: u64, seed: u64) -> f64 {
    let total = *m.starts.last().expect("one start at least");
    let mut x = mix(seed);
    let t = Instant::now();
    for _ in 0..reads {
        let at = (x % total) & !7;
        let f = m.starts.partition_point(|&s| s <= at) - 1;
        let off = (at - m.starts[f]) as usize;
        let map = &m.maps[f];
        let off = off.min(map.len() - 8);
        let v = u64::from_le_bytes(map[off..off + 8].try_into().expect("8 bytes"));
        x = mix(x ^ v);
    }
    std::hint::black_box(x);
    t.elapsed().as_nanos() as f64 / reads as f64
}

fn smaps_line(key: &str) -> String {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).map(str::to_owned))
        .unwrap_or_default()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut reads, mut rounds, mut dirs) = (20_000_000u64, 3usize, Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reads" => reads = args.next().ok_or("--reads needs a value")?.parse()?,
            "--rounds" => rounds = args.next().ok_or("--rounds needs a value")?.parse()?,
            _ => dirs.push(PathBuf::from(a)),
        }
    }
    if dirs.is_empty() {
        return Err("usage: random_access [--reads N] [--rounds R] DB...".into());
    }
    let mut dbs = Vec::new();
    for d in &dirs {
        let t = Instant::now();
        let m = map_database(d)?;
        let bytes = *m.starts.last().unwrap_or(&0);
        if bytes == 0 {
            return Err(format!("{}: no file of 4 KiB or more", d.display()).into());
        }
        println!(
            "{}: {} files, {:.2} GiB mapped and populated in {:.1} s",
            d.display(),
            m.maps.len(),
            bytes as f64 / f64::from(1 << 30),
            t.elapsed().as_secs_f64()
        );
        dbs.push(m);
    }
    println!("{}", smaps_line("FilePmdMapped"));
    let mut best = vec![f64::INFINITY; dbs.len()];
    for r in 0..rounds {
        for (i, m) in dbs.iter().enumerate() {
            let ns = chase(m, reads, (r * dbs.len() + i) as u64);
            println!("round {r}: {}: {ns:.1} ns per read", dirs[i].display());
            best[i] = best[i].min(ns);
        }
    }
    for (i, d) in dirs.iter().enumerate() {
        println!(
            "best {}: {:.1} ns per read, x{:.2} the first",
            d.display(),
            best[i],
            best[i] / best[0]
        );
    }
    Ok(())
}
