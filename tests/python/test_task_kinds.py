"""Task kinds (docs/task-kinds.md): the contexts per kind of each step's
batch (``sampler/task_kinds/<kind>``) on the default database's three cell
and two SQL tasks, on one rank and reduced over two, and the picture of one
forecast context read back from a real batch."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from headwater import _native
from headwater import context_picture as cp
from headwater.telemetry.schema import Schema

KINDS = ("cell", "sql", "relbench", "link", "other")


def _kinds_of(meta: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {k: [] for k in KINDS}
    for t in meta["tasks"]:
        out[t["kind"] if t["kind"] in out else "other"].append(t["name"])
    return out


def _check_step(d: dict[str, float], seeds: float, by_kind: dict[str, list[str]]) -> None:
    """The kinds of one drained (or reduced) step sum to its seeds and each
    is its tasks' seeds."""
    got = {k: d[f"sampler/task_kinds/{k}"] for k in KINDS}
    assert sum(got.values()) == seeds, got
    for k, names in by_kind.items():
        assert got[k] == sum(d[f"sampler/tasks/{n}"] for n in names), (k, got, d)


@pytest.mark.parametrize("mixing", ["step", "sequence"])
def test_contexts_per_kind_sum_to_the_seeds_and_split_as_the_picks(tpch: Any, mixing: str) -> None:
    path = tpch.built.path
    by_kind = _kinds_of(tpch.built.meta)
    assert (len(by_kind["cell"]), len(by_kind["sql"])) == (3, 2), by_kind
    b = 8
    totals = dict.fromkeys(KINDS, 0.0)
    both = 0
    with _native.Sampler(path, default_batch_size=b, default_sequence_length=64,
                         task_mixing=mixing, seed=1) as s:
        for _ in range(24):
            s.next_train_batch()
            d = s.drain_step_metrics()
            _check_step(d, b, by_kind)
            for k in KINDS:
                totals[k] += d[f"sampler/task_kinds/{k}"]
            both += d["sampler/task_kinds/cell"] > 0 and d["sampler/task_kinds/sql"] > 0
    assert totals["cell"] > 0 and totals["sql"] > 0, totals
    assert totals["relbench"] == totals["other"] == 0, totals
    # One task per step, or several tasks' sequences in one batch.
    assert (both > 0) == (mixing == "sequence"), both


def test_contexts_per_kind_are_summed_over_ranks(tpch: Any) -> None:
    path, by_kind = tpch.built.path, _kinds_of(tpch.built.meta)
    b, world = 6, 2
    with contextlib.ExitStack() as stack:
        samplers = [
            stack.enter_context(_native.Sampler(path, default_batch_size=b, default_sequence_length=64,
                                                task_mixing="sequence", rank=r, world_size=world, seed=2))
            for r in range(world)
        ]
        sch = Schema.of(samplers[0])
        for _ in range(6):
            drains = []
            for s in samplers:
                s.next_train_batch()
                drains.append(s.drain_step_metrics())
            red = sch.unpack(sch.reduce_matrix(np.stack([sch.pack_vector(d) for d in drains])))
            _check_step(red, b * world, by_kind)
            for k in KINDS:
                key = f"sampler/task_kinds/{k}"
                assert red[key] == sum(d[key] for d in drains)
                assert red[f"{key}_max"] == max(d[key] for d in drains)


def test_the_picture_reads_a_forecast_context_from_the_batch(tpch: Any) -> None:
    """The seed's row first with its target masked, then examples: each an
    earlier order led by its visible label; every box a row of the batch."""
    batch, meta = cp.draw_batch(tpch.built.path)
    q = cp.pick_sequence(batch, meta)
    rows = cp.sequence_rows(batch, meta, q)
    groups = cp.groups_of(rows)
    assert rows[0].seed and rows[0].table == "orders"
    assert sum(r.seed for r in rows) == 1
    assert len(groups) >= 3, [g.title for g in groups]
    for g in groups[1:]:
        assert g.rows[0].table == "orders" and g.rows[0].label in ("yes", "no")
        assert all(r.label is None for r in g.rows[1:])
    real = int((batch["is_padding"][q] == 0).sum())
    assert sum(r.cells for r in rows) == real
    svg = cp.render(groups, "t")
    # One box per row, and one mark per group: the seed's masked target, an
    # example's label.
    assert svg.count("<rect") == len(rows) + len(groups)
    assert svg.count('class="masked"') == 1
    # Boxes come from the tensors: another sequence draws another picture.
    other = next(i for i in range(len(batch["is_padding"])) if i != q)
    assert cp.sequence_rows(batch, meta, other) != rows


def test_a_sequence_must_start_with_its_seed() -> None:
    with pytest.raises(ValueError, match="seed"):
        cp.groups_of([cp.Row(table="orders", cells=4)])


def test_the_committed_picture_is_a_forecast_context() -> None:
    text = (Path(__file__).resolve().parents[2] / cp.DOCS_SVG).read_text(encoding="utf-8")
    assert text.startswith("<svg") and text.count('class="masked"') == 1
    assert "example 2: an earlier order" in text, "fewer than two examples drawn"
