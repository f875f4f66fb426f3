//! Verifying a file's payload checksum reads every byte through the file's
//! mapping; the pages it has hashed must leave the process's resident set
//! (the page cache keeps them), or verifying a 13 GB database at write time
//! or with `headwater verify` holds 13 GB of RSS. Its own test binary (one
//! process, nothing else mapping files beside it), so the mapped pages
//! counted are this test's.

// Tests spell out their cases in line; the 80-line bound on functions
// (clippy.toml) is for the library.
#![allow(clippy::too_many_lines)]

use headwater::format::{FileKind, FileWriter, MappedFile, Section};

/// This process's resident file-backed pages (`RssFile`), bytes.
fn rss_file() -> u64 {
    headwater::sampler::status_bytes("RssFile:").expect("/proc/self/status RssFile")
}

#[test]
fn verifying_a_payload_does_not_keep_its_pages_resident() {
    const MIB: usize = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big_embeddings.bin");
    let payload: Vec<u8> = (0..96 * MIB).map(|i| (i * 7 + i / 4099) as u8).collect();
    let mut w = FileWriter::create(&path, FileKind::Embeddings, 1).unwrap();
    w.section(Section(&payload)).unwrap();
    w.finish().unwrap();
    drop(payload);
    let f = MappedFile::open(&path, FileKind::Embeddings, Some(1)).unwrap();
    let before = rss_file();
    let mut peak = 0u64;
    f.verify_payload(&mut |_| peak = peak.max(rss_file()))
        .unwrap();
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 40 * MIB as u64,
        "hashing 96 MiB kept {} MiB of its pages resident",
        grown / MIB as u64
    );
}
