"""``headwater eval RUN_DIR``: evaluate a saved run without training.

Opens the run's database with rank 0's sampler keys (one process), loads
the final parameters (:mod:`headwater.train.saved`), runs full passes over
the requested splits and prints the per-task table; the results are also
written to ``RUN_DIR/eval-<split>.json``.

Must never: train, or write anything but ``eval-<split>.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwater.train.scoring import format_table


def evaluate_run(
    run_dir: Path, splits: tuple[str, ...] = ("test",), max_seeds: int | None = None
) -> dict[str, Any]:
    """Per split, per task: ``{"stype", "count", "metrics", "baseline"}``."""
    from headwater.mixture import open_sampler
    from headwater.train.device import tables_to_device
    from headwater.train.evaluate import Evaluator
    from headwater.train.mesh import Mesh, Padder
    from headwater.train.saved import load_params, load_run

    run_dir = Path(run_dir)
    doc = load_run(run_dir)
    kw = dict(doc["sampler"])
    if "split_ratios" in kw:
        kw["split_ratios"] = tuple(kw["split_ratios"])
    kw["num_prefetch"] = 1
    out: dict[str, Any] = {}
    with open_sampler(doc["db"], rank=0, world_size=1, **kw) as sampler:
        col_np, cat_np = sampler.column_embeddings(), sampler.categorical_embeddings()
        params, model_cfg = load_params(run_dir, int(col_np.shape[1]))
        mesh = Mesh()
        tables = mesh.replicate(tables_to_device(col_np, cat_np))
        ev = Evaluator(sampler, mesh, Padder(mesh, model_cfg.max_categories), model_cfg, tables)
        params = mesh.replicate(params)
        for split in splits:
            out[split] = ev.evaluate(params, split, max_seeds)
            (run_dir / f"eval-{split}.json").write_text(
                json.dumps(out[split], indent=1), encoding="utf-8"
            )
    return out


def main(run_dir: str, split: str, max_seeds: int | None) -> int:
    splits = ("val", "test") if split == "both" else (split,)
    results = evaluate_run(Path(run_dir), splits, max_seeds)
    print(format_table(results), flush=True)
    return 0
