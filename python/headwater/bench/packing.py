"""The model side of packing, measured: ``headwater bench --train-steps N``.

Owns: :func:`train_comparison`, which trains the default relational
transformer unpacked and with ``pack = true`` at each pack factor for the
same number of steps from the same seeds (every run the real ``headwater
train`` in a process of its own, the configurations alternating within each
seed so that load drift hits them alike), and :func:`format_train_comparison`.

What it reads back from each run (``metrics.jsonl`` and ``rank-0.json``):

* **Useful cells per second** the model trained on (non-padding cells of the
  batches it stepped on over the step time; the median of the logged
  windows after the first, which holds the compilation), and the median step
  time. At equal ``B`` and ``S`` a packed step costs the model about what an
  unpacked one does, so this ratio is what packing buys.
* **Quality at equal steps**: ``train.eval_every`` runs a capped evaluation
  pass over val (the first ``eval_max_seeds`` seeds of each task in the
  split's fixed order, always unpacked), so every configuration and every
  seed is scored on the same sequences at the same steps; each task's
  primary metric (RelBench's: MAE for numbers and times, AUROC for
  booleans, accuracy for categories) is kept per evaluation step, and the
  mean validation loss (per target, the loss the model trains on) at the end.
* **Verdict** per packed configuration: of every (seed, evaluation step,
  task), how many score at least as well as unpacked's.

Must never: compare runs scored on different evaluation seeds, or report a
run that failed (its error is raised with the run's stderr).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headwater.evaluation.scoring import HIGHER_IS_BETTER

#: Each target type's primary metric (RelBench's task metrics).
PRIMARY: dict[str, str] = {
    "numerical": "mae",
    "boolean": "auroc",
    "categorical": "accuracy",
    "timestamp": "mae",
}


def config_name(factor: int | None) -> str:
    """``unpacked``, or ``pack_factor=<f>`` (``auto`` for 0), as the sampler
    comparison of ``headwater bench`` names its rows."""
    if factor is None:
        return "unpacked"
    return f"pack_factor={factor or 'auto'}"


def _config_text(
    db: str, batch_size: int, seq_len: int, factor: int | None, steps: int, seed: int,
    evals: int, eval_seeds: int,
) -> str:
    pack = factor is not None
    return f"""
[database]
path = {json.dumps(db)}

[sampler]
default_batch_size = {batch_size}
default_sequence_length = {seq_len}
pack = {str(pack).lower()}
pack_factor = {factor or 0}
seed = {seed}
num_threads = 1

[train]
steps = {steps}
seed = {seed}
val_every = 0
val_batches = 8
eval_every = {max(1, steps // evals)}
eval_max_seeds = {eval_seeds}
eval_final = false
log_every = {_log_every(steps)}
checkpoint_every = 0

[logging]
wandb_mode = "disabled"
prometheus_port = 0
"""


def _log_every(steps: int) -> int:
    return max(1, steps // 20)


def _train(cfg: Path, runs: Path, name: str, overrides: Sequence[str]) -> Path:
    """One ``headwater train`` run; returns its run directory."""
    sets = [a for o in overrides for a in ("--set", o)]
    cmd = [
        sys.executable, "-m", "headwater.cli", "train", str(cfg), "--dir", str(runs),
        "--run-name", name, *sets,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(
            f"training run {name} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}"
        )
    return runs / name


def read_run(run: Path, stypes: dict[str, str], log_every: int) -> dict[str, Any]:
    """What one run measured: useful cells/s and step seconds (medians of
    the logged windows of ``log_every`` steps after the first, which holds
    the compilation), the final validation loss and each task's primary
    metric at every evaluation step."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    logged = [r for r in rows if "trainer/useful_cells_per_second" in r]
    steady = [r for r in logged if r["step"] >= log_every] or logged
    summary = json.loads((run / "rank-0.json").read_text())
    evals: dict[int, dict[str, float]] = {}
    for e in summary["eval_history"]:
        evals[int(e["step"])] = {
            task: float(e[f"eval/{e['split']}/{task}/{PRIMARY[stype]}"])
            for task, stype in stypes.items()
            if f"eval/{e['split']}/{task}/{PRIMARY[stype]}" in e
        }
    cfg = summary["config"]
    return {
        "conditions": {
            "steps": cfg["train"]["steps"],
            "batch_size": cfg["sampler"]["default_batch_size"],
            "sequence_length": cfg["sampler"]["default_sequence_length"],
            "eval_seeds_per_task": cfg["train"]["eval_max_seeds"],
            "model": f"d_model {cfg['model']['d_model']} x {cfg['model']['num_layers']} layers",
        },
        "useful_cells_per_s": statistics.median(
            r["trainer/useful_cells_per_second"] for r in steady
        ),
        "step_seconds": statistics.median(r["trainer/step_seconds"] for r in steady),
        "final_val_loss": float(summary["final_val_loss"]),
        "eval": evals,
    }


def _task_stypes(db: str) -> dict[str, str]:
    """Each task's target type, for the ones evaluation scores."""
    from headwater import _native

    meta = json.loads(_native.Database(db).metadata_json())
    return {t["name"]: t["target_stype"] for t in meta["tasks"] if t["target_stype"] in PRIMARY}


def train_comparison(
    db: str,
    batch_size: int,
    seq_len: int,
    factors: Sequence[int],
    steps: int,
    seeds: int = 1,
    evals: int = 2,
    eval_seeds: int = 64,
    overrides: Sequence[str] = (),
    workdir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Train unpacked and at each of ``factors`` (0: per task) for ``steps``
    steps with seeds ``0 .. seeds - 1`` (sampler and parameters), evaluating
    ``evals`` times on the first ``eval_seeds`` val seeds of each task;
    ``overrides`` are ``headwater train --set`` values (``model.d_model=128``).
    Runs go under ``workdir`` (default: a temporary directory, removed)."""
    if steps <= 0 or seeds <= 0 or evals <= 0 or eval_seeds <= 0:
        raise ValueError(
            f"train_steps, train_seeds, evals and eval_seeds must be > 0, got "
            f"{steps}, {seeds}, {evals}, {eval_seeds}"
        )
    if not Path(db).is_dir():
        raise ValueError(f"the training comparison takes one database directory, got {db}")
    stypes = _task_stypes(db)
    configs: list[int | None] = [None, *factors]
    per: dict[str, list[dict[str, Any]]] = {config_name(f): [] for f in configs}
    with tempfile.TemporaryDirectory(prefix="headwater-train-bench-") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)
        for seed in range(seeds):
            for f in configs:
                name = f"{config_name(f).replace('=', '-')}-seed{seed}"
                cfg = root / f"{name}.toml"
                cfg.parent.mkdir(parents=True, exist_ok=True)
                cfg.write_text(
                    _config_text(db, batch_size, seq_len, f, steps, seed, evals, eval_seeds),
                    encoding="utf-8",
                )
                run = _train(cfg, root / "runs", name, overrides)
                per[config_name(f)].append(read_run(run, stypes, _log_every(steps)))
    return summarize(per, stypes)


def _better_or_equal(metric: str, packed: float, unpacked: float) -> bool:
    return packed >= unpacked if HIGHER_IS_BETTER[metric] else packed <= unpacked


def summarize(per: dict[str, list[dict[str, Any]]], stypes: dict[str, str]) -> dict[str, Any]:
    """Means over seeds per configuration (and each seed's figures), ratios
    to unpacked, and the at-least-as-good count of each packed configuration
    over every (seed, evaluation step, task) that both scored with a defined
    metric (an AUROC over one class is NaN and not compared). The conditions
    are the unpacked runs' effective configuration (``--set`` values
    included)."""
    base = per["unpacked"]
    base_ucps = statistics.mean(r["useful_cells_per_s"] for r in base)
    out: dict[str, Any] = {
        "conditions": {**base[0]["conditions"], "seeds": len(base)},
        "primary_metric": {t: PRIMARY[s] for t, s in stypes.items()},
        "configs": {},
    }
    for name, runs in per.items():
        steps_seen = sorted(set.intersection(*(set(r["eval"]) for r in runs)))
        ucps = statistics.mean(r["useful_cells_per_s"] for r in runs)
        pairs = [
            (PRIMARY[stypes[task]], r["eval"][st][task], b["eval"][st][task])
            for r, b in zip(runs, base, strict=True)
            for st in set(r["eval"]) & set(b["eval"])
            for task in set(r["eval"][st]) & set(b["eval"][st])
        ]
        defined = [(m, x, y) for m, x, y in pairs if not (math.isnan(x) or math.isnan(y))]
        good = sum(_better_or_equal(m, x, y) for m, x, y in defined)
        out["configs"][name] = {
            "useful_cells_per_s": ucps,
            "useful_cells_ratio": ucps / base_ucps,
            "step_seconds": statistics.mean(r["step_seconds"] for r in runs),
            "final_val_loss": statistics.mean(r["final_val_loss"] for r in runs),
            "eval": {
                st: {
                    task: statistics.mean(r["eval"][st][task] for r in runs)
                    for task in stypes
                    if all(task in r["eval"][st] for r in runs)
                }
                for st in steps_seen
            },
            # Against unpacked: none for unpacked itself.
            "at_least_as_good": [good, len(defined)] if runs is not base else None,
            # Each seed's own figures, for the spread behind the means.
            "per_seed": [
                {k: r[k] for k in ("useful_cells_per_s", "step_seconds", "final_val_loss", "eval")}
                for r in runs
            ],
        }
    return out


def format_train_comparison(t: dict[str, Any]) -> list[str]:
    """The comparison as text lines for ``format_bench``."""
    c = t["conditions"]
    lines = [
        "",
        f"training: {c['model']}, {c['steps']} steps, B={c['batch_size']} "
        f"S={c['sequence_length']}, mean of {c['seeds']} seed(s); eval on the first "
        f"{c['eval_seeds_per_task']} val seeds of each task (unpacked, the same for every run)",
        f"{'training':<17} {'useful cells/s':>14} {'x':>6} {'step s':>8} {'val loss':>9} "
        f"{'eval >= unpacked':>17}",
    ]
    for name, x in t["configs"].items():
        counts = x["at_least_as_good"]
        verdict = "-" if counts is None else f"{counts[0]}/{counts[1]}"
        lines.append(
            f"{name:<17} {x['useful_cells_per_s']:>14.1f} {x['useful_cells_ratio']:>6.2f} "
            f"{x['step_seconds']:>8.3f} {x['final_val_loss']:>9.4f} {verdict:>17}"
        )
    names = list(t["configs"])
    # Evaluation steps are ints, or strings once the dict went through JSON.
    evals = {n: {int(k): v for k, v in x["eval"].items()} for n, x in t["configs"].items()}
    last = max(evals["unpacked"], default=None)
    if last is not None:
        lines.append(f"{'eval after step ' + str(last + 1):<26} " + " ".join(f"{n:>17}" for n in names))
        for task, metric in t["primary_metric"].items():
            vals = [evals[n].get(last, {}).get(task) for n in names]
            lines.append(
                f"{task[:17]:<17} {metric:>8} "
                + " ".join(f"{v:>17.4f}" if v is not None else f"{'-':>17}" for v in vals)
            )
    return lines
