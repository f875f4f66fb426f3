"""``headwater diag``: run diagnostic configs and judge their signals.

Owns: :func:`run_diag` (run a config with ``headwater train`` on its
``[diag] processes``, then evaluate every signal and, on request, plot the
panels) and :func:`main` (the command line: one config, several, or
``--all``; exit status 1 when any verdict fails).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from headwater.diag.spec import load_spec
from headwater.diag.verdict import (
    DiagResult,
    context,
    evaluate,
    format_matrix,
    format_table,
    read_rows,
)
from headwater.errors import ConfigError


def run_diag(
    path: str | Path,
    *,
    out_dir: str | Path = "runs/diag",
    db: str | None = None,
    plot_to: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    timeout_s: float | None = 1800,
) -> DiagResult:
    """Run the config (``headwater train`` with its ``[diag]`` processes),
    then evaluate every signal."""
    from headwater.train import launch, resolve_database, run_directory

    # A diagnostic run judges the sampler's signals: no final evaluation
    # passes (they would outlast the short run); `--set train.eval_final=true`
    # brings them back.
    ov = {
        "logging.dir": str(out_dir),
        "logging.jsonl": True,
        "train.eval_final": False,
        **(overrides or {}),
    }
    if db:
        ov["database.path"] = db
    spec, cfg = load_spec(path, **ov)
    name = Path(path).stem
    summaries = launch(path, num_processes=spec.processes, run_name=name, timeout_s=timeout_s, **ov)
    run_dir = run_directory(cfg, name)
    rows, _ = read_rows(run_dir)
    ctx = context(cfg, spec, resolve_database(cfg))
    verdicts = evaluate(spec, rows, ctx)
    if plot_to:
        from headwater.diag.plot import plot

        plot(Path(plot_to), spec, rows, verdicts, ctx)
    return DiagResult(spec, verdicts, run_dir, summaries)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="headwater diag",
        description="Run diagnostic configs (a [diag] section says which sampler-health "
        "signals each must light) and print the verdict table; exit 1 on a mismatch.",
    )
    ap.add_argument("configs", nargs="*", help="diagnostic configs (TOML with a [diag] section)")
    ap.add_argument("--all", action="store_true", help="run every config in --configs-dir")
    ap.add_argument(
        "--configs-dir",
        default="diag_configs",
        help="where --all finds configs (default: %(default)s)",
    )
    ap.add_argument("--plot", help="write a PNG of every signal over the steps (one config)")
    ap.add_argument("--db", help="database to run on (default: each config's)")
    ap.add_argument(
        "--dir", default="runs/diag", help="where runs are written (default: %(default)s)"
    )
    ap.add_argument(
        "--json", action="store_true", help="print the verdicts as JSON, one line per config"
    )
    ap.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override a config key of every run (value read as TOML)",
    )
    return ap


def _report(p: Path, r: DiagResult, as_json: bool, plot: str | None) -> None:
    if as_json:
        verdicts = [dataclasses.asdict(v) for v in r.verdicts]
        row = {"config": str(p), "ok": r.ok, "run_dir": str(r.run_dir), "verdicts": verdicts}
        print(json.dumps(row))
        return
    print(format_table(r.spec, r.verdicts), flush=True)
    if plot:
        print(f"panels: {plot}")


def main(argv: Sequence[str] | None = None) -> int:
    from headwater.train import parse_overrides

    ap = _parser()
    a = ap.parse_args(argv)
    overrides = parse_overrides(a.set)
    paths = [Path(p) for p in a.configs]
    if a.all:
        d = Path(a.configs_dir)
        if not d.is_dir():
            raise ConfigError(f"--configs-dir {d}: no such directory")
        paths += sorted(d.glob("*.toml"))
    if not paths:
        ap.error("give a config or --all")
    if a.plot and len(paths) != 1:
        ap.error("--plot needs exactly one config")
    results = []
    for p in paths:
        r = run_diag(p, out_dir=a.dir, db=a.db, plot_to=a.plot, overrides=overrides)
        results.append(r)
        _report(p, r, a.json, a.plot)
    if len(results) > 1 and not a.json:
        print(format_matrix(results))
    return 0 if all(r.ok for r in results) else 1
