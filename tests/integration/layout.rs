//! The layout rule of CONTRIBUTING.md on the Rust sources: no `.rs` file under
//! `src/` or a floor's `crates/*/src/` is over 600 lines, except a named data table (long because it
//! lists many rows, not because it holds logic), whose module doc says it
//! is a data table. Function length is clippy's `too_many_lines`
//! (threshold 80 in `clippy.toml`).

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

/// Files allowed over the limit because they are data tables; each one's
/// module doc must say "data table".
const DATA_TABLES: &[&str] = &["crates/telemetry/src/rows.rs"];

/// Files over the limit while their room is being split.
// being split
const BEING_SPLIT: &[&str] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_600_lines_unless_a_named_data_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for floor in std::fs::read_dir(root.join("crates")).unwrap() {
        rust_files(&floor.unwrap().path().join("src"), &mut files);
    }
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("crates/format/src/lib.rs")),
        "the floors' sources were not found"
    );
    files.sort();
    let mut problems = Vec::new();
    let mut over = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(path).unwrap();
        let lines = text.lines().count();
        if lines <= MAX_LINES {
            continue;
        }
        over.push(rel.clone());
        if DATA_TABLES.contains(&rel.as_str()) {
            let module_doc = text
                .lines()
                .take_while(|l| l.starts_with("//!"))
                .map(|l| l.trim_start_matches("//!").trim())
                .collect::<Vec<_>>()
                .join(" ");
            if !module_doc.contains("data table") {
                problems.push(format!(
                    "{rel}: listed as a data table, but its module doc does not say so"
                ));
            }
        } else if !BEING_SPLIT.contains(&rel.as_str()) {
            problems.push(format!(
                "{rel}: {lines} lines, over {MAX_LINES}: split it at its seams (CONTRIBUTING.md), \
                 or, if it is a data table, say so in its module doc and list it in DATA_TABLES"
            ));
        }
    }
    // The allow-lists only shrink: an entry under the limit (or gone) is
    // taken off, so a split file cannot grow back unnoticed.
    for rel in DATA_TABLES.iter().chain(BEING_SPLIT) {
        if !over.iter().any(|o| o == rel) {
            problems.push(format!(
                "{rel}: listed in tests/integration/layout.rs but not over {MAX_LINES} lines; remove it from the list"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
