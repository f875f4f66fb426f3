#!/usr/bin/env bash
# Install everything and run the whole default test suite (Rust + Python).
# Benchmarks are `headwater bench` and `cargo bench`, not part of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
PY=${PYTHON:-python3}

echo "== lint"
cargo fmt --check
cargo clippy --quiet --all-targets -- -D warnings
cargo clippy --quiet --all-targets --features python -- -D warnings
"$PY" -m ruff check python tests
"$PY" -m mypy python/headwater
"$PY" -m mypy.stubtest headwater._native --allowlist tests/stubtest_allowlist.txt

echo "== cargo test"
cargo test --quiet

echo "== pytest"
# Tests must not touch the user's cache.
export HEADWATER_CACHE_DIR="${HEADWATER_CACHE_DIR:-$(mktemp -d)}"
"$PY" -m pytest -q
