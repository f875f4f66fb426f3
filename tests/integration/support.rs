//! Shared helpers for the integration tests.

use std::fs;
use std::path::{Path, PathBuf};

pub fn golden_v1() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_v1")
}

pub fn golden_v2() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_v2")
}

pub fn expected_v2() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_v2_expected.json");
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

pub fn expected_v1() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden_v1_expected.json");
    serde_json::from_slice(&fs::read(p).unwrap()).unwrap()
}

/// Recursively copy a directory.
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// A fresh copy of the golden database in a temp dir.
pub fn golden_copy() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    copy_dir(&golden_v1(), &dir);
    (tmp, dir)
}
