"""Locality for databases larger than memory: ``preprocess(row_order=
"locality")`` writes every table grouped under its parent (the same rows and
links, in another order; task seeds in row order) and the sampler's
``seed_windows`` reads each pool window after window (every epoch still a
permutation, resumable bit for bit). The speed it buys is measured by
``headwater bench --memory-limit`` (docs/sampling.md, "Memory"), not here."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TPCH_SCHEMA, Built, Tpch, open_built

import headwater
from headwater.errors import StateError
from headwater.preprocessing.plan import TablePlan
from headwater.preprocessing.row_order import cluster_parents
from headwater.preprocessing.sources import SourceTable


@pytest.fixture(scope="module")
def locality(tmp_path_factory: pytest.TempPathFactory, tpch: Tpch) -> Built:
    out = tmp_path_factory.mktemp("locality") / "db"
    headwater.preprocess(
        tpch.source, out, schema=TPCH_SCHEMA, embedder="hash", progress=False, row_order="locality"
    )
    return open_built(out)


def _parents(b: Built, child: str, parent: str) -> np.ndarray:
    """Each row of ``child``: its row in ``parent`` (-1: none), from the graph."""
    g = b.db.graph_arrays()
    c, p = b.table(child), b.table(parent)
    lo, po, pn = c["row_offset"], p["row_offset"], p["num_rows"]
    out = np.full(c["num_rows"], -1, np.int64)
    off, tgt = g["fwd_offsets"], g["fwd_targets"].astype(np.int64)
    for r in range(c["num_rows"]):
        for t in tgt[off[lo + r] : off[lo + r + 1]]:
            if po <= t < po + pn:
                out[r] = t - po
    return out


def _origin(b: Built) -> dict[str, Any]:
    """The metadata's record of the source (a JSON string)."""
    src = b.meta["source"]
    return dict(json.loads(src) if isinstance(src, str) else src)


def _texts(b: Built, table: str, column: str) -> list[Any]:
    values, valid = b.column(table, column)
    return [b.db.embedded_string("text", int(v)) if ok else None for v, ok in zip(values, valid, strict=True)]


def test_locality_keeps_every_row_and_link_and_groups_children_under_parents(
    tpch: Tpch, locality: Built
) -> None:
    plain = tpch.built
    assert "row_order" not in _origin(plain)
    assert _origin(locality)["row_order"].startswith("locality: ")
    assert "lineitem by l_orderkey -> orders" in _origin(locality)["row_order"]
    for t in plain.meta["tables"]:
        assert locality.table(t["name"])["num_rows"] == t["num_rows"]
        for name, cm in plain.columns_of(t["name"]).items():
            if cm["stype"] == "text":
                a, b = _texts(plain, t["name"], name), _texts(locality, t["name"], name)
                assert Counter(a) == Counter(b), f"{t['name']}.{name}"
            else:
                assert np.array_equal(
                    np.sort(plain.column(t["name"], name)[0], axis=0),
                    np.sort(locality.column(t["name"], name)[0], axis=0),
                ), f"{t['name']}.{name}"
    # The links: the same (line item, its order) pairs, by value.
    def pairs(b: Built) -> np.ndarray:
        parent = _parents(b, "lineitem", "orders")
        price = b.column("lineitem", "l_extendedprice")[0].astype(np.float64)
        total = b.column("orders", "o_totalprice")[0].astype(np.float64)[parent]
        p = np.stack([price, total], 1)
        return p[np.lexsort(p.T[::-1])]

    assert np.array_equal(pairs(plain), pairs(locality))
    # Grouped: each order's line items together, in order order; each
    # customer's orders together. The source's order is not grouped by customer.
    assert np.all(np.diff(_parents(locality, "lineitem", "orders")) >= 0)
    assert np.all(np.diff(_parents(locality, "orders", "customer")) >= 0)
    assert not np.all(np.diff(_parents(plain, "orders", "customer")) >= 0)
    for k, task in enumerate(locality.meta["tasks"]):
        rows = locality.db.task_arrays(k)["anchor_row"].astype(np.int64)
        assert np.all(np.diff(rows) >= 0), task["name"]


def test_the_tasks_hold_the_same_targets_in_either_order(tpch: Tpch, locality: Built) -> None:
    """Both orders train the same tasks on the same rows: the task tables
    hold the same observation times and targets. A numerical target is
    stored normalised by statistics of its training seeds, which the split
    rule picks by position in the task's list (now in row order), so it
    matches up to that affine map."""

    def standard(x: np.ndarray) -> np.ndarray:
        x = np.sort(x.astype(np.float64))
        return (x - x.mean()) / x.std()

    for k, task in enumerate(tpch.built.meta["tasks"]):
        a, b = tpch.built.db.task_arrays(k), locality.db.task_arrays(k)
        assert locality.meta["tasks"][k]["name"] == task["name"]
        assert np.array_equal(np.sort(a["obs_time"]), np.sort(b["obs_time"])), task["name"]
        if a["target"].dtype.kind == "f":
            assert np.allclose(standard(a["target"]), standard(b["target"]), atol=1e-4), task["name"]
        else:
            assert np.array_equal(np.sort(a["target"], axis=0), np.sort(b["target"], axis=0)), task["name"]


def _plan(name: str, fks: dict[str, str], pk: str | None = "id") -> TablePlan:
    return TablePlan(name, SourceTable(name, []), pk, None, fks, {})


def test_each_table_is_grouped_under_its_largest_parent_and_a_cycle_is_cut() -> None:
    plans = [
        _plan("line", {"order_id": "orders", "part_id": "part"}, pk=None),
        _plan("orders", {"cust_id": "customer"}),
        _plan("customer", {"nation_id": "nation", "self_id": "customer"}),
        _plan("nation", {}),
        _plan("part", {}),
        _plan("a", {"b_id": "b"}),
        _plan("b", {"a_id": "a"}),
        _plan("keyless", {}, pk=None),
        _plan("to_keyless", {"k": "keyless"}),
    ]
    counts = {"line": 600, "orders": 150, "customer": 15, "nation": 5, "part": 200, "a": 3, "b": 4,
              "keyless": 9, "to_keyless": 2}
    parent = cluster_parents(plans, counts)
    assert parent["line"] == ("part_id", "part")  # part has more rows than orders here
    assert parent["orders"] == ("cust_id", "customer")
    assert parent["customer"] == ("nation_id", "nation")  # never itself
    # a → b → a: the cycle loses its first table's choice by name.
    assert "a" not in parent and parent["b"] == ("a_id", "a")
    assert "to_keyless" not in parent  # a parent needs a primary key
    assert "nation" not in parent and "part" not in parent


def test_a_bad_row_order_is_refused_naming_it(tpch: Tpch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"row_order 'nearby': expected one of 'source', 'locality'"):
        headwater.preprocess(tpch.source, tmp_path / "x", schema=TPCH_SCHEMA, row_order="nearby")
    assert not (tmp_path / "x").exists()


def _only(b: Built, *tasks: str) -> dict[str, float]:
    """Task weights drawing just ``tasks`` (a key left out keeps weight 1)."""
    return {t["name"]: float(t["name"] in tasks) for t in b.meta["tasks"]}


def _seeds(sampler: Any, n: int) -> list[np.ndarray]:
    return [sampler.next_train_batch()["segment_seeds"][:, 0].astype(np.int64) for _ in range(n)]


def test_seed_windows_read_a_pool_a_stretch_at_a_time(locality: Built) -> None:
    n = locality.task("order_status")["num_seeds"]
    cfg = {"task_weights": _only(locality, "order_status"), "default_batch_size": 32,
           "default_sequence_length": 64, "num_threads": 1}
    with headwater.Sampler(locality.path, {**cfg, "seed_windows": 16}) as s:
        windowed = _seeds(s, 3)
    with headwater.Sampler(locality.path, cfg) as s:
        plain = _seeds(s, 3)
    # 96 draws lie in one window of 1/16 of the pool, or two when they cross
    # from one window to the next (the pool holds about 80 % of the task's
    # list): cut at the widest gap, each part spans well under 1/8 of the
    # list. Drawn from the whole pool, one part spans far more.
    def widest_part(seeds: list[np.ndarray]) -> int:
        s = np.sort(np.concatenate(seeds))
        cut = int(np.argmax(np.diff(s))) + 1
        return int(max(np.ptp(s[:cut]), np.ptp(s[cut:])))

    assert widest_part(windowed) < n / 8, (widest_part(windowed), n)
    assert widest_part(plain) > n / 4, (widest_part(plain), n)
    assert len(set(np.concatenate(windowed).tolist())) == 96  # no repeat within an epoch


def test_seed_windows_resume_bit_for_bit_and_are_part_of_the_stream(locality: Built) -> None:
    cfg = {"task_weights": _only(locality, "order_status", "order_priority"), "default_batch_size": 16,
           "default_sequence_length": 64, "num_threads": 1, "seed_windows": 8}
    with headwater.Sampler(locality.path, cfg) as a:
        _seeds(a, 4)
        state = a.state_dict()
        after = [a.next_train_batch() for _ in range(3)]
    assert json.loads(json.dumps(state))["config"]["seed_windows"] == 8
    with headwater.Sampler(locality.path, {**cfg, "num_threads": 2}) as b:
        b.load_state_dict(state)
        again = [b.next_train_batch() for _ in range(3)]
    for x, y in zip(after, again, strict=True):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    with headwater.Sampler(locality.path, {**cfg, "seed_windows": 1}) as c, pytest.raises(
        StateError, match="seed_windows = 8"
    ):
        c.load_state_dict(state)


def test_seed_windows_out_of_range_is_refused(locality: Built) -> None:
    with pytest.raises(ValueError, match="seed_windows"):
        headwater.Sampler(locality.path, {"seed_windows": 0})


def test_each_window_opened_is_counted_once_and_none_without_windows(locality: Built) -> None:
    cfg = {"task_weights": _only(locality, "order_status"), "default_batch_size": 32,
           "default_sequence_length": 32, "num_threads": 1}
    steps = 40  # 1,280 draws from a pool of about 12,000 seeds in 16 windows of ~750
    counts = {}
    for k in (16, 1):
        with headwater.Sampler(locality.path, {**cfg, "seed_windows": k}) as s:
            per_step = []
            for _ in range(steps):
                s.next_train_batch()
                per_step.append(s.drain_step_metrics()["sampler/pool/window_rotations"])
        counts[k] = per_step
    opened = sum(counts[16])
    # The first draw opens a window; 1,280 draws then cross one or two more
    # window starts (windows hold ~750 seeds; the short last one fewer).
    assert counts[16][0] >= 1
    assert 2 <= opened <= 4, counts[16]
    assert all(c in (0, 1) for c in counts[16][1:]), counts[16]
    assert counts[1] == [0.0] * steps
