"""Forecast tasks in context (docs/contexts.md, "Forecast tasks"): the
default database's five tasks (its two SQL tasks with their declared
`window`) all sample with ``examples=True``, each with examples and no label
leak; a RelBench folder's task takes its manifest's ``timedelta`` as its
window and samples in context; the schema's ``window`` key is parsed in its
documented forms and refused, naming the task, the key and the forms,
otherwise; a query task without one is refused with examples on, naming it
and ``window``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import headwater
from headwater.preprocessing.schema import parse_duration, parse_schema

DAY_US = 86_400_000_000
SMALL = {
    "examples": True,
    "local_context_sizes": [16, 32],
    "bfs_widths": [2, 4],
    "num_walks": 100,
    "walk_length": 6,
}


def _in_context(db: Path, task: str, names: list[str], **kw: Any) -> dict[str, float]:
    """Four in-context training batches of ``task`` alone: the drained metrics."""
    weights = {n: float(n == task) for n in names}
    with headwater.Sampler(
        db,
        default_batch_size=8,
        default_sequence_length=128,
        num_threads=1,
        task_weights=weights,
        **SMALL,
        **kw,
    ) as s:
        for _ in range(4):
            s.next_train_batch()
        return s.drain_step_metrics()


def test_the_default_databases_five_tasks_sample_in_context(tpch: Any) -> None:
    tasks = {t["name"]: t for t in tpch.built.meta["tasks"]}
    assert len(tasks) == 5
    windows = {n: t.get("window_us") for n, t in tasks.items()}
    assert windows == {
        "order_priority": None,
        "order_status": None,
        "part_retail_price": None,
        "order_num_lineitems": 121 * DAY_US,
        "customer_repeat_order_90d": 90 * DAY_US,
    }
    for name in tasks:
        d = _in_context(tpch.built.path, name, list(tasks))
        assert d["sampler/context/examples_per_sequence_p50"] > 0, name
        assert d["sampler/invariants/label_leaks"] == 0, name
        assert d["sampler/invariants/temporal_leaks"] == 0, name


def test_a_broken_filter_lights_label_leaks_on_a_forecast_task(tpch: Any) -> None:
    names = [t["name"] for t in tpch.built.meta["tasks"]]
    d = _in_context(tpch.built.path, "customer_repeat_order_90d", names, temporal_filter=False)
    assert d["sampler/invariants/label_leaks"] > 0


def test_the_window_of_order_num_lineitems_covers_every_ship_date(tpch: Any) -> None:
    """The declared 121 days: no lineitem ships later after its order."""
    import duckdb

    con = duckdb.connect(str(tpch.source), read_only=True)
    (days,) = con.execute(
        "SELECT max(l.l_shipdate - o.o_orderdate) FROM lineitem l "
        "JOIN orders o ON l.l_orderkey = o.o_orderkey"
    ).fetchone()
    con.close()
    assert 0 < days <= 121


def test_a_relbench_task_takes_its_timedelta_and_samples_in_context(
    tmp_path: Path, make_relbench: Any
) -> None:
    """The generated folder's train labels span 20 days (days 30-49), less
    than the 30-day ``timedelta``: no train seed has an earlier label whose
    window closed, so none gets an example (under ``t' < t`` most would).
    With train labels every 10 days over 200 days, they do."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq
    from conftest import BASE_TIME, N_USERS, RELBENCH_TASK

    src = make_relbench(tmp_path / "relbench")
    headwater.preprocess(src, tmp_path / "db", embedder="hash", progress=False)
    meta = json.loads(headwater.Database(tmp_path / "db").metadata_json())
    (task,) = [t for t in meta["tasks"] if t["name"] == RELBENCH_TASK]
    assert task["kind"] == "relbench" and task["window_us"] == 30 * DAY_US
    names = [t["name"] for t in meta["tasks"]]
    d = _in_context(tmp_path / "db", RELBENCH_TASK, names)
    assert d["sampler/context/examples_per_sequence_max"] == 0
    assert d["sampler/invariants/label_leaks"] == 0
    steps = [(u, k) for k in range(20) for u in range(1, N_USERS + 1)]
    pq.write_table(
        pa.table(
            {
                "timestamp": pa.array(
                    [BASE_TIME + dt.timedelta(days=10 * k) for _, k in steps], pa.timestamp("ns")
                ),
                "user_id": pa.array([u for u, _ in steps], pa.int64()),
                "churn": pa.array([int((u + k) % 3 == 0) for u, k in steps], pa.int64()),
            }
        ),
        src / "tasks" / RELBENCH_TASK / "train.parquet",
    )
    headwater.preprocess(src, tmp_path / "db2", embedder="hash", progress=False)
    d = _in_context(tmp_path / "db2", RELBENCH_TASK, names)
    assert d["sampler/context/examples_per_sequence_p50"] > 0
    assert d["sampler/invariants/label_leaks"] == 0


@pytest.mark.parametrize(
    ("text", "days"),
    [
        ("90d", 90),
        ("12h", 0.5),
        ("30min", 30 / 1440),
        ("2w", 14),
        ("P90D", 90),
        ("PT12H", 0.5),
        ("P1DT6H", 1.25),
        ("P2W", 14),
        ("30 days", 30),
        ("1 day", 1),
    ],
)
def test_a_window_reads_its_documented_forms(text: str, days: float) -> None:
    assert parse_duration(text, "w") == round(days * DAY_US)


def _sql_task(**extra: Any) -> dict[str, Any]:
    return {
        "tasks": [
            {
                "name": "t90",
                "anchor_table": "a",
                "target_stype": "boolean",
                "query": "SELECT 1",
                **extra,
            }
        ]
    }


@pytest.mark.parametrize("bad", ["90", "P1M", "1y", "0d", "5m", "P", "-3d", 90, ""])
def test_a_window_that_is_not_a_duration_is_a_schema_error(bad: Any) -> None:
    with pytest.raises(headwater.SchemaError) as ei:
        parse_schema(_sql_task(window=bad))
    msg = str(ei.value)
    assert "task `t90`.window" in msg and '"90d"' in msg and '"P90D"' in msg, msg


def test_a_window_on_a_cell_task_is_a_schema_error() -> None:
    doc = {
        "tasks": [
            {
                "name": "c",
                "anchor_table": "a",
                "target_stype": "boolean",
                "column": "x",
                "window": "90d",
            }
        ]
    }
    with pytest.raises(headwater.SchemaError, match=r"task `c`\.window: only a SQL task"):
        parse_schema(doc)
    assert parse_schema(_sql_task(window="90d")).tasks[0].window_us == 90 * DAY_US


def test_examples_on_a_query_task_without_a_window_name_it_and_the_key() -> None:
    golden = Path(__file__).resolve().parents[2] / "tests" / "data" / "golden_v1"
    with pytest.raises(headwater.ConfigError) as ei:
        headwater.Sampler(golden, examples=True, default_sequence_length=1024)
    msg = str(ei.value)
    assert ei.value.key == "examples" and "`event_amount_next`" in msg and "`window`" in msg
