"""Tests for the TPC-H source database (`headwater.data.tpch`) and its schema file."""

from __future__ import annotations

import importlib.resources
import importlib.util
import math
import os
import pathlib
import re
import tomllib
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest

from headwater.data import tpch

SCHEMA_TEXT = (importlib.resources.files("headwater") / "data" / "tpch_schema.toml").read_text(
    encoding="utf-8"
)

# What DuckDB's dbgen produces at SF 0.01 (checked against duckdb 1.5.5).
SF001_ROW_COUNTS = {
    "region": 5,
    "nation": 25,
    "supplier": 100,
    "customer": 1500,
    "part": 2000,
    "partsupp": 8000,
    "orders": 15000,
    "lineitem": 60175,
}

STYPES = {"identifier", "numerical", "timestamp", "boolean", "categorical", "text", "ignored"}
TARGET_STYPES = {"numerical", "boolean", "timestamp", "categorical"}
TABLE_KEYS = {"primary_key", "time_column", "foreign_keys", "ignore", "columns"}
TASK_KEYS = {"name", "anchor_table", "target_stype", "description", "column", "query", "window"}


@pytest.fixture(scope="module")
def db_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tpch") / "tpch_sf001.duckdb"
    assert tpch.generate_tpch(path, 0.01) == path
    return path


@pytest.fixture(scope="module")
def con(db_path: pathlib.Path) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(str(db_path), read_only=True)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    parsed: dict[str, Any] = tomllib.loads(SCHEMA_TEXT)
    return parsed


def _db_columns(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, str]]:
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
    ).fetchall()
    out: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        out.setdefault(table, {})[column] = dtype
    return out


def _sql_tasks() -> list[dict[str, Any]]:
    return [t for t in tomllib.loads(SCHEMA_TEXT)["tasks"] if "query" in t]


# --------------------------------------------------------------- generation


def test_row_counts(con: duckdb.DuckDBPyConnection) -> None:
    tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    assert tables == set(tpch.TPCH_TABLES)
    counts = {
        t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
        for t in tpch.TPCH_TABLES
    }
    assert counts == SF001_ROW_COUNTS


def test_generation_is_deterministic(tmp_path: pathlib.Path) -> None:
    def digest(path: pathlib.Path) -> list[Any]:
        with duckdb.connect(str(path), read_only=True) as c:
            return [
                c.execute(f"SELECT count(*), sum(hash(t)) FROM {t} AS t").fetchone()
                for t in tpch.TPCH_TABLES
            ]

    a = tpch.generate_tpch(tmp_path / "a.duckdb", 0.001)
    b = tpch.generate_tpch(tmp_path / "b.duckdb", 0.001)
    assert digest(a) == digest(b)


def test_overwrites_existing_file(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "nested" / "db.duckdb"
    target.parent.mkdir()
    target.write_bytes(b"stale")
    tpch.generate_tpch(target, 0.001)
    with duckdb.connect(str(target), read_only=True) as c:
        assert c.execute("SELECT count(*) FROM region").fetchone() == (5,)
    assert sorted(p.name for p in target.parent.iterdir()) == ["db.duckdb"]


@pytest.mark.parametrize("bad", [0, 0.0, -1, -0.01, math.nan, math.inf, -math.inf])
def test_bad_scale_factor_raises_value_error(tmp_path: pathlib.Path, bad: float) -> None:
    target = tmp_path / "db.duckdb"
    with pytest.raises(ValueError, match=r"scale_factor.*> 0"):
        tpch.generate_tpch(target, bad)
    assert not target.exists()


@pytest.mark.parametrize("bad", [True, "1", None])
def test_non_numeric_scale_factor_raises_type_error(tmp_path: pathlib.Path, bad: Any) -> None:
    with pytest.raises(TypeError, match="scale_factor"):
        tpch.generate_tpch(tmp_path / "db.duckdb", bad)


def test_interrupted_generation_leaves_no_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_populate = tpch._populate

    def populate_then_interrupt(*args: Any) -> None:
        real_populate(*args)  # the temporary file now holds complete tables
        raise KeyboardInterrupt

    monkeypatch.setattr(tpch, "_populate", populate_then_interrupt)
    target = tmp_path / "db.duckdb"
    with pytest.raises(KeyboardInterrupt):
        tpch.generate_tpch(target, 0.001)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary or WAL file left either


def test_failed_rename_keeps_previous_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_replace(src: Any, dst: Any) -> None:
        raise OSError("simulated failure")

    target = tmp_path / "db.duckdb"
    target.write_bytes(b"previous")
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated failure"):
        tpch.generate_tpch(target, 0.001)
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["db.duckdb"]


def test_directory_target_rejected(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "db.duckdb"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        tpch.generate_tpch(target, 0.001)
    assert target.is_dir() and list(target.iterdir()) == []
    assert [p.name for p in tmp_path.iterdir()] == ["db.duckdb"]


def test_missing_extension_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="duckdb-extension-tpch"):
        tpch.tpch_extension_path()


def test_extension_for_other_duckdb_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(duckdb, "__version__", "0.0.0")
    with pytest.raises(RuntimeError, match=r"duckdb-extension-tpch==0\.0\.0"):
        tpch.tpch_extension_path()


def test_extension_found() -> None:
    path = tpch.tpch_extension_path()
    assert path.is_file() and path.name == "tpch.duckdb_extension"
    assert f"v{duckdb.__version__}" in path.parts


# ------------------------------------------------------------------- schema


def test_schema_structure(schema: dict[str, Any]) -> None:
    assert set(schema) == {"tables", "tasks"}
    assert set(schema["tables"]) == set(tpch.TPCH_TABLES)
    for name, table in schema["tables"].items():
        assert set(table) <= TABLE_KEYS, name
        assert set(table["columns"].values()) <= STYPES, name
    names = [task["name"] for task in schema["tasks"]]
    assert len(names) == len(set(names))
    for task in schema["tasks"]:
        assert set(task) <= TASK_KEYS, task["name"]
        assert re.fullmatch(r"[a-z][a-z0-9_]*", task["name"])
        assert task["target_stype"] in TARGET_STYPES
        assert task["description"].strip()
        assert ("column" in task) != ("query" in task), task["name"]


def test_schema_keys(schema: dict[str, Any]) -> None:
    tables = schema["tables"]
    assert {t: tables[t].get("primary_key") for t in tpch.TPCH_TABLES} == {
        "region": "r_regionkey",
        "nation": "n_nationkey",
        "supplier": "s_suppkey",
        "customer": "c_custkey",
        "part": "p_partkey",
        "partsupp": None,
        "orders": "o_orderkey",
        "lineitem": None,
    }
    foreign_keys = {
        (t, col, ref) for t in tables for col, ref in tables[t].get("foreign_keys", {}).items()
    }
    assert foreign_keys == {
        ("nation", "n_regionkey", "region"),
        ("supplier", "s_nationkey", "nation"),
        ("customer", "c_nationkey", "nation"),
        ("partsupp", "ps_partkey", "part"),
        ("partsupp", "ps_suppkey", "supplier"),
        ("orders", "o_custkey", "customer"),
        ("lineitem", "l_orderkey", "orders"),
        ("lineitem", "l_partkey", "part"),
        ("lineitem", "l_suppkey", "supplier"),
    }
    time_columns = {t: tables[t]["time_column"] for t in tables if "time_column" in tables[t]}
    assert time_columns == {"orders": "o_orderdate", "lineitem": "l_shipdate"}


def test_schema_matches_database(schema: dict[str, Any], con: duckdb.DuckDBPyConnection) -> None:
    db = _db_columns(con)
    for name, table in schema["tables"].items():
        assert name in db, name
        # Every column is declared (nothing left to inference) and exists.
        assert set(table["columns"]) == set(db[name]), name
        for key in ("primary_key", "time_column"):
            if key in table:
                assert table[key] in db[name], (name, key)
        if "time_column" in table:
            assert table["columns"][table["time_column"]] == "timestamp"
            assert db[name][table["time_column"]] in {"DATE", "TIMESTAMP"}
        for column, stype in table["columns"].items():
            if column.endswith("_comment"):
                assert stype == "ignored", (name, column)
        for column, ref in table.get("foreign_keys", {}).items():
            assert column in db[name], (name, column)
            pk = schema["tables"][ref]["primary_key"]
            dangling = con.execute(
                f"SELECT count(*) FROM {name} WHERE {column} NOT IN (SELECT {pk} FROM {ref})"
            ).fetchone()
            assert dangling == (0,), (name, column)
    for name, table in schema["tables"].items():
        if "primary_key" in table:
            pk = table["primary_key"]
            distinct, total = con.execute(  # type: ignore[misc]
                f"SELECT count(DISTINCT {pk}), count(*) FROM {name}"
            ).fetchone()
            assert distinct == total, name


def test_cell_tasks(schema: dict[str, Any], con: duckdb.DuckDBPyConnection) -> None:
    cell_tasks = [t for t in schema["tasks"] if "column" in t]
    assert {t["target_stype"] for t in cell_tasks} >= {"categorical", "numerical"}
    for task in cell_tasks:
        table = schema["tables"][task["anchor_table"]]
        assert "primary_key" in table, task["name"]
        assert table["columns"][task["column"]] == task["target_stype"], task["name"]
        nulls = con.execute(
            f"SELECT count(*) - count({task['column']}) FROM {task['anchor_table']}"
        ).fetchone()
        assert nulls == (0,), task["name"]


def test_task_kinds(schema: dict[str, Any]) -> None:
    sql_stypes = {t["target_stype"] for t in schema["tasks"] if "query" in t}
    assert "boolean" in sql_stypes
    assert any(t["name"] == "customer_repeat_order_90d" for t in schema["tasks"])


@pytest.mark.parametrize("task", _sql_tasks(), ids=lambda t: t["name"])
def test_sql_task(
    task: dict[str, Any], schema: dict[str, Any], con: duckdb.DuckDBPyConnection
) -> None:
    anchor = task["anchor_table"]
    pk = schema["tables"][anchor]["primary_key"]
    result = con.execute(task["query"])
    assert result.description is not None
    assert len(result.description) == 3
    obs_type = str(result.description[1][1])
    rows = result.fetchall()
    assert len(rows) >= 1
    assert obs_type in {"DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "NULL"}, obs_type

    stats = con.execute(
        f"""
        SELECT count(*) FILTER (WHERE k IS NULL),
               count(*) - count(DISTINCT k),
               count(*) FILTER (WHERE k NOT IN (SELECT {pk} FROM {anchor}))
        FROM ({task["query"]}) AS q(k, obs, y)
        """
    ).fetchone()
    # No null anchors, one seed per anchor row, every anchor an existing key.
    assert stats == (0, 0, 0)

    targets = [r[2] for r in rows]
    assert all(t is not None for t in targets)
    if task["target_stype"] == "boolean":
        assert set(targets) == {True, False}
        rate = sum(targets) / len(targets)
        print(f"{task['name']}: {len(rows)} seeds, positive rate {rate:.3f}")
        assert 0.05 < rate < 0.95
    elif task["target_stype"] == "numerical":
        values = [float(t) for t in targets]
        assert all(math.isfinite(v) for v in values)
        mean = sum(values) / len(values)
        print(
            f"{task['name']}: {len(rows)} seeds, mean {mean:.3f}, "
            f"min {min(values)}, max {max(values)}"
        )
        assert min(values) < max(values)


def test_repeat_order_task_observable(
    schema: dict[str, Any], con: duckdb.DuckDBPyConnection
) -> None:
    """The last 90 days of order dates are excluded, so every label is observable."""
    (task,) = [t for t in schema["tasks"] if t["name"] == "customer_repeat_order_90d"]
    last_seed, last_order = con.execute(
        f"SELECT (SELECT max(obs) FROM ({task['query']}) AS q(k, obs, y)), "
        "(SELECT max(o_orderdate) FROM orders)"
    ).fetchone()  # type: ignore[misc]
    assert (last_order - last_seed).days >= 90
