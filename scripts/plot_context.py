"""Draw one in-context context, its tiers coloured, from a real batch.

Builds one sequence (B = 1) of ``examples = true`` on a database (default: the
embedded default database, TPC-H SF 0.01) with the task ``order_priority``,
reads each cell's tier from the sampler's own per-tier cell counts (the tiers
fill the sequence in order: the seed's BFS, then ranked examples with their
shells, then random ones), and draws the cells row by row: one line per row of
the context, one square per cell, coloured by tier; the seed's masked target
is ringed red, each example's visible label black. Writes
``docs/img/context.png`` (or ``--out``) and prints the tier counts as JSON.
Usage, from the repository root::

    python scripts/plot_context.py [--db DB] [--out PNG]

Needs matplotlib (a test dependency); ``tests/python/test_docs.py`` draws it
on a generated TPC-H database and checks the counts against the batch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "context.png"
S = 256
TIER_COLOURS = ("#4c72b0", "#55a868", "#dd8452")
TIER_NAMES = ("tier 0: the seed's BFS", "tier 1: ranked examples", "tier 2: random examples")
RECIPE: dict[str, Any] = {
    "examples": True,
    "default_batch_size": 1,
    "default_sequence_length": S,
    "local_context_sizes": [48],
    "bfs_widths": [4],
    "prefer_latest": [False],
    "num_walks": 60,
    "walk_length": 6,
    "num_threads": 1,
    "seed": 7,
}


def build(db: Path, task: str) -> tuple[dict[str, np.ndarray], list[int]]:
    """One batch of ``task`` and its tier cell counts."""
    import headwater

    meta = json.loads(headwater.Database(db).metadata_json())
    weights = {t["name"]: float(t["name"] == task) for t in meta["tasks"]}
    with headwater.Sampler(db, task_weights=weights, **RECIPE) as s:
        batch = s.next_train_batch()
        d = s.drain_step_metrics()
    tiers = [int(d[f"sampler/context/tier{t}_cells"]) for t in range(3)]
    return batch, tiers


def draw(batch: dict[str, np.ndarray], tiers: list[int], out: Path) -> None:
    rows = batch["seq_row_ids"].reshape(-1)
    cols = batch["column_ids"].reshape(-1)
    target = batch["is_target"].reshape(-1).astype(bool)
    pad = batch["is_padding"].reshape(-1).astype(bool)
    tier = np.repeat([0, 1, 2], tiers)
    label_col = cols[target][0]
    order: dict[int, int] = {}
    x_of: dict[int, int] = {}
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for i in np.flatnonzero(~pad):
        y = order.setdefault(int(rows[i]), len(order))
        x = x_of[y] = x_of.get(y, -1) + 1
        ax.add_patch(Rectangle((y, x), 0.8, 0.8, color=TIER_COLOURS[tier[i]]))
        if target[i] or (tier[i] > 0 and cols[i] == label_col):
            ring = "red" if target[i] else "black"
            ax.add_patch(Rectangle((y, x), 0.8, 0.8, fill=False, ec=ring, lw=1.4))
    ax.set_aspect("equal")
    ax.set_ylim(max(x_of.values()) + 1, -0.2)
    ax.set_xlim(-0.2, len(order))
    ax.set_ylabel("cell of the row")
    ax.set_xlabel("row of the context, in sequence order")
    ax.set_title(
        f"One in-context sequence (S = {S}): {tiers[0]} + {tiers[1]} + {tiers[2]} cells by tier, "
        f"{int(pad.sum())} padding",
        fontsize=10,
    )
    handles = [Patch(color=c, label=n) for c, n in zip(TIER_COLOURS, TIER_NAMES, strict=True)]
    handles += [
        Patch(fill=False, ec="red", label="the seed's target (masked)"),
        Patch(fill=False, ec="black", label="an example's label (visible)"),
    ]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--db", type=Path, help="database (default: the embedded default one)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--task", default="order_priority")
    a = p.parse_args(argv)
    if a.db is None:
        from headwater.data.default_db import default_database

        a.db = default_database(progress=False)
    batch, tiers = build(a.db, a.task)
    draw(batch, tiers, a.out)
    print(json.dumps({"out": str(a.out), "tier_cells": tiers,
                      "padding": int(batch["is_padding"].sum())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
