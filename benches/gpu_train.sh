#!/usr/bin/env bash
# GPU baseline of `headwater train` (the GPU evidence): the
# CURRENT synchronous step loop, one process, one GPU, sampler on the host's
# CPU threads. Run from the repository root on the GPU machine:
#
#   OUT=/tmp/out bash benches/gpu_train.sh            # (the device tool sets OUT)
#
# Expects (carried beside the checkout, git-ignored):
#   .devcarry/_native.cpython-312-x86_64-linux-gnu.so  the extension, built for
#       the machine's Python (here: PYO3_CONFIG_FILE with version=3.12,
#       cargo build --release -p headwater-python, then strip --strip-debug)
#   .devcarry/db/<name>/      a database (`headwater default-db` output)
#   .devcarry/site_optax/     optax, used only if the machine's optax lacks Muon
# Phases (each under `timeout`, skipped when the call's time budget is short):
#   env      nvidia-smi, python, jax / jaxlib / optax versions, jax.devices()
#   bench    headwater bench DB --batch-size B0 --seq-len S --threads BENCH_THREADS
#   replay   the train step on cached batches (no sampler in the loop): the
#            batches/s the GPU needs for zero data wait, (a) with the current
#            loop's per-step work (pad + shard + step + metrics to host) and
#            (b) device-only (pre-padded batches, no per-step sync)
#   train    headwater train --profile at B0 with sampler num_threads in
#            TRAIN_THREADS ("default" = the config default, 1), then the
#            larger B (BIG_BS, BIG_THREADS threads), then LATE_THREADS at B0
#   summary  results.json from every run's rank-0.json and metrics.jsonl
# Knobs (environment): see the defaults below; the rehearsal on a CPU machine
# used JAX_PLATFORMS=cpu S=128 STEPS=8 WARM=3 BIG_BS=64 BIG_STEPS=6 BIG_WARM=2
# TRAIN_THREADS="default 2" LATE_THREADS=4 BENCH_THREADS=1,2 BENCH_STEPS=20 REPLAY_STEPS=5.
set -x
set -o pipefail
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
export JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
S=${S:-1024}
B0=${B0:-32}
STEPS=${STEPS:-120}
WARM=${WARM:-20}
BIG_BS=${BIG_BS:-"64 128 256 512 1024"}
BIG_STEPS=${BIG_STEPS:-60}
BIG_WARM=${BIG_WARM:-15}
TRAIN_THREADS=${TRAIN_THREADS:-"default 2"}   # at B0, first
BIG_THREADS=${BIG_THREADS:-8}                  # sampler threads for the larger B
LATE_THREADS=${LATE_THREADS:-"8 4"}            # more B0 runs, last (if time is left)
BENCH_THREADS=${BENCH_THREADS:-1,2,4,8,16}
BENCH_STEPS=${BENCH_STEPS:-200}
REPLAY_STEPS=${REPLAY_STEPS:-100}
# (TRAIN_THREADS / LATE_THREADS / BIG_BS=" ", one space, skip those runs)
BUDGET_S=${BUDGET_S:-540}          # stop starting phases after this many seconds
RUN_TIMEOUT=${RUN_TIMEOUT:-150}    # one train run at most
RUNS=${RUNS:-/tmp/hw-gpu-runs}
DB=${DB:-$(ls -d "$ROOT"/.devcarry/db/*/ | head -1)}
DB=${DB%/}
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/hw-jax-cache}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}

if [ -f "$ROOT/.devcarry/_native.cpython-312-x86_64-linux-gnu.so" ]; then
    cp "$ROOT/.devcarry/_native.cpython-312-x86_64-linux-gnu.so" "$ROOT/python/headwater/"
fi
export PYTHONPATH=$ROOT/.devcarry/site:$ROOT/python
if ! python3 -c "from optax.contrib import MuonDimensionNumbers" 2>/dev/null; then
    export PYTHONPATH=$ROOT/.devcarry/site_optax:$PYTHONPATH
fi
HW="python3 -m headwater.cli"
rm -rf "$RUNS"
mkdir -p "$RUNS"

left() { echo $((BUDGET_S - SECONDS)); }
phase() { echo "=== $(date -u +%H:%M:%S) t=${SECONDS}s phase $*" | tee -a "$OUT/phases.txt"; }

# ---- env ------------------------------------------------------------------
phase env
{
    date -u
    nvidia-smi || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    nproc
    python3 -c "
import sys, jax, jaxlib, optax, numpy
print('python', sys.version.split()[0])
print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'optax', optax.__version__, optax.__file__, 'numpy', numpy.__version__)
print('JAX_PLATFORMS', __import__('os').environ.get('JAX_PLATFORMS'))
print('devices', jax.devices(), 'backend', jax.default_backend())
from headwater import _native
print('headwater extension', _native.__file__)
"
} 2>&1 | tee "$OUT/env.txt"

# GPU utilisation and memory every 500 ms for the whole call.
SMI_PID=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 \
        >"$OUT/smi.csv" 2>&1 &
    SMI_PID=$!
fi

# ---- bench ----------------------------------------------------------------
phase bench
timeout 120 $HW bench "$DB" --batch-size "$B0" --seq-len "$S" --threads "$BENCH_THREADS" \
    --steps "$BENCH_STEPS" --json >"$OUT/bench.json"
echo "bench rc=$?"
timeout 60 python3 -c "
import json, sys
from headwater.bench import format_bench
print(format_bench(json.load(open(sys.argv[1]))))" "$OUT/bench.json"

# ---- replay (the GPU's need with the sampler cost removed) ------------------
cat >/tmp/hw_replay.py <<'EOF'
import dataclasses, json, statistics, sys, time
import jax
import numpy as np
from jax.sharding import PartitionSpec as P
from headwater import _native
from headwater.cluster.mesh import Mesh, host
from headwater.model import transformer as M
from headwater.model.device import tables_to_device
from headwater.runconfig.config import load_config
from headwater.evaluation.padder import Padder

db, B, S, N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = load_config(None, **{"sampler.default_batch_size": B,
                           "sampler.default_sequence_length": S, "train.steps": N})
with _native.Sampler(db, rank=0, world_size=1, **cfg.sampler_kwargs(0)) as s:
    mc = dataclasses.replace(cfg.model, max_categories=M.max_categories(s.database_metadata()))
    col_np, cat_np = s.column_embeddings(), s.categorical_embeddings()
    mesh = Mesh()
    col, cat = mesh.replicate(tables_to_device(col_np, cat_np))
    lp = M.init_params(0, mc, int(col_np.shape[1]))
    params, opt = mesh.replicate(lp), mesh.replicate(M.init_opt_state(lp, cfg.optim))
    fn = mesh.step_fn(M.make_train_step(mc, cfg.optim, axis_name="data"),
                      in_specs=(P(), P(), P("data"), P(), P()), out_specs=(P(), P(), P()))
    raw = [{k: np.array(v) for k, v in s.next_train_batch().items()} for _ in range(8)]
pad = Padder(mesh, mc.max_categories)
for b in raw:
    pad(b)  # grow the high-water mark so every replayed batch has one shape
dev = [pad(b) for b in raw]
t0 = time.perf_counter()
for i in range(3):
    params, opt, m = fn(params, opt, dev[i % 8], col, cat)
    float(host(m["loss"]))
compile_s = time.perf_counter() - t0
# (a) the current loop without the sampler: pad + shard + block, step, every metric to host
loop = []
for i in range(N):
    t = time.perf_counter()
    b = pad(raw[i % 8]); jax.block_until_ready(b)
    params, opt, m = fn(params, opt, b, col, cat)
    {k: float(host(v)) for k, v in m.items()}
    loop.append(time.perf_counter() - t)
# (b) device only: pre-padded batches, no per-step sync
t = time.perf_counter()
for i in range(N):
    params, opt, m = fn(params, opt, dev[i % 8], col, cat)
jax.block_until_ready((params, m))
dev_s = (time.perf_counter() - t) / N
med = statistics.median(loop)
r = {"B": B, "S": S, "steps": N, "backend": jax.default_backend(), "devices": str(jax.devices()),
     "padded_shapes": {k: list(v.shape) for k, v in dev[0].items() if k in ("text_batch_embeddings", "fk_adj")},
     "first3_steps_s": compile_s,
     "loop_step_median_ms": 1e3 * med, "loop_step_mean_ms": 1e3 * statistics.mean(loop),
     "loop_need_batches_per_s": 1 / med,
     "device_step_ms": 1e3 * dev_s, "device_need_batches_per_s": 1 / dev_s}
print(json.dumps(r))
EOF
for B in ${REPLAY_BS-$B0}; do   # REPLAY_BS="" skips the replay
    [ "$(left)" -gt 60 ] || { echo "skip replay B=$B: budget"; continue; }
    phase replay B=$B
    timeout 120 python3 /tmp/hw_replay.py "$DB" "$B" "$S" "$REPLAY_STEPS" | tee -a "$OUT/replay.jsonl"
    echo "replay B=$B rc=$?"
done

# ---- train ------------------------------------------------------------------
train() {  # name B threads steps warm
    local name=$1 b=$2 t=$3 steps=$4 warm=$5
    local need=$((RUN_TIMEOUT / 2))
    if [ "$(left)" -lt "$need" ]; then echo "skip $name: $(left) s left"; return; fi
    local tl=$(left); [ "$tl" -gt "$RUN_TIMEOUT" ] && tl=$RUN_TIMEOUT
    local extra=()
    [ "$t" != default ] && extra=(--set "sampler.num_threads=$t")
    phase "train $name B=$b threads=$t steps=$steps warm=$warm (limit ${tl}s)"
    timeout "$tl" $HW train --db "$DB" --steps "$steps" --profile --wandb-mode disabled \
        --prometheus-port 0 --dir "$RUNS" --run-name "$name" \
        --set "sampler.default_batch_size=$b" --set "sampler.default_sequence_length=$S" \
        --set train.val_every=0 --set train.val_batches=0 --set "train.warmup_steps=$warm" \
        --set train.log_every=20 "${extra[@]}"
    echo "train $name rc=$?"
}
for t in $TRAIN_THREADS; do
    train "b${B0}-t${t}" "$B0" "$t" "$STEPS" "$WARM"
done
for b in $BIG_BS; do
    train "b${b}-t${BIG_THREADS}" "$b" "$BIG_THREADS" "$BIG_STEPS" "$BIG_WARM"
done
for t in $LATE_THREADS; do
    train "b${B0}-t${t}" "$B0" "$t" "$STEPS" "$WARM"
done

# ---- summary ------------------------------------------------------------------
phase summary
[ -n "$SMI_PID" ] && kill "$SMI_PID"
python3 - "$RUNS" "$OUT/results.json" <<'EOF'
import json, statistics, sys
from pathlib import Path
runs, out = Path(sys.argv[1]), {}
for d in sorted(runs.iterdir()):
    r = {"dir": d.name}
    f = d / "rank-0.json"
    if f.is_file():
        s = json.loads(f.read_text())
        r.update({k: s[k] for k in ("steps", "steady_steps", "wall_seconds", "step_seconds_median",
                                    "batches_per_second", "data_wait_share", "phase_seconds_mean",
                                    "phase_share", "loss_start", "loss_end", "warnings")})
        r["sampler"], r["model"] = s["config"]["sampler"], s["config"]["model"]
        r["warmup_steps"] = s["config"]["train"]["warmup_steps"]
    rows = []
    m = d / "metrics.jsonl"
    if m.is_file():
        for line in m.read_text().splitlines():
            row = json.loads(line)
            if "trainer/step_seconds" in row:
                rows.append((row["trainer/step_seconds"], row["trainer/data_wait_share"]))
    if rows:
        warm = r.get("warmup_steps", 3)
        st = [x for x, _ in rows[warm:]] or [x for x, _ in rows]
        wt = [x * w for x, w in rows[warm:]] or [x * w for x, w in rows]
        med = statistics.median(st)
        keep = [(x, w) for x, w in zip(st, wt) if x <= 3 * med]
        r["per_step"] = {"steps_logged": len(rows), "first_step_s": rows[0][0],
                         "median_ms": 1e3 * med,
                         "p90_ms": 1e3 * sorted(st)[int(0.9 * (len(st) - 1))],
                         "max_ms": 1e3 * max(st), "spikes_over_3x_median": len(st) - len(keep),
                         "steps_per_s_excl_spikes": len(keep) / sum(x for x, _ in keep),
                         "wait_share_excl_spikes": sum(w for _, w in keep) / sum(x for x, _ in keep)}
    out[d.name] = r
Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
for k, r in out.items():
    p = r.get("per_step", {})
    print(f"{k:16} bps={r.get('batches_per_second', float('nan')):8.2f} "
          f"med={1e3 * r.get('step_seconds_median', float('nan')):8.2f}ms "
          f"wait={100 * r.get('data_wait_share', float('nan')):6.2f}% "
          f"spikes={p.get('spikes_over_3x_median')} bps_xs={p.get('steps_per_s_excl_spikes', 0):8.2f} "
          f"wait_xs={100 * p.get('wait_share_excl_spikes', 0):6.2f}%")
EOF
tar -C "$RUNS" -czf "$OUT/runs.tar.gz" . || true
phase done
