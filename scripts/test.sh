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
# One JAX compilation cache for both phases and every worker (a step is
# compiled once per session, not once per worker).
HEADWATER_TEST_JAX_CACHE=$(mktemp -d)
export HEADWATER_TEST_JAX_CACHE
trap 'rm -rf "$HEADWATER_TEST_JAX_CACHE"' EXIT
rc=0
# Most tests on two workers, a whole file per worker (its module fixtures
# are made once)...
"$PY" -m pytest -q --durations=20 -n "${HEADWATER_TEST_WORKERS:-2}" --dist loadfile \
  -m "not slow and not serial" || rc=$?
# ... then, alone, the tests that judge the host as they run (verdicts and
# diagnostic bands under load, stall and Ctrl-C timing, peer timeouts, the
# page cache): tests/python/conftest.py SERIAL_MODULES.
"$PY" -m pytest -q --durations=20 -m "serial and not slow" || rc=$?
exit $rc
