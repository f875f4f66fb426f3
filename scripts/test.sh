#!/usr/bin/env bash
# Install everything and run the whole default test suite (Rust + Python).
# Benchmarks are `headwater bench` and `cargo bench`, not part of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
PY=${PYTHON:-python3}

echo "== lint"
cargo fmt --all --check
# Every crate of the workspace, the binding (crates/python) included.
cargo clippy --quiet --workspace --all-targets -- -D warnings
# Telemetry without its exporters (features `prometheus`, `otlp`) builds clean.
cargo clippy --quiet -p headwater-telemetry --no-default-features --all-targets -- -D warnings
"$PY" -m ruff check python tests
"$PY" -m mypy python/headwater
"$PY" -m mypy.stubtest headwater._native --allowlist tests/stubtest_allowlist.txt
# The docs site: a broken link or anchor, or a page missing from the nav, fails.
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"

echo "== cargo test"
cargo test --quiet
# The exporters' stand-ins of a build without them refuse, naming the feature.
cargo test --quiet -p headwater-telemetry --no-default-features

echo "== pytest"
# Tests must not touch the user's cache.
export HEADWATER_CACHE_DIR="${HEADWATER_CACHE_DIR:-$(mktemp -d)}"
"$PY" -m pytest -q --durations=30
