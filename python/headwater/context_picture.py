"""One in-context sequence of a real batch, drawn as an SVG: the pictures
of docs/task-kinds.md (``docs/img/forecast-context.svg``,
``docs/img/link-context.svg``).

The forecast batch is the sampler's own: the default database (TPC-H SF
0.01, hash embedder), RT-J's recipe, the SQL task
``customer_repeat_order_90d`` alone, the first training batch; the link
batch the same on the generated shop's ``user-item-purchase``
(:mod:`headwater.data.shop`). One sequence's rows are read back from its
tensors in sequence order and grouped as the sampler lays them out: the
seed's row (its target masked) with its own BFS, then each example (an
earlier item, its label a visible cell before its row) with its shell.
Every box is a row of the sequence, its width its cells.

``python -m headwater.context_picture [FORECAST.svg [LINK.svg]]`` writes the
pictures (to the docs' copies by default, run from the repository's root);
the tests (``test_readme``, ``test_links``) draw them again from fresh
batches and compare them with the committed ones.
Never: a row, a label or a grouping the batch's tensors do not hold.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from headwater import _native

#: The picture's batch: task, shape and the keys besides the recipe's (a
#: local size of 64 cells leaves room for several examples in S = 256).
TASK = "customer_repeat_order_90d"
PICTURE_CONFIG: dict[str, Any] = {
    "recipe": "rt-j",
    "default_batch_size": 4,
    "default_sequence_length": 256,
    "local_context_sizes": [64],
    "num_threads": 1,
    "seed": 0,
}
#: The committed picture, from the repository's root.
DOCS_SVG = Path("docs/img/forecast-context.svg")


@dataclass
class Row:
    """One row of the sequence: its table, cells and role."""

    table: str
    cells: int
    seed: bool = False  # the seed's row (its target masked)
    label: str | None = None  # an example's visible label


@dataclass
class Group:
    """The seed or one example, with the rows of its BFS shell."""

    title: str
    rows: list[Row] = field(default_factory=list)


def sequence_rows(
    batch: dict[str, np.ndarray], meta: dict[str, Any], q: int, task_name: str = TASK
) -> list[Row]:
    """The rows of sequence ``q`` in sequence order, read from its tensors."""
    columns = meta["columns"]
    tables = [t["name"] for t in meta["tables"]]
    task = next(t for t in meta["tasks"] if t["name"] == task_name)
    real = np.flatnonzero(batch["is_padding"][q] == 0)
    rows: list[Row] = []
    last = -1
    for p in real:
        r = int(batch["seq_row_ids"][q, p])
        col = columns[int(batch["column_ids"][q, p])]
        if r != last:
            rows.append(Row(table=tables[col["table"]], cells=0))
            last = r
        row = rows[-1]
        row.cells += 1
        if col["idx"] != task["target_column"]:
            continue
        if batch["is_target"][q, p]:
            row.seed = True
        elif not batch["is_null"][q, p]:
            row.label = "yes" if batch["bool_values"][q, p] else "no"
    return rows


def groups_of(rows: list[Row], what: str = "an order", earlier: str = "an earlier order") -> list[Group]:
    """The seed's group (its row and BFS), then one group per example (the
    row whose label is visible, then its shell's rows)."""
    if not rows or not rows[0].seed:
        raise ValueError("the sequence does not start with the seed's row")
    out = [Group(f"seed: {what}, its target masked, and its BFS (tier 0)")]
    for r in rows:
        if r.label is not None:
            out.append(Group(f"example {len(out)}: {earlier}, label {r.label}, and its shell"))
        out[-1].rows.append(r)
    return out


def draw_batch(
    db: Path | None = None, task: str = TASK
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The picture's batch of ``task`` and its database's metadata (``db``:
    a build of the default database; built or found in the cache when
    ``None``)."""
    if db is None:
        from headwater.data.default_db import default_database

        db = default_database(embedder="hash", progress=False)
    meta = json.loads(_native.Database(db).metadata_json())
    weights = {t["name"]: float(t["name"] == task) for t in meta["tasks"]}
    with _native.Sampler(db, task_weights=weights, **PICTURE_CONFIG) as s:
        batch = s.next_train_batch()
    return batch, meta


def pick_sequence(batch: dict[str, np.ndarray], meta: dict[str, Any], task: str = TASK) -> int:
    """The sequence to draw: the most examples among those showing both
    labels (else among all), the first on a tie."""

    def key(q: int) -> tuple[bool, int, int]:
        labels = [r.label for r in sequence_rows(batch, meta, q, task) if r.label is not None]
        return len(set(labels)) == 2, len(labels), -q

    return max(range(len(batch["is_padding"])), key=key)


_PALETTE = ["#cfe2f3", "#d9ead3", "#fff2cc", "#fce5cd", "#ead1dc", "#d0e0e3", "#e6e6e6", "#f4cccc"]
_WIDTH, _CELL, _H, _GAP = 960, 5, 26, 4


def render(groups: list[Group], title: str) -> str:
    """The SVG of ``groups``: one band per group, a box per row (width by
    cells), the seed's row outlined in red with its masked target (a red
    ``?``) before it, each example's visible label (black) before its row."""
    tables = sorted({r.table for g in groups for r in g.rows})
    colour = {t: _PALETTE[i % len(_PALETTE)] for i, t in enumerate(tables)}
    out: list[str] = []
    y = 40
    for g in groups:
        n = len(g.rows)
        out.append(f'<text x="10" y="{y}" class="h">{escape(g.title)} ({n} row{"s" * (n != 1)})</text>')
        x, y = 10, y + 8
        for r in g.rows:
            w = max(r.cells * _CELL, 22)
            mark = "?" if r.seed else r.label
            if x + w + 30 * bool(mark) > _WIDTH - 10:
                x, y = 10, y + _H + _GAP
            if mark:
                cls = "masked" if r.seed else "label"
                out.append(f'<rect x="{x}" y="{y}" width="26" height="{_H}" class="{cls}"/>')
                out.append(f'<text x="{x + 13}" y="{y + 17}" class="lt">{mark}</text>')
                x += 30
            cls = "seed" if r.seed else "row"
            out.append(
                f'<rect x="{x}" y="{y}" width="{w}" height="{_H}" fill="{colour[r.table]}" class="{cls}">'
                f"<title>{escape(r.table)}: {r.cells} cell{'s' * (r.cells != 1)}</title></rect>"
            )
            out.append(f'<text x="{x + w / 2:g}" y="{y + 17}" class="t">{escape(r.table[:4])}</text>')
            x += w + _GAP
        y += _H + 30
    legend = " ".join(f"{t[:4]} = {t}" for t in tables)
    out.append(f'<text x="10" y="{y}" class="n">{escape(legend)}; box width: cells of the row</text>')
    y += 16
    out.append(
        f'<text x="10" y="{y}" class="n">red ?: the seed\'s target, masked (the seed\'s row outlined '
        "in red); black: an example's label, visible</text>"
    )
    style = (
        "<style>.h{font:bold 13px sans-serif}.t,.lt{font:10px sans-serif;text-anchor:middle}"
        ".lt{fill:#fff;font-weight:bold}"
        ".n{font:11px sans-serif;fill:#444}.row{stroke:#666}.seed{stroke:#c00;stroke-width:3}"
        ".label{fill:#222}.masked{fill:#c00}</style>"
    )
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{y + 16}" '
        f'viewBox="0 0 {_WIDTH} {y + 16}">'
    )
    body = "\n".join([style, f'<text x="10" y="20" class="h">{escape(title)}</text>', *out])
    return f"{head}\n{body}\n</svg>\n"


def forecast_context_svg(db: Path | None = None) -> str:
    """The picture of one forecast context of a fresh batch (see the
    module doc; ``db`` as for :func:`draw_batch`)."""
    batch, meta = draw_batch(db)
    q = pick_sequence(batch, meta)
    groups = groups_of(sequence_rows(batch, meta, q))
    s = PICTURE_CONFIG["default_sequence_length"]
    title = f"{TASK}: sequence {q} of the first rt-j training batch (S = {s}), in sequence order"
    return render(groups, title)


#: The link picture's copy in the docs, from the repository's root.
LINK_SVG = Path("docs/img/link-context.svg")


def link_context_svg(db: Path | None = None) -> str:
    """The picture of one link (recommendation) context: the generated
    shop's ``user-item-purchase`` task (``db``: its build; generated and
    built with the hash embedder in a scratch folder when ``None``)."""
    import tempfile

    from headwater.data.shop import TASK as SHOP_TASK

    with tempfile.TemporaryDirectory() as tmp:
        if db is None:
            from headwater.data.shop import write_shop
            from headwater.preprocessing import preprocess

            folder = write_shop(Path(tmp) / "shop")
            db = preprocess(folder, Path(tmp) / "db", embedder="hash", progress=False)
        batch, meta = draw_batch(db, SHOP_TASK)
    q = pick_sequence(batch, meta, SHOP_TASK)
    rows = sequence_rows(batch, meta, q, SHOP_TASK)
    groups = groups_of(rows, "a (user, time, candidate item) pair", "an earlier pair")
    s = PICTURE_CONFIG["default_sequence_length"]
    title = f"{SHOP_TASK}: sequence {q} of the first rt-j training batch (S = {s}), in sequence order"
    return render(groups, title)


def main(argv: list[str] | None = None) -> int:
    """Write the pictures to ``argv[0]`` and ``argv[1]`` (default: the
    docs' copies of the forecast and the link context)."""
    args = sys.argv[1:] if argv is None else argv
    outs = [Path(a) for a in args] + [DOCS_SVG, LINK_SVG][len(args) :]
    for out, draw in zip(outs, (forecast_context_svg, link_context_svg), strict=False):
        if not out.parent.is_dir():
            raise SystemExit(f"{out.parent}/ does not exist: run from the repository's root, or give OUT.svg")
        out.write_text(draw(), encoding="utf-8")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
