"""Step telemetry (docs/telemetry.md): the drain API, the schema and the Prometheus exporter.

Every metric is driven on a constructed case where its value follows from the
data and the configuration, often exactly:

* ``shapes``: a DuckDB database built here with one table per shape: ``tiny``
  (10 rows, a pool that runs out every batch), ``flat`` (200 rows, no foreign
  keys: one-row sequences), ``hub`` → ``child`` → ``grand`` (4 hubs with 100
  children each, half of them later than the hub's observation time, and 3
  grandchildren per child: width caps, time filtering, truncation) and
  ``late_parent`` ← ``early_child`` (every parent is later than its children).
* ``small``: the six-task database of ``conftest.py`` (task mix, histograms).

Drains are per split and hold the last batch's snapshot plus counters and
histogram buckets since the previous drain. The Prometheus test runs each
exporter in its own subprocess (one exporter per process), scrapes it with a
real Prometheus server started here on a free loopback port, and checks that
``/api/v1/query`` returns what the drains returned; ``promtool check metrics``
lints the exposition.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    TASK_NAMES,
    SmallData,
    SmallDb,
    binary,
    build_db_from_sql,
    build_small_db,
    free_port,
    prom_query,
    running_prometheus,
    stop,
)

from headwater import _native
from headwater import telemetry as T

N: Any = _native
P = "sampler/"
MIX_WINDOW = 64  # batches behind mix/tv_distance (src/maker/)
INF = float("inf")

# ----------------------------------------------------------------------------
# Databases
# ----------------------------------------------------------------------------

SHAPES_TASKS = ["tiny_x", "flat_x", "hub_v", "early_v"]
TINY, FLAT, HUB, EARLY = range(4)
TINY_ROWS, FLAT_ROWS, HUBS, CHILDREN_PER_HUB = 10, 200, 4, 100
# Children of a hub are 0, 2, ..., 198 days after 2024-01-01; the hub (and so
# each hub_v seed) is observed at day 100: 51 children visible, 49 hidden.
HUB_VISIBLE, HUB_HIDDEN = 51, 49

SHAPES_SCHEMA = """
[tables.hub]
time_column = "t"
[tables.child]
time_column = "t"
[tables.grand]
time_column = "t"
[tables.late_parent]
time_column = "t"
[tables.early_child]
time_column = "t"

[[tasks]]
name = "tiny_x"
anchor_table = "tiny"
target_stype = "numerical"
column = "x"

[[tasks]]
name = "flat_x"
anchor_table = "flat"
target_stype = "numerical"
column = "x"

[[tasks]]
name = "hub_v"
anchor_table = "hub"
target_stype = "numerical"
column = "v"

[[tasks]]
name = "early_v"
anchor_table = "early_child"
target_stype = "numerical"
column = "v"
"""

T0 = "TIMESTAMP '2024-01-01'"
SHAPES_SQL = [
    "CREATE TABLE tiny (id BIGINT PRIMARY KEY, x DOUBLE, y DOUBLE)",
    f"INSERT INTO tiny SELECT i, i * 1.5, i * 0.5 FROM range({TINY_ROWS}) r(i)",
    "CREATE TABLE flat (id BIGINT PRIMARY KEY, x DOUBLE)",
    f"INSERT INTO flat SELECT i, i * 0.25 FROM range({FLAT_ROWS}) r(i)",
    "CREATE TABLE hub (id BIGINT PRIMARY KEY, t TIMESTAMP, v DOUBLE)",
    f"INSERT INTO hub SELECT i, {T0} + INTERVAL 100 DAY, i FROM range({HUBS}) r(i)",
    (
        "CREATE TABLE child (id BIGINT PRIMARY KEY, hub_id BIGINT REFERENCES hub(id), "
        "t TIMESTAMP, a DOUBLE, b DOUBLE)"
    ),
    (
        f"INSERT INTO child SELECT i, i % {HUBS}, {T0} + INTERVAL (2 * (i // {HUBS})) DAY, i, -i "
        f"FROM range({HUBS * CHILDREN_PER_HUB}) r(i)"
    ),
    (
        "CREATE TABLE grand (id BIGINT PRIMARY KEY, child_id BIGINT REFERENCES child(id), "
        "t TIMESTAMP, a DOUBLE)"
    ),
    f"INSERT INTO grand SELECT i, i % 400, {T0} + INTERVAL (i % 97) DAY, i FROM range(1200) r(i)",
    "CREATE TABLE late_parent (id BIGINT PRIMARY KEY, t TIMESTAMP, v DOUBLE)",
    f"INSERT INTO late_parent SELECT i, {T0} + INTERVAL 300 DAY, i FROM range(20) r(i)",
    (
        "CREATE TABLE early_child (id BIGINT PRIMARY KEY, p_id BIGINT REFERENCES late_parent(id), "
        "t TIMESTAMP, v DOUBLE)"
    ),
    f"INSERT INTO early_child SELECT i, i % 20, {T0} + INTERVAL (i) DAY, i FROM range(100) r(i)",
]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("telemetry_shapes")
    return build_db_from_sql(root, "shapes", SHAPES_SQL, SHAPES_SCHEMA, SHAPES_TASKS)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> SmallDb:
    return build_small_db(tmp_path_factory.mktemp("telemetry_small"), small_data)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

BASE_KW: dict[str, Any] = {"default_batch_size": 8, "default_sequence_length": 48}


def make(db: SmallDb | Path, closing: list[Any], **kw: Any) -> Any:
    path = db.path if isinstance(db, SmallDb) else db
    for k, v in BASE_KW.items():
        kw.setdefault(k, v)
    s = N.Sampler(path, **kw)
    closing.append(s)
    return s


def one_hot(k: int, n: int) -> list[float]:
    return [float(i == k) for i in range(n)]


def step_drains(s: Any, n: int, split: str = "train") -> list[dict[str, float]]:
    """Consume ``n`` batches of ``split``, draining after each."""
    out = []
    for _ in range(n):
        getattr(s, f"next_{split}_batch")()
        out.append(s.drain_step_metrics(split))
    return out


def v(d: dict[str, float], key: str) -> float:
    return d[P + key]


def picked(d: dict[str, float], names: list[str]) -> int:
    """The task of the single batch a per-step drain covers."""
    hits = [i for i, t in enumerate(names) if v(d, f"tasks/{t}") > 0]
    assert len(hits) == 1, hits
    return hits[0]


def schema_edges(schema: list[dict[str, Any]], key: str) -> list[float]:
    e = next(x for x in schema if x["key"] == P + key)["edges"]
    # serde_json writes the +inf edge as null.
    return [INF if x is None else float(x) for x in e]


def buckets(d: dict[str, float], key: str) -> list[float]:
    out = []
    i = 0
    while f"{P}{key}/bucket_{i:02}" in d:
        out.append(d[f"{P}{key}/bucket_{i:02}"])
        i += 1
    return out


def quantile(
    edges: list[float], counts: list[float], q: float, mx: float, rule: str = "upper_edge"
) -> float:
    """The documented rule (crates/telemetry/src/hist.rs): the bucket holding rank
    ceil(q * n) read at its upper edge (or, rule "midpoint", the midpoint of
    its lower and upper edges; lower 0 for the first), capped by the max."""
    total = sum(counts)
    rank = max(math.ceil(q * total), 1)
    acc = 0.0
    for i, (e, c) in enumerate(zip(edges, counts, strict=True)):
        acc += c
        if acc >= rank:
            if not math.isfinite(e):
                return mx
            if rule == "midpoint":
                e = ((edges[i - 1] if i else 0.0) + e) / 2.0
            return min(e, mx)
    return mx


def schema_rule(schema: list[dict[str, Any]], key: str) -> str:
    return next(e["quantile"] for e in schema if e["key"] == P + key)


def expected_keys(schema: list[dict[str, Any]]) -> list[str]:
    """Every drained key, in order, derived from the schema."""
    out = []
    for e in schema:
        if e["reduction"] == "HISTOGRAM":
            out += [f"{e['key']}/bucket_{i:02}" for i in range(len(e["edges"]))]
            out += [f"{e['key']}_p50", f"{e['key']}_p95", f"{e['key']}_max"]
        else:
            out.append(e["key"])
    return out


SNAPSHOT = [
    "pool/remaining_min",
    "pool/remaining_max",
    "pool/remaining_fraction_min",
    "pool/remaining_fraction_max",
    "pool/steps_since_pick_max",
    "pool/steps_to_exhaust_min",
    "mix/tv_distance",
]
COUNTERS = [
    "pool/exhaust_events",
    "pool/window_rotations",
    "hot_sets/rotations",
    "hot_sets/prefetched_bytes",
    "truncation/cells_dropped",
    "bfs/children_capped",
    "bfs/temporal_filtered",
    "invariants/duplicate_seeds",
    "invariants/temporal_leaks",
    "invariants/label_leaks",
    "batches",
    "resumes",
]
SEQ_HISTS = ["bfs/depth", "bfs/rows", "padding/fraction"]
STAGE_HISTS = [
    "stage/bfs_seconds",
    "stage/assemble_seconds",
    "stage/collate_seconds",
    "stage/total_seconds",
]


# ----------------------------------------------------------------------------
# Pools
# ----------------------------------------------------------------------------


def test_tiny_pool_exhausts_every_step_large_pool_never(shapes: Path, closing: list[Any]) -> None:
    b, n = 8, 15
    kw = {"default_batch_size": b, "split_ratios": (1.0, 0.0, 0.0), "num_prefetch": 1}
    tiny = step_drains(make(shapes, closing, task_weights=one_hot(TINY, 4), **kw), n)
    for i, d in enumerate(tiny):
        # Draw j (1-based) reshuffles when j = 10k + 1, k >= 1.
        want = sum(
            1 for j in range(b * i + 1, b * i + b + 1) if j > TINY_ROWS and j % TINY_ROWS == 1
        )
        assert v(d, "pool/exhaust_events") == want, (i, d)
        rem = TINY_ROWS - ((b * (i + 1) - 1) % TINY_ROWS + 1)
        assert v(d, "pool/remaining_min") == v(d, "pool/remaining_max") == rem, i
        assert v(d, "pool/remaining_fraction_min") == pytest.approx(rem / TINY_ROWS)
        assert v(d, "pool/steps_to_exhaust_min") == pytest.approx(rem / b)
        assert v(d, "invariants/duplicate_seeds") == 0
    events = [v(d, "pool/exhaust_events") for d in tiny]
    assert sum(e >= 1 for e in events) >= 0.7 * n, events  # 4 of every 5 batches
    assert sum(events) == (b * n - 1) // TINY_ROWS
    rems = [v(d, "pool/remaining_min") for d in tiny]
    assert any(x < y for x, y in itertools.pairwise(rems)) and any(
        x > y for x, y in itertools.pairwise(rems)
    )

    flat = step_drains(make(shapes, closing, task_weights=one_hot(FLAT, 4), **kw), n)
    assert [v(d, "pool/exhaust_events") for d in flat] == [0.0] * n
    for i, d in enumerate(flat):
        assert v(d, "pool/remaining_min") == FLAT_ROWS - b * (i + 1)
        assert v(d, "pool/remaining_fraction_max") == pytest.approx(1 - b * (i + 1) / FLAT_ROWS)


def _mix_reference(weights: list[float], picks: list[int]) -> tuple[list[float], list[float]]:
    """steps_since_pick_max and tv_distance after each batch, from the picks."""
    total_w = sum(w for w in weights if w > 0)
    last: dict[int, int] = {}
    since_max: list[float] = []
    tv: list[float] = []
    for step, k in enumerate(picks):
        last[k] = step
        since_max.append(
            float(
                max(
                    step - last[j] if j in last else step + 1
                    for j, w in enumerate(weights)
                    if w > 0
                )
            )
        )
        window = picks[max(0, step + 1 - MIX_WINDOW) : step + 1]
        n = len(window)
        tv.append(
            0.5 * sum(abs(window.count(j) / n - max(w, 0) / total_w) for j, w in enumerate(weights))
        )
    return since_max, tv


def _run_mix(
    db: SmallDb | Path, names: list[str], closing: list[Any], n: int, **kw: Any
) -> tuple[list[int], list[dict[str, float]]]:
    ds = step_drains(make(db, closing, default_batch_size=2, default_sequence_length=16, **kw), n)
    picks = [picked(d, names) for d in ds]
    since, tv = _mix_reference(kw["task_weights"], picks)
    assert [v(d, "pool/steps_since_pick_max") for d in ds] == since
    assert [v(d, "mix/tv_distance") for d in ds] == pytest.approx(tv, abs=1e-12)
    return picks, ds


def test_skewed_weights_push_steps_since_pick(small: SmallDb, closing: list[Any]) -> None:
    n, t = 100, len(TASK_NAMES)
    _, skewed = _run_mix(small, TASK_NAMES, closing, n, task_weights=[1.0, 1e-4] + [0.0] * (t - 2))
    since = [v(d, "pool/steps_since_pick_max") for d in skewed]
    # The rare task is (almost) never picked: the gauge grows by one per step.
    assert since[-1] >= 0.9 * n, since
    assert sum(b == a + 1 for a, b in itertools.pairwise(since)) >= 0.9 * (n - 1)
    _, uniform = _run_mix(small, TASK_NAMES, closing, n, task_weights=[1.0] * t)
    assert max(v(d, "pool/steps_since_pick_max") for d in uniform) <= 8 * t


def test_tv_distance_low_when_mix_achievable(small: SmallDb, closing: list[Any]) -> None:
    # Two equally weighted tasks: over a full window of 64 batches the count of
    # one task is Binomial(64, 1/2), so TV = |c/64 - 1/2| has sd 1/16 = 0.0625;
    # 0.2 is more than 3 sd.
    n, t = 100, len(TASK_NAMES)
    bound = 3.2 * math.sqrt(0.25 / MIX_WINDOW)
    _, ds = _run_mix(small, TASK_NAMES, closing, n, task_weights=[1.0, 1.0] + [0.0] * (t - 2))
    tv = [v(d, "mix/tv_distance") for d in ds[MIX_WINDOW:]]
    assert max(tv) < bound, tv


def test_tv_distance_high_when_a_weighted_task_has_no_seeds(
    shapes: Path, closing: list[Any]
) -> None:
    # A weighted task whose global pool in the split is empty is never picked
    # (on any rank: pools are global): find a split seed that leaves tiny's
    # 10 seeds out of val, then the val mix misses half the weight.
    weights = [1.0, 1.0, 0.0, 0.0]
    kw = {"split_ratios": (0.9, 0.1, 0.0), "task_weights": weights, "default_batch_size": 2}
    for split_seed in range(64):
        s = make(shapes, closing, split_seed=split_seed, default_sequence_length=16, **kw)
        sizes = [p["size"] for p in s.state_dict()["splits"]["val"]["pools"]]
        if sizes[TINY] == 0 and sizes[FLAT] > 0:
            break
        s.shutdown()
    else:
        pytest.fail("no split_seed in 0..63 leaves tiny_x without val seeds")
    ds = step_drains(s, 20, "val")
    picks = [picked(d, SHAPES_TASKS) for d in ds]
    assert set(picks) == {FLAT}
    since, tv = _mix_reference(weights, picks)
    assert [v(d, "pool/steps_since_pick_max") for d in ds] == since == [i + 1.0 for i in range(20)]
    assert [v(d, "mix/tv_distance") for d in ds] == pytest.approx(tv, abs=1e-12)
    assert all(x >= 0.4 for x in tv)


# ----------------------------------------------------------------------------
# BFS shapes, truncation, time filter
# ----------------------------------------------------------------------------


def _one_drain(s: Any, n: int) -> dict[str, float]:
    for _ in range(n):
        s.next_train_batch()
    return s.drain_step_metrics()


def test_shallow_graph_pads(shapes: Path, closing: list[Any]) -> None:
    b, n = 8, 4
    d = _one_drain(
        make(shapes, closing, task_weights=one_hot(FLAT, 4), default_sequence_length=256), n
    )
    assert v(d, "bfs/depth_max") == 0 and v(d, "bfs/rows_max") == 1
    assert v(d, "padding/fraction_p50") >= 0.99
    assert buckets(d, "padding/fraction")[-2] == b * n  # the (0.95, 1] bucket
    for k in ("truncation/cells_dropped", "bfs/children_capped", "bfs/temporal_filtered"):
        assert v(d, k) == 0, k


def test_deep_graph_truncates_and_caps(shapes: Path, closing: list[Any]) -> None:
    b, n = 8, 4
    seeds = b * n
    d = _one_drain(
        make(
            shapes,
            closing,
            task_weights=one_hot(HUB, 4),
            default_sequence_length=16,
            bfs_child_width=16,
        ),
        n,
    )
    assert v(d, "truncation/cells_dropped") > 0
    assert v(d, "padding/fraction_p95") <= 0.1
    # Hop 1 sees 51 visible children per hub and keeps 16; grandchildren
    # (3 per child, all before day 97) are neither capped nor hidden.
    assert v(d, "bfs/children_capped") == seeds * (HUB_VISIBLE - 16)
    assert v(d, "bfs/temporal_filtered") == seeds * HUB_HIDDEN
    assert v(d, "invariants/temporal_leaks") == 0
    wide = _one_drain(
        make(
            shapes,
            closing,
            task_weights=one_hot(HUB, 4),
            default_sequence_length=16,
            bfs_child_width=64,
        ),
        n,
    )
    assert v(wide, "bfs/children_capped") == 0
    assert v(wide, "bfs/temporal_filtered") == seeds * HUB_HIDDEN


def test_temporal_filter_and_leak_invariant(shapes: Path, closing: list[Any]) -> None:
    kw = {"task_weights": one_hot(HUB, 4), "default_sequence_length": 128}
    on = _one_drain(make(shapes, closing, **kw), 4)
    off = _one_drain(make(shapes, closing, temporal_filter=False, **kw), 4)
    assert v(on, "bfs/temporal_filtered") > 0 and v(on, "invariants/temporal_leaks") == 0
    assert v(off, "bfs/temporal_filtered") == 0 and v(off, "invariants/temporal_leaks") > 0


def test_future_parent_is_filtered_not_leaked(shapes: Path, closing: list[Any]) -> None:
    # early_child seeds (days 0..99) reference a late_parent (day 300): a
    # parent from the future. With the filter on it is kept out (counted as
    # filtered) and nothing leaks; with the filter off it comes in and the
    # leak invariant, reading row times independently, lights up.
    d = _one_drain(make(shapes, closing, task_weights=one_hot(EARLY, 4)), 2)
    assert v(d, "invariants/temporal_leaks") == 0
    assert v(d, "bfs/temporal_filtered") > 0
    off = _one_drain(
        make(shapes, closing, task_weights=one_hot(EARLY, 4), temporal_filter=False), 2
    )
    assert v(off, "invariants/temporal_leaks") > 0


# ----------------------------------------------------------------------------
# The prefetch queue
# ----------------------------------------------------------------------------


def test_slow_consumer_keeps_the_queue_full(small: SmallDb, closing: list[Any]) -> None:
    prefetch = 3
    s = make(
        small, closing, default_batch_size=4, default_sequence_length=32, num_prefetch=prefetch
    )
    deadline = time.monotonic() + 10
    while s.queue_depth("train") < prefetch:  # warm-up
        assert time.monotonic() < deadline, "the queue never filled"
        time.sleep(0.01)
    ds = []
    for _ in range(8):
        s.next_train_batch()
        ds.append(s.drain_step_metrics())
        time.sleep(0.05)  # the producer refills the slot in well under a millisecond
    assert [v(d, "queue/depth_min") for d in ds] == [prefetch] * len(ds)
    waits = [v(d, "queue/wait_seconds") for d in ds]
    assert max(waits) < 0.01 and sum(waits) < 0.02, waits


def test_fast_consumer_empties_the_queue_and_waits(small: SmallDb, closing: list[Any]) -> None:
    # ~20 ms per batch on one thread; the consumer asks again at once.
    s = make(
        small,
        closing,
        default_batch_size=1024,
        default_sequence_length=256,
        num_threads=1,
        num_prefetch=2,
        split_ratios=(1.0, 0.0, 0.0),
    )
    ds = step_drains(s, 8)
    depth = [v(d, "queue/depth_min") for d in ds]
    waits = [v(d, "queue/wait_seconds") for d in ds]
    assert depth[0] == 0 and sum(x == 0 for x in depth) >= 6, depth
    assert all(w > 0 for w in waits) and sum(waits) > 0.02, waits


# ----------------------------------------------------------------------------
# Drain semantics
# ----------------------------------------------------------------------------


def test_drain_empty_before_first_batch_and_after_drain(small: SmallDb, closing: list[Any]) -> None:
    s = make(small, closing)
    assert s.drain_step_metrics() == {} and s.drain_step_metrics("val") == {}
    assert s.drain_step_metrics("test") == {}  # test passes only
    keys = expected_keys(s.telemetry_schema())
    for _ in range(3):
        s.next_train_batch()
        d = s.drain_step_metrics()
        assert list(d) == keys  # every snapshot key, in schema order, each drain
        assert v(d, "batches") == 1
        assert s.drain_step_metrics() == {}
    with pytest.raises(ValueError, match="`split`"):
        s.drain_step_metrics("bogus")


def test_counters_are_deltas(small: SmallDb, closing: list[Any]) -> None:
    """Drain every step vs once: counters and sequence buckets sum exactly."""
    n = 12
    kw = {"seed": 5, "default_batch_size": 6, "num_threads": 1}
    per_step = step_drains(make(small, closing, **kw), n)
    s = make(small, closing, **kw)
    for _ in range(n):
        s.next_train_batch()
    once = s.drain_step_metrics()
    for key in COUNTERS + [f"tasks/{t}" for t in TASK_NAMES]:
        assert sum(v(d, key) for d in per_step) == v(once, key), key
    for h in SEQ_HISTS:
        summed = [sum(c) for c in zip(*(buckets(d, h) for d in per_step), strict=True)]
        assert summed == buckets(once, h), h
    for h in STAGE_HISTS:
        assert sum(buckets(once, h)) == n
    # The snapshot is the last batch's (same seeds, same batches).
    for key in SNAPSHOT:
        assert v(per_step[-1], key) == v(once, key), key
    assert v(once, "bfs/depth_max") == max(v(d, "bfs/depth_max") for d in per_step)
    assert v(once, "queue/wait_seconds") > 0


def test_batches_counts_delivered_not_queued(small: SmallDb, closing: list[Any]) -> None:
    s = make(small, closing, num_prefetch=3)
    deadline = time.monotonic() + 10
    while s.queue_depth("train") < 3:
        assert time.monotonic() < deadline, "the queue never filled"
        time.sleep(0.01)
    assert s.drain_step_metrics() == {}  # produced and queued, none delivered
    s.next_train_batch()
    s.next_train_batch()
    d = s.drain_step_metrics()
    assert v(d, "batches") == 2
    assert sum(v(d, f"tasks/{t}") for t in TASK_NAMES) == 2 * BASE_KW["default_batch_size"]
    assert v(d, "queue/depth_min") >= 2  # the first call saw a full queue
    assert s.drain_step_metrics() == {}


def test_train_and_val_drain_separately(small: SmallDb, closing: list[Any]) -> None:
    s = make(small, closing)
    for _ in range(2):
        s.next_train_batch()
    for _ in range(3):
        s.next_val_batch()
    train = s.drain_step_metrics("train")
    assert v(train, "batches") == 2
    assert s.drain_step_metrics("train") == {}
    val = s.drain_step_metrics("val")
    assert v(val, "batches") == 3
    assert s.drain_step_metrics("val") == {}
    b = BASE_KW["default_batch_size"]
    assert sum(buckets(val, "bfs/depth")) == 3 * b and sum(buckets(train, "bfs/depth")) == 2 * b


def test_telemetry_off_drains_nothing(small: SmallDb, closing: list[Any]) -> None:
    s = make(small, closing, telemetry=False)
    for _ in range(3):
        s.next_train_batch()
        s.next_val_batch()
    assert s.drain_step_metrics() == {} and s.drain_step_metrics("val") == {}


# ----------------------------------------------------------------------------
# Histograms
# ----------------------------------------------------------------------------


def _check_hist(d: dict[str, float], schema: list[dict[str, Any]], key: str, total: int) -> None:
    edges = schema_edges(schema, key)
    counts = buckets(d, key)
    assert len(counts) == len(edges) and sum(counts) == total, (key, counts)
    p50, p95, mx = v(d, f"{key}_p50"), v(d, f"{key}_p95"), v(d, f"{key}_max")
    assert p50 <= p95 <= mx, key
    rule = schema_rule(schema, key)
    assert rule == ("midpoint" if key.startswith("stage/") else "upper_edge"), (key, rule)
    if rule == "upper_edge":
        assert p50 in edges or p50 == mx, (key, p50)
    assert p50 == quantile(edges, counts, 0.5, mx, rule), key
    assert p95 == quantile(edges, counts, 0.95, mx, rule), key
    # The max lies in the last non-empty bucket.
    last = max(i for i, c in enumerate(counts) if c)
    assert mx <= edges[last] and (last == 0 or mx > edges[last - 1]), (key, mx, counts)


def test_histograms_sum_and_quantiles(small: SmallDb, closing: list[Any]) -> None:
    b, n, hops, seq = 8, 6, 3, 48
    s = make(small, closing, default_batch_size=b, max_hops=hops, default_sequence_length=seq)
    schema = s.telemetry_schema()
    ds = step_drains(s, n - 1)
    s.next_train_batch()
    s.next_train_batch()
    ds.append(s.drain_step_metrics())  # one drain over two batches
    for i, d in enumerate(ds):
        nb = 1 if i < n - 1 else 2
        for h in SEQ_HISTS:
            _check_hist(d, schema, h, b * nb)
        for h in STAGE_HISTS:
            _check_hist(d, schema, h, nb)
        assert v(d, "bfs/depth_max") <= hops and v(d, "bfs/rows_max") <= seq
        assert 0 <= v(d, "padding/fraction_max") <= 1


# ----------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------

# the telemetry table (docs/reference/metrics.md), plus the keys the implementation adds (named like their kind).
SPEC_REDUCTIONS = {
    "pool/remaining_min": "MIN",
    "pool/remaining_max": "MAX",
    "pool/remaining_fraction_min": "MIN",
    "pool/remaining_fraction_max": "MAX",
    "pool/steps_since_pick_max": "MAX",
    "pool/exhaust_events": "SUM",
    "pool/window_rotations": "SUM",
    "hot_sets/rotations": "SUM",
    "hot_sets/prefetched_bytes": "SUM",
    "bfs/depth": "HISTOGRAM",
    "bfs/rows": "HISTOGRAM",
    "padding/fraction": "HISTOGRAM",
    "truncation/cells_dropped": "SUM",
    "bfs/children_capped": "SUM",
    "bfs/temporal_filtered": "SUM",
    "queue/depth_min": "MIN",
    "queue/wait_seconds": "SUM",
    "stage/bfs_seconds": "HISTOGRAM",
    "stage/collate_seconds": "HISTOGRAM",
    "stage/total_seconds": "HISTOGRAM",
    "invariants/duplicate_seeds": "SUM",
    "invariants/temporal_leaks": "SUM",
    "invariants/label_leaks": "SUM",
}
EXTRA_REDUCTIONS = {
    "pool/steps_to_exhaust_min": "MIN",
    "mix/tv_distance": "MAX",
    "stage/assemble_seconds": "HISTOGRAM",
    "batches": "SUM",
    "resumes": "SUM",
    "startup_seconds": "MAX",
    "packing/segments_per_sequence": "HISTOGRAM",
    "packing/contexts_cut": "SUM",
    "mix/database_tv_distance": "MAX",
    "databases/steps_since_pick_max": "MAX",
    "databases/steps_since_pick_worst": "MAX",
    "databases/remaining_fraction_min": "MIN",
    "databases/remaining_fraction_worst": "MAX",
    "databases/dropped": "MAX",
    "databases/other_seeds": "SUM",
    "io/major_faults": "SUM",
    "io/read_bytes": "SUM",
    "io/read_amplification": "MAX",
    "io/working_set_resident": "MIN",
    "io/blocked_seconds": "SUM",
    "cpu/build_seconds": "SUM",
    "cpu/busy_seconds": "SUM",
    "cpu/runqueue_seconds": "SUM",
    "stalls": "SUM",
    "stall_dump_failures": "SUM",
    "first_batch_seconds": "MAX",
    "integrity/blocks_verified": "MAX",
    "integrity/unverified_reads": "MAX",
    "context/tier0_cells": "SUM",
    "context/tier1_cells": "SUM",
    "context/tier2_cells": "SUM",
    "context/examples_per_sequence": "HISTOGRAM",
    "batch/seq_len": "HISTOGRAM",
    "context/walk_steps": "SUM",
    "context/deadline_hits": "SUM",
    "context/store_misses": "SUM",
    "context/no_examples": "SUM",
    "link/positive_examples": "SUM",
    "link/candidate_recall": "MIN",
    "context/tasks_per_batch": "MAX",
    "context/masked_cells": "HISTOGRAM",
}


def test_schema_identical_across_ranks_and_seeds(shapes: Path, closing: list[Any]) -> None:
    kw: dict[str, Any] = {
        "default_batch_size": 1,
        "split_ratios": (1.0, 0.0, 0.0),
        "num_prefetch": 1,
        "task_weights": one_hot(TINY, 4),
    }
    schemas, pool_sizes = [], set()
    for rank in range(4):
        s = make(shapes, closing, rank=rank, world_size=4, **kw)
        schemas.append(s.telemetry_schema())
        s.next_train_batch()
        pool_sizes.add(v(s.drain_step_metrics(), "pool/remaining_max") + 1)
        s.shutdown()
    # Global pools: after one step of 4 ranks × 1 seed, 6 of tiny's 10 seeds
    # are left on every rank.
    assert pool_sizes == {7.0}
    for seed in (1, 99):
        schemas.append(make(shapes, closing, seed=seed, world_size=4, **kw).telemetry_schema())
    # A rank whose slice of a step is past a small pool packs the same keys.
    schemas.append(
        make(
            shapes, closing, rank=12, world_size=16, **{**kw, "task_weights": [1.0, 1.0, 0, 0]}
        ).telemetry_schema()
    )
    assert all(x == schemas[0] for x in schemas[1:])


def test_schema_changes_with_hops_and_sequence_length(small: SmallDb, closing: list[Any]) -> None:
    base = make(small, closing).telemetry_schema()
    hops = make(small, closing, max_hops=5).telemetry_schema()
    seq = make(small, closing, default_sequence_length=200).telemetry_schema()
    def diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> set[str]:
        return {x["key"] for x, y in zip(a, b, strict=True) if x != y}
    assert [x["key"] for x in hops] == [x["key"] for x in base]
    assert diff(base, hops) == {P + "bfs/depth"}
    # The histograms bucket up to S (a sequence holds at most S rows,
    # segments, example rows or masked cells; a step's S is at most the longest).
    assert diff(base, seq) == {
        P + "batch/seq_len",
        P + "bfs/rows",
        P + "packing/segments_per_sequence",
        P + "context/examples_per_sequence",
        P + "context/masked_cells",
    }
    assert schema_edges(hops, "bfs/depth") == [0, 1, 2, 3, 4, 5, INF]
    assert schema_edges(base, "bfs/rows") == [1, 2, 4, 8, 16, 32, 48, INF]
    assert schema_edges(seq, "bfs/rows") == [1, 2, 4, 8, 16, 32, 64, 128, 200, INF]


def test_schema_keys_and_reductions(small: SmallDb, closing: list[Any]) -> None:
    s = make(small, closing)
    schema = s.telemetry_schema()
    got = {x["key"]: x["reduction"] for x in schema}
    want = {P + k: r for k, r in {**SPEC_REDUCTIONS, **EXTRA_REDUCTIONS}.items()}
    want.update({f"{P}tasks/{t}": "SUM" for t in TASK_NAMES})
    want.update({f"{P}task_kinds/{k}": "SUM" for k in TASK_KINDS})
    assert got == want
    assert len(got) == len(schema)
    for x in schema:
        assert x["help"], x["key"]
        if x["reduction"] == "HISTOGRAM":
            e = schema_edges(schema, x["key"][len(P) :])
            assert e[-1] == INF and all(a < b for a, b in itertools.pairwise(e)), x
        else:
            assert x["edges"] is None, x
    # Every drained key derives from a schema key.
    s.next_train_batch()
    d = s.drain_step_metrics()
    assert list(d) == expected_keys(schema)


# ----------------------------------------------------------------------------
# Prometheus
# ----------------------------------------------------------------------------

# Prometheus name → drain key (crates/telemetry/src/export/prometheus.rs).
PROM_GAUGES = {
    "headwater_pool_remaining_min_seeds": "pool/remaining_min",
    "headwater_pool_remaining_max_seeds": "pool/remaining_max",
    "headwater_pool_remaining_fraction_min_ratio": "pool/remaining_fraction_min",
    "headwater_pool_remaining_fraction_max_ratio": "pool/remaining_fraction_max",
    "headwater_pool_steps_since_pick_max_batches": "pool/steps_since_pick_max",
    "headwater_pool_steps_to_exhaust_min_batches": "pool/steps_to_exhaust_min",
    "headwater_mix_tv_distance_ratio": "mix/tv_distance",
    "headwater_queue_depth_batches": "queue/depth_min",  # the last call's depth
    "headwater_integrity_blocks_verified_blocks": "integrity/blocks_verified",
    "headwater_integrity_unverified_reads_blocks": "integrity/unverified_reads",
    "headwater_sampler_startup_seconds": "startup_seconds",
    "headwater_sampler_first_batch_seconds": "first_batch_seconds",
    "headwater_mix_database_tv_distance_ratio": "mix/database_tv_distance",
    "headwater_mixture_steps_since_pick_max_batches": "databases/steps_since_pick_max",
    "headwater_mixture_steps_since_pick_worst_index": "databases/steps_since_pick_worst",
    "headwater_mixture_remaining_fraction_min_ratio": "databases/remaining_fraction_min",
    "headwater_mixture_remaining_fraction_worst_index": "databases/remaining_fraction_worst",
    "headwater_mixture_dropped_databases": "databases/dropped",
    "headwater_context_tasks_per_batch": "context/tasks_per_batch",
    "headwater_io_read_amplification_ratio": "io/read_amplification",
    "headwater_io_working_set_resident_ratio": "io/working_set_resident",
    "headwater_link_candidate_recall_ratio": "link/candidate_recall",
}
PROM_COUNTERS = {
    "headwater_pool_exhaust_events_total": "pool/exhaust_events",
    "headwater_pool_window_rotations_total": "pool/window_rotations",
    "headwater_hot_sets_rotations_total": "hot_sets/rotations",
    "headwater_hot_sets_prefetched_bytes_total": "hot_sets/prefetched_bytes",
    "headwater_truncation_cells_dropped_total": "truncation/cells_dropped",
    "headwater_bfs_children_capped_total": "bfs/children_capped",
    "headwater_bfs_temporal_filtered_total": "bfs/temporal_filtered",
    "headwater_invariant_duplicate_seeds_total": "invariants/duplicate_seeds",
    "headwater_invariant_temporal_leaks_total": "invariants/temporal_leaks",
    "headwater_invariant_label_leaks_total": "invariants/label_leaks",
    "headwater_batches_delivered_total": "batches",
    "headwater_sampler_resumes_total": "resumes",
    "headwater_packing_contexts_cut_total": "packing/contexts_cut",
    "headwater_mixture_other_seeds_drawn_total": "databases/other_seeds",
    "headwater_io_major_faults_total": "io/major_faults",
    "headwater_io_read_bytes_total": "io/read_bytes",
    "headwater_sampler_stalls_total": "stalls",
    "headwater_sampler_stall_dump_failures_total": "stall_dump_failures",
    "headwater_context_tier0_cells_total": "context/tier0_cells",
    "headwater_context_tier1_cells_total": "context/tier1_cells",
    "headwater_context_tier2_cells_total": "context/tier2_cells",
    "headwater_context_walk_steps_total": "context/walk_steps",
    "headwater_context_deadline_hits_total": "context/deadline_hits",
    "headwater_context_store_misses_total": "context/store_misses",
    "headwater_context_no_examples_total": "context/no_examples",
    "headwater_link_positive_examples_total": "link/positive_examples",
}
PROM_TASKS = "headwater_task_seeds_drawn_total"
PROM_KINDS = "headwater_task_kind_contexts_total"  # labelled `kind`, one per task kind
PROM_HISTS = {
    "headwater_bfs_depth_hops": "bfs/depth",
    "headwater_batch_sequence_length_cells": "batch/seq_len",
    "headwater_bfs_sequence_rows": "bfs/rows",
    "headwater_padding_fraction_ratio": "padding/fraction",
    "headwater_stage_bfs_seconds": "stage/bfs_seconds",
    "headwater_stage_assemble_seconds": "stage/assemble_seconds",
    "headwater_stage_collate_seconds": "stage/collate_seconds",
    "headwater_stage_total_seconds": "stage/total_seconds",
    "headwater_packing_segments_per_sequence": "packing/segments_per_sequence",
    "headwater_context_examples_per_sequence": "context/examples_per_sequence",
    "headwater_context_masked_cells": "context/masked_cells",
}
PROM_WAIT = "headwater_queue_wait_seconds"  # histogram; the drain keeps its sum
#: Seconds per batch exported as latency histograms (the drain keeps their sums).
PROM_SECONDS = {
    "headwater_io_blocked_seconds": "io/blocked_seconds",
    "headwater_cpu_build_seconds": "cpu/build_seconds",
    "headwater_cpu_busy_seconds": "cpu/busy_seconds",
    "headwater_cpu_runqueue_seconds": "cpu/runqueue_seconds",
}

EXPORTER_CHILD = """
import json, os, sys, time, urllib.request
from headwater import _native as N

cfg = json.loads(sys.argv[1])
s = N.Sampler(cfg["db"], **cfg["kw"])
url = "http://127.0.0.1:%d/metrics" % cfg["kw"]["prometheus_port"]
for attempt in range(50):
    try:
        before = urllib.request.urlopen(url, timeout=10).read().decode()
        break
    except OSError:
        if attempt == 49:
            raise
        time.sleep(0.1)
out = {"before": before}
for split, n in (("train", cfg["n_train"]), ("val", cfg["n_val"])):
    out[split] = []
    for _ in range(n):
        getattr(s, "next_%s_batch" % split)()
        out[split].append(s.drain_step_metrics(split))
# Evaluation passes after the streams: recorded under their split only.
out["passes"] = {}
for split in ("val", "test"):
    p = s.eval_batches(split, max_seeds=cfg["eval_seeds"])
    out["passes"][split] = {"batches": len(p), "tasks": p.tasks()}
    for _ in p:
        out.setdefault(split, []).append(s.drain_step_metrics(split))
with open(cfg["out"] + ".tmp", "w") as f:
    json.dump(out, f)
os.replace(cfg["out"] + ".tmp", cfg["out"])
sys.stdin.read()  # serve /metrics until the test closes stdin
s.shutdown()
"""


def parse_exposition(
    text: str,
) -> tuple[list[tuple[str, dict[str, str], float]], dict[str, str], dict[str, str]]:
    """(series, HELP by family, TYPE by family) of a text exposition."""
    series, helps, types = [], {}, {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            name, _, h = line[7:].partition(" ")
            helps[name] = h
        elif line.startswith("# TYPE "):
            name, _, t = line[7:].partition(" ")
            types[name] = t
        elif not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            name, _, rest = head.partition("{")
            labels = {}
            for part in rest.rstrip("}").split(","):
                if part:
                    k, _, val = part.partition("=")
                    labels[k] = val.strip('"')
            series.append((name, labels, float(value)))
    return series, helps, types


def family(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in {*PROM_HISTS, PROM_WAIT, *PROM_SECONDS}:
            return name[: -len(suffix)]
    return name


def kind_keys(schema: list[dict[str, Any]]) -> list[str]:
    """The schema's per-kind keys (without the prefix): ``task_kinds/<kind>``."""
    keys = [str(e["key"]).removeprefix("sampler/") for e in schema]
    return [k for k in keys if k.startswith("task_kinds/")]


def expected_series(schema: list[dict[str, Any]], tasks: int) -> tuple[int, int, int]:
    """(a, b, a*T + b): series per process from the schema, per the documented metric names."""
    per_hist = [
        len(schema_edges(schema, k)) + 2 for k in PROM_HISTS.values()
    ]  # buckets + sum + count
    per_hist.append(len(schema_edges(schema, "stage/total_seconds")) + 2)  # queue wait
    per_hist += [len(schema_edges(schema, "stage/total_seconds")) + 2 for _ in PROM_SECONDS]
    a = 3  # one task counter per split with telemetry (train, val, test)
    kinds = len(kind_keys(schema))  # one counter per task kind, whatever the tasks
    b = 3 * (len(PROM_GAUGES) + len(PROM_COUNTERS) + kinds + sum(per_hist))
    return a, b, a * tasks + b


def _check_sums(
    check: Callable[[tuple[str, str, str, str], float], None],
    split: str,
    ds: list[dict[str, float]],
) -> None:
    """Check the ``_count`` and ``_sum`` of each histogram whose drain keeps its sum."""
    for name, key in {PROM_WAIT: "queue/wait_seconds", **PROM_SECONDS}.items():
        check((name + "_count", split, "", ""), len(ds))
        check((name + "_sum", split, "", ""), sum(v(d, key) for d in ds))


def compare_with_prometheus(
    got: dict[tuple[str, str, str, str], float],
    drains: dict[str, list[dict[str, float]]],
    task_names: list[str],
    schema: list[dict[str, Any]],
) -> list[str]:
    """Mismatches between Prometheus' values (by name, split, task, le) and the drains."""
    bad = []

    def check(key: tuple[str, str, str, str], want: float) -> None:
        have = got.get(key)
        if have is None or not math.isclose(have, want, rel_tol=1e-9, abs_tol=1e-12):
            bad.append(f"{key}: prometheus {have}, drains {want}")

    for split, ds in drains.items():
        for name, key in PROM_COUNTERS.items():
            check((name, split, "", ""), sum(v(d, key) for d in ds))
        labelled = [(PROM_TASKS, t, f"tasks/{t}") for t in task_names]
        labelled += [(PROM_KINDS, k.split("/")[1], k) for k in kind_keys(schema)]
        for name, label, key in labelled:
            check((name, split, label, ""), sum(v(d, key) for d in ds))
        if ds:
            for name, key in PROM_GAUGES.items():
                check((name, split, "", ""), v(ds[-1], key))
        for name, key in PROM_HISTS.items():
            edges = schema_edges(schema, key)
            per = [sum(c) for c in zip(*(buckets(d, key) for d in ds), strict=True)] or [0.0] * len(edges)
            acc = 0.0
            for e, c in zip(edges, per, strict=True):
                acc += c
                check((name + "_bucket", split, "", "+Inf" if e == INF else repr(e)), acc)
            check((name + "_count", split, "", ""), acc)
        _check_sums(check, split, ds)
    return bad


def _le_key(le: str) -> str:
    return "+Inf" if le == "+Inf" else repr(float(le))


@dataclass
class Exported:
    """One exporter process: its configuration, drains, exposition and what Prometheus holds."""

    db: str
    tasks: list[str]
    rank: int
    n_train: int
    n_val: int
    port: int = 0
    schema: list[dict[str, Any]] = field(default_factory=list)
    drains: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    before: str = ""  # /metrics before the first batch
    text: str = ""  # /metrics after the last batch
    queried: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    fault: bool = False  # debug_repeat_seed_every: duplicate_seeds must fire
    #: Per split, the exporter's evaluation pass: ``{"batches", "tasks"}``.
    passes: dict[str, dict[str, Any]] = field(default_factory=dict)


def _start_exporter(tmp_path: Path, i: int, e: Exported) -> subprocess.Popen[bytes]:
    kw = {
        **PROM_COMMON,
        "rank": e.rank,
        "world_size": 2,
        "local_rank": 0,  # the exporter listens on prometheus_port + local_rank
        "prometheus_port": e.port,
        **({"debug_repeat_seed_every": FAULT_EVERY} if e.fault else {}),
    }
    out = tmp_path / f"exporter{i}.json"
    cfg = {
        "db": e.db,
        "kw": kw,
        "n_train": e.n_train,
        "n_val": e.n_val,
        "eval_seeds": EVAL_SEEDS,
        "out": str(out),
    }
    with open(tmp_path / f"exporter{i}.err", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-c", EXPORTER_CHILD, json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


PROM_COMMON = {"default_batch_size": 8, "default_sequence_length": 48, "max_hops": 3}
EVAL_SEEDS = 10  # seeds per task of each exporter's val and test passes
FAULT_EVERY = 5  # every 5th draw of a pool repeats a seed


def _collect_exporter_runs(
    tmp_path: Path, runs: list[Exported], procs: list[subprocess.Popen[bytes]]
) -> None:
    """Wait for each exporter's drains (failing fast if one exits)."""
    deadline = time.monotonic() + 30
    for i, (e, proc) in enumerate(zip(runs, procs, strict=True)):
        out = tmp_path / f"exporter{i}.json"
        while not out.exists():
            if proc.poll() is not None:
                err = (tmp_path / f"exporter{i}.err").read_text()
                pytest.fail(f"exporter {i} exited: {err}")
            assert time.monotonic() < deadline, "an exporter never finished its batches"
            time.sleep(0.05)
        res = json.loads(out.read_text())
        e.before, e.passes = res["before"], res["passes"]
        e.drains = {split: res.get(split, []) for split in ("train", "val", "test")}


def _wait_for_a_scrape_after(base: str, t_done: float, targets: int) -> None:
    """Wait for a scrape of every target that began after `t_done`."""
    deadline = time.monotonic() + 20
    while True:
        ups = prom_query(base, 'timestamp(up{job="headwater"})')
        if len(ups) == targets and all(float(u["value"][1]) > t_done for u in ups):
            return
        assert time.monotonic() < deadline, f"no scrape after the last batch: {ups}"
        time.sleep(0.2)


def _index_query_result(e: Exported, result: list[dict[str, Any]]) -> None:
    """What Prometheus holds for exporter `e`, by (name, split, task, le)."""
    for x in result:
        m = x["metric"]
        if m["instance"] != f"127.0.0.1:{e.port}":
            continue
        assert m["rank"] == str(e.rank), m
        le = _le_key(m["le"]) if "le" in m else ""
        label = m.get("task", m.get("kind", ""))
        e.queried[(m["__name__"], m["split"], label, le)] = float(x["value"][1])
    assert e.queried, f"Prometheus holds no series of rank {e.rank}"


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, small: SmallDb, shapes: Path
) -> list[Exported]:
    """Two exporters (different task counts, ranks and numbers of batches)
    scraped by a real Prometheus; everything is collected before they stop."""
    binary("promtool")
    tmp_path = tmp_path_factory.mktemp("prometheus")
    runs = [
        Exported(str(small.path), TASK_NAMES, rank=0, n_train=9, n_val=4),
        Exported(str(shapes), SHAPES_TASKS, rank=1, n_train=3, n_val=0, fault=True),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, e in enumerate(runs):
            e.port = free_port()
            procs.append(_start_exporter(tmp_path, i, e))
            # The schema of the same configuration, for the bucket edges.
            fault = {"debug_repeat_seed_every": FAULT_EVERY} if e.fault else {}
            plain = N.Sampler(e.db, rank=e.rank, world_size=2, **PROM_COMMON, **fault)
            e.schema = plain.telemetry_schema()
            plain.shutdown()
        with running_prometheus(tmp_path, [f"127.0.0.1:{e.port}" for e in runs]) as base:
            _collect_exporter_runs(tmp_path, runs, procs)
            _wait_for_a_scrape_after(base, time.time(), len(runs))
            up = prom_query(base, 'up{job="headwater"}')
            assert sorted(u["value"][1] for u in up) == ["1", "1"], up
            result = prom_query(base, '{__name__=~"headwater_.+", job="headwater"}')
            for e in runs:
                url = f"http://127.0.0.1:{e.port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as f:
                    e.text = f.read().decode()
    finally:
        for proc in procs:
            if proc.stdin:
                proc.stdin.close()
            stop(proc)
    for e in runs:
        _index_query_result(e, result)
    return runs


def test_prometheus_query_matches_drains(exported: list[Exported]) -> None:
    """Counters = sum of the drains, gauges = the last drain, histogram buckets
    (cumulative `le`) = summed drain buckets, queue wait sum = summed waits."""
    for e in exported:
        bad = compare_with_prometheus(e.queried, e.drains, e.tasks, e.schema)
        assert not bad, "\n".join(bad[:20])


def test_a_pass_is_counted_in_its_splits_series_only(exported: list[Exported]) -> None:
    """After the streams' batches, a val and a test pass: the real Prometheus
    holds exactly the pass's batches and seeds per task (the batch size per
    batch: padded sequences are in the batch) under its split, added to the
    val stream's; the train series count the train batches alone."""
    b = PROM_COMMON["default_batch_size"]
    batches = "headwater_batches_delivered_total"
    seeds = "headwater_task_seeds_drawn_total"
    for e in exported:
        passes = {k: e.passes[k]["batches"] for k in ("val", "test")}
        assert passes["test"] > 0 and passes["val"] > 0, e.passes
        assert e.queried[(batches, "train", "", "")] == e.n_train
        assert e.queried[(batches, "val", "", "")] == e.n_val + passes["val"]
        assert e.queried[(batches, "test", "", "")] == passes["test"]
        train_seeds = sum(v(d, f"tasks/{t}") for d in e.drains["train"] for t in e.tasks)
        assert sum(e.queried[(seeds, "train", t, "")] for t in e.tasks) == train_seeds
        for t in e.passes["test"]["tasks"]:
            assert e.queried[(seeds, "test", t["task"], "")] == t["batches"] * b, t
            # The capped list, halved between the two ranks, in batches of b.
            assert t["seeds"] <= EVAL_SEEDS
            assert t["batches"] == math.ceil(math.ceil(t["seeds"] / 2) / b), t
        # The pass's last batch ends its last task's share.
        assert e.queried[("headwater_pool_remaining_min_seeds", "test", "", "")] == 0


def test_duplicate_seeds_fault_fires_in_drain_and_prometheus(exported: list[Exported]) -> None:
    """The once-per-epoch invariant is proven to fire: with
    debug_repeat_seed_every, the drain counts duplicates every step, and the
    real Prometheus scraped the same total; without it, both stay 0."""
    name = "headwater_invariant_duplicate_seeds_total"
    for e in exported:
        drained = [v(d, "invariants/duplicate_seeds") for d in e.drains["train"]]
        scraped = e.queried[(name, "train", "", "")]
        if e.fault:
            # Every 5th draw of a pool repeats (except right after a reshuffle).
            assert sum(drained) >= 1, drained
            assert scraped == sum(drained) > 0
        else:
            assert sum(drained) == 0 and scraped == 0


#: The task kinds a per-kind row has a key for (docs/telemetry.md), in order.
TASK_KINDS = ("cell", "sql", "relbench", "link", "other")


def _expanded(row: dict[str, Any], tasks: list[str]) -> list[str]:
    """A table row's drained keys: one per task, one per task kind, or its own."""
    if row["per_task"]:
        return [row["key"].replace("{task}", t) for t in tasks]
    if row["per_kind"]:
        return [row["key"].replace("{kind}", k) for k in TASK_KINDS]
    return [row["key"]]


def test_metric_table_agrees_with_every_surface(exported: list[Exported]) -> None:
    """Reads the one metric table (`metric_table()`) and checks it against the
    drained keys, `telemetry_schema()`, the families a real exporter serves
    (names, TYPE, HELP) and the Python reducer's kinds. Adds nothing: every
    expectation comes from the table. `table_prometheus_names()` is the hook
    for the dashboard-query half of this check."""
    table = N.metric_table()
    for e in exported:
        sampler_schema = e.schema
        keys = [x["key"] for x in sampler_schema]
        want_keys = [
            P + key
            for row in table
            if not row["per_database"]  # a single database has no per-database series
            for key in _expanded(row, e.tasks)
        ]
        assert keys == want_keys
        by_key = {x["key"]: x for x in sampler_schema}
        for row in table:
            if row["per_database"]:
                continue
            for key in _expanded(row, e.tasks):
                ent = by_key[P + key]
                assert ent["reduction"] == row["reduction"], row
                assert ent["prometheus"] == row["prometheus"] and ent["help"] == row["help"]
                assert ent["quantile"] == (row["quantile"] if row["reduction"] == "HISTOGRAM" else None)
        assert N.telemetry_schema_for(e.tasks, PROM_COMMON["max_hops"], 48) == sampler_schema
        _, helps, types = parse_exposition(e.text)
        assert set(types) == {r["prometheus"] for r in table if not r["per_database"]}
        for row in table:
            if row["per_database"]:
                continue
            assert types[row["prometheus"]] == row["prometheus_type"], row
            assert helps[row["prometheus"]] == row["help"], row
        reducer = T.Schema(sampler_schema)
        drained = set(e.drains["train"][0])
        assert set(reducer.keys) == drained
        kind = {"MIN": "MIN", "MAX": "MAX", "SUM": "SUM"}
        for ent in sampler_schema:
            if ent["reduction"] in kind:
                assert reducer.reduced_kinds[ent["key"]] == kind[ent["reduction"]]
            else:
                assert reducer.reduced_kinds[ent["key"] + "_p50"] == "QUANTILE"


def table_prometheus_names() -> set[str]:
    """Every Prometheus family the metric table defines (for dashboard checks)."""
    return {row["prometheus"] for row in N.metric_table()}


def test_exposition_passes_promtool_and_naming_rules(exported: list[Exported]) -> None:
    promtool = binary("promtool")
    for e in exported:
        lint = subprocess.run(
            [promtool, "check", "metrics"],
            input=e.text,
            capture_output=True,
            text=True,
            check=False,
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
        series, helps, types = parse_exposition(e.text)
        for name, labels, _ in series:
            fam = family(name)
            assert name.startswith("headwater_"), name
            assert helps.get(fam), f"{fam} has no HELP text"
            if types[fam] == "counter":
                assert fam.endswith("_total"), fam
            allowed = {"rank", "split"} | ({"task"} if fam == PROM_TASKS else set())
            allowed |= {"kind"} if fam == PROM_KINDS else set()
            allowed |= {"le"} if name.endswith("_bucket") else set()
            assert set(labels) <= allowed and {"rank", "split"} <= set(labels), (name, labels)
            assert labels["rank"] == str(e.rank)


def test_series_grow_with_tasks_only(exported: list[Exported]) -> None:
    counts = []
    for e in exported:
        a, b, want = expected_series(e.schema, len(e.tasks))
        before = len(parse_exposition(e.before)[0])
        after = len(parse_exposition(e.text)[0])
        # Same count before the first batch and after n_train + n_val batches.
        assert (before, after) == (want, want), (e.db, before, after, a, b)
        counts.append((len(e.tasks), after))
    (t0, c0), (t1, c1) = counts
    assert t0 != t1
    a = (c0 - c1) // (t0 - t1)
    b = c0 - a * t0
    assert (a, b) == expected_series(exported[0].schema, 0)[:2]
    print(f"series per process = {a} * T + {b}")


def test_the_documented_series_counts_are_the_tables() -> None:
    """docs/telemetry.md's figures (gauges, counters and histograms of the
    metric table, the series and drained values per process at
    ``max_hops = 3``, ``S = 1024``) are the table's own: a new metric row
    that leaves them stale fails here."""
    from headwater.telemetry.schema import Schema

    table = _native.metric_table()
    rows = [r for r in table if not r["per_task"] and not r["per_database"] and not r["per_kind"]]
    kinds = collections.Counter(r["prometheus_type"] for r in rows)
    schema = _native.telemetry_schema_for([], 3, 1024)
    _, b, _ = expected_series(schema, 0)
    text = (Path(__file__).resolve().parents[2] / "docs" / "telemetry.md").read_text()
    m = re.search(
        r"(\d+) gauges \+ (\d+) counters \+ (\d+) task-kind counters \+ T task counters[^`]*`"
        r"\s+over the\s+(\d+) histograms",
        text,
    )
    assert m, "docs/telemetry.md no longer states the series formula"
    per_kind = sum(1 for r in table if r["per_kind"])
    want = (kinds["gauge"], kinds["counter"], per_kind * len(kind_keys(schema)), kinds["histogram"])
    assert tuple(map(int, m.groups())) == want, (m.groups(), want)
    stated = re.findall(r"3·(?:T|\(T_K \+ 4·K\)) \+ (\d+)", text)
    assert len(stated) >= 3 and set(map(int, stated)) == {b}, (stated, b)
    assert re.findall(r"`N` = (\d+) at", text) == [str(len(Schema(schema).keys))]


# ----------------------------------------------------------------------------
# Fingerprint and replay
# ----------------------------------------------------------------------------


def test_replay_reproduces_any_delivered_batch(small: SmallDb, closing: list[Any]) -> None:
    s = make(small, closing, default_batch_size=6, default_sequence_length=48)
    train = [s.next_train_batch() for _ in range(12)]
    val = [s.next_val_batch() for _ in range(3)]
    fps = [int(b["fingerprint"][0]) for b in train]
    assert len(set(fps)) == len(fps), "fingerprints must tell steps apart"
    for split, batches, steps in (("train", train, (0, 7, 11)), ("val", val, (2,))):
        for step in steps:
            r = s.replay_batch(step, split)
            assert list(r) == list(batches[step])
            for k in r:
                np.testing.assert_array_equal(r[k], batches[step][k], err_msg=f"{split} {step} {k}")
    # Another seed replays to another batch.
    other = make(small, closing, default_batch_size=6, default_sequence_length=48, seed=99)
    assert int(other.replay_batch(7)["fingerprint"][0]) != fps[7]
    with pytest.raises(ValueError, match="`step`"):
        s.replay_batch(-1)
