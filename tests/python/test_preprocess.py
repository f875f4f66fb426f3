"""Preprocessing: sources → on-disk database, read back through ``headwater.Database``.

Every test builds into ``tmp_path`` with ``embedder="hash"``. The fixtures (small
relational database in four source kinds, TPC-H SF0.01) live in ``conftest.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import (
    DANGLING_SELLER,
    FULL_SCHEMA,
    RELBENCH_TASK,
    TIME_SCHEMA,
    USER_HIDDEN_BY_RELBENCH,
    Built,
    SmallData,
    Tpch,
    decode,
    open_built,
    scale_of,
    write_text,
)

import headwater
from headwater.errors import FormatError, SchemaError
from headwater.preprocessing import pipeline

I64_MIN = np.iinfo(np.int64).min
I64_MAX = np.iinfo(np.int64).max
EPOCH = dt.datetime(1970, 1, 1)
STORED_STYPES = ("numerical", "timestamp", "boolean", "categorical", "text")


@pytest.fixture(autouse=True)
def _isolated_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEADWATER_CACHE_DIR", str(tmp_path / "_cache"))


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def micros(v: Any) -> int | None:
    """A source date/datetime as µs since the epoch (naive = UTC)."""
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        return (v - EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(v, dt.date):
        return (dt.datetime.combine(v, dt.time()) - EPOCH) // dt.timedelta(microseconds=1)
    raise TypeError(type(v))


def source_values(col: pa.ChunkedArray | pa.Array, stype: str) -> list[Any]:
    """Source values as the decoded form of ``stype`` (None = null)."""
    out: list[Any] = []
    for v in col.to_pylist():
        if v is None:
            out.append(None)
        elif stype == "numerical":
            out.append(float(v))
        elif stype == "timestamp":
            out.append(micros(v))
        elif stype == "boolean":
            out.append(bool(v))
        else:
            out.append(str(v))
    return out


def assert_cells_equal(
    got: list[Any], want: list[Any], stype: str, scale: float, where: str
) -> None:
    assert len(got) == len(want), where
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if w is None or g is None:
            assert g is None and w is None, (
                f"{where} row {i}: got {g!r}, source {w!r} (null mismatch)"
            )
        elif stype == "numerical":
            # f32 z-score: relative error ~6e-8 of |x - mean|, plus the scale.
            assert abs(g - w) <= 1e-6 * (abs(w) + scale), f"{where} row {i}: {g} != {w}"
        else:
            assert g == w, f"{where} row {i}: got {g!r}, source {w!r}"


def check_column_round_trip(
    built: Built, table: str, column: str, src_col: pa.ChunkedArray, rows: np.ndarray | None = None
) -> str:
    """Compare a stored column (all rows, or ``rows``) with its source values."""
    cm = built.columns_of(table)[column]
    st = cm["stype"]
    values, valid = built.column(table, column)
    assert len(values) == len(valid) == len(src_col) == built.table(table)["num_rows"]
    if rows is None:
        rows = np.arange(len(values))
    want_all = source_values(src_col, st)
    got = decode(built.db, cm, values[rows], valid[rows])
    want = [want_all[i] for i in rows.tolist()]
    assert_cells_equal(got, want, st, scale_of(cm["stats"]), f"{table}.{column}")
    # Null cells hold zero.
    assert not np.any(values[valid == 0]), f"{table}.{column}: a null cell is not zero"
    return str(st)


def build_into(out: Path, source: Path, schema: Any = None, **kw: Any) -> Built:
    kw.setdefault("progress", False)
    headwater.preprocess(source, out, schema=schema, embedder="hash", **kw)
    return open_built(out)


def parent_rows(
    child_values: pa.ChunkedArray | pa.Array, parent_keys: pa.ChunkedArray | pa.Array
) -> np.ndarray:
    """Local parent row of every child FK value; -1 where null or dangling."""
    pos = {k: i for i, k in enumerate(parent_keys.to_pylist())}
    return np.array(
        [-1 if v is None else pos.get(v, -1) for v in child_values.to_pylist()], dtype=np.int64
    )


def check_graph(built: Built, source: dict[str, pa.Table]) -> None:
    """The CSR of ``built`` against FK values / time columns read from the source."""
    meta = built.meta
    g = built.db.graph_arrays()
    tables = meta["tables"]
    n = sum(t["num_rows"] for t in tables)
    assert meta["num_rows"] == n
    # Dense row → table lookup; tables own consecutive global row ranges.
    assert g["row_table"].dtype == np.uint16 and len(g["row_table"]) == n
    offset = 0
    for t in tables:
        assert t["row_offset"] == offset, t["name"]
        assert np.all(g["row_table"][offset : offset + t["num_rows"]] == t["idx"]), t["name"]
        assert source[t["name"]].num_rows == t["num_rows"], t["name"]
        offset += t["num_rows"]
    # Row times.
    for t in tables:
        rt = g["row_time"][t["row_offset"] : t["row_offset"] + t["num_rows"]]
        if t["time_column"] is None:
            assert np.all(rt == I64_MIN), t["name"]
        else:
            want = [
                I64_MIN if v is None else v
                for v in source_values(source[t["name"]].column(t["time_column"]), "timestamp")
            ]
            assert rt.tolist() == want, t["name"]
    # Forward CSR: exactly the non-null, resolvable FK values, in FK order.
    expected_targets: list[np.ndarray] = []  # in table order = global row order
    expected_counts = np.zeros(n, dtype=np.int64)
    for t in tables:
        fks = t["foreign_keys"]
        if not fks:
            continue
        src = source[t["name"]]
        cols = []
        for fk in fks:
            parent = tables[fk["references"]]
            rows = parent_rows(
                src.column(fk["column"]), source[parent["name"]].column(parent["primary_key"])
            )
            assert int((rows >= 0).sum()) == fk["num_edges"], (t["name"], fk["column"])
            nulls = src.column(fk["column"]).null_count
            assert fk["num_null"] == nulls, (t["name"], fk["column"])
            assert fk["num_dangling"] == int((rows < 0).sum()) - nulls, (t["name"], fk["column"])
            cols.append(np.where(rows >= 0, rows + parent["row_offset"], -1))
        p = np.stack(cols, axis=1)
        expected_counts[t["row_offset"] : t["row_offset"] + t["num_rows"]] = (p >= 0).sum(axis=1)
        expected_targets.append(p[p >= 0])  # row-major: per row, FK order
    fwd_off, fwd_tgt = g["fwd_offsets"], g["fwd_targets"]
    assert len(fwd_off) == n + 1 and fwd_off[0] == 0
    assert np.array_equal(np.diff(fwd_off.astype(np.int64)), expected_counts)
    want_targets = np.concatenate(expected_targets) if expected_targets else np.zeros(0, np.int64)
    assert np.array_equal(fwd_tgt.astype(np.int64), want_targets)
    e = len(fwd_tgt)
    assert meta["num_edges"] == e
    assert sum(fk["num_edges"] for t in tables for fk in t["foreign_keys"]) == e
    # Reverse CSR: exactly the transpose, children sorted by (time, id).
    rev_off, rev_tgt, rev_times = g["rev_offsets"], g["rev_targets"], g["rev_times"]
    assert len(rev_off) == n + 1 and rev_off[0] == 0 and rev_off[-1] == e
    assert len(rev_tgt) == len(rev_times) == e
    fwd_child = np.repeat(np.arange(n), np.diff(fwd_off.astype(np.int64)))
    rev_parent = np.repeat(np.arange(n), np.diff(rev_off.astype(np.int64)))
    fwd_pairs = np.stack([fwd_tgt.astype(np.int64), fwd_child], axis=1)
    rev_pairs = np.stack([rev_parent, rev_tgt.astype(np.int64)], axis=1)

    def order(a: np.ndarray) -> np.ndarray:
        return a[np.lexsort((a[:, 1], a[:, 0]))]

    assert np.array_equal(order(fwd_pairs), order(rev_pairs))
    assert np.array_equal(rev_times, g["row_time"][rev_tgt])
    same_parent = rev_parent[1:] == rev_parent[:-1]
    t0, t1 = rev_times[:-1], rev_times[1:]
    c0, c1 = rev_tgt[:-1], rev_tgt[1:]
    in_order = (t0 < t1) | ((t0 == t1) & (c0 < c1))
    assert np.all(in_order[same_parent]), "rev children not sorted by (time, child id)"


def source_tables_from_duckdb(path: Path) -> dict[str, pa.Table]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [r[0] for r in con.execute("SHOW TABLES").fetchall()]
        return {n: con.execute(f'SELECT * FROM "{n}"').to_arrow_table() for n in names}
    finally:
        con.close()


# ----------------------------------------------------------------------------
# 1. Round trip
# ----------------------------------------------------------------------------


def test_tpch_round_trip_samples_every_stored_column(tpch: Tpch) -> None:
    """≥ 200 random cells of every stored TPC-H column equal the DuckDB source values."""
    built = tpch.built
    src = source_tables_from_duckdb(tpch.source)
    rng = np.random.default_rng(0)
    cells = dict.fromkeys(STORED_STYPES, 0)
    text_values: set[str] = set()
    for t in built.meta["tables"]:
        for name, cm in built.columns_of(t["name"]).items():
            n = t["num_rows"]
            rows = np.sort(rng.choice(n, size=min(n, 200), replace=False))
            st = check_column_round_trip(built, t["name"], name, src[t["name"]].column(name), rows)
            cells[st] += len(rows)
            if st == "numerical":
                # Stats are the population mean/std of the source column.
                x = np.array(source_values(src[t["name"]].column(name), st), dtype=np.float64)
                assert cm["stats"]["mean"] == pytest.approx(x.mean(), rel=1e-12, abs=1e-9)
                assert cm["stats"]["std"] == pytest.approx(x.std(ddof=0), rel=1e-9, abs=1e-9)
                assert cm["stats"]["count"] == n and cm["stats"]["null_count"] == 0
            if st == "categorical":
                distinct = sorted({str(v) for v in src[t["name"]].column(name).to_pylist()})
                assert cm["categories"] == distinct
                assert cm["cat_emb_count"] == len(distinct)
                for j, c in enumerate(distinct):
                    s = built.db.embedded_string("categorical", cm["cat_emb_start"] + j)
                    assert s == f"{name}: {c}"
            if st == "text":
                text_values |= {str(v) for v in src[t["name"]].column(name).to_pylist()}
    # TPC-H has no boolean column: the small database covers it below.
    assert cells["numerical"] >= 200 and cells["timestamp"] >= 200
    assert cells["categorical"] >= 200 and cells["text"] >= 200
    # Text values are de-duplicated across the whole database.
    assert built.meta["num_text_embeddings"] == len(text_values)
    assert built.db.embeddings("text").shape == (len(text_values), 384)


def test_tpch_timestamp_stats_are_database_wide(tpch: Tpch) -> None:
    built = tpch.built
    src = source_tables_from_duckdb(tpch.source)
    allv: list[int] = []
    for t in built.meta["tables"]:
        for name, cm in built.columns_of(t["name"]).items():
            if cm["stype"] == "timestamp":
                allv += [
                    v
                    for v in source_values(src[t["name"]].column(name), "timestamp")
                    if v is not None
                ]
    x = np.array(allv, dtype=np.float64)
    ts = built.meta["timestamp_stats"]
    assert ts["count"] == len(allv)
    assert ts["mean_us"] == pytest.approx(x.mean(), rel=1e-12)
    assert ts["std_us"] == pytest.approx(x.std(), rel=1e-9)


def test_small_round_trip_all_types_with_nulls(
    tmp_path: Path, small_data: SmallData, duckdb_source: tuple[Path, Path]
) -> None:
    """Every cell of every stored column, including booleans and NULLs."""
    src, schema = duckdb_source
    built = build_into(tmp_path / "out", src, schema)
    seen = set()
    for tname, table in small_data.tables.items():
        for cname in built.columns_of(tname):
            seen.add(check_column_round_trip(built, tname, cname, table.column(cname)))
        # Nulls ↔ validity, counted in the stats.
        for cname, cm in built.columns_of(tname).items():
            assert cm["stats"]["null_count"] == table.column(cname).null_count, (tname, cname)
            if cm["stype"] == "categorical":
                distinct = {v for v in table.column(cname).to_pylist() if v is not None}
                assert cm["categories"] == sorted(distinct), (tname, cname)
    assert seen == set(STORED_STYPES)


def test_edge_values_and_degenerate_tables(tmp_path: Path) -> None:
    """Empty table, key-only table, NaN/inf, empty and non-ASCII strings."""
    d = tmp_path / "src"
    d.mkdir()
    pq.write_table(
        pa.table({"a": pa.array([], pa.float64()), "s": pa.array([], pa.string())}),
        d / "empty.parquet",
    )
    pq.write_table(pa.table({"k_id": pa.array([1, 2, 3], pa.int64())}), d / "keys.parquet")
    strings = ["", "é ü", "a'b\"c", None, "", "日本"]
    pq.write_table(
        pa.table(
            {
                "x": pa.array([1.0, float("nan"), float("inf"), None, 2.0, -float("inf")]),
                "s": pa.array(strings),
            }
        ),
        d / "vals.parquet",
    )
    b = build_into(tmp_path / "out", d)
    assert [(t["name"], t["num_rows"]) for t in b.meta["tables"]] == [
        ("empty", 0),
        ("keys", 3),
        ("vals", 6),
    ]
    assert b.table("keys")["columns"] == []
    values, valid = b.column("empty", "a")
    assert len(values) == len(valid) == 0
    # Non-finite numbers are stored as nulls; stats only over finite values.
    assert b.decoded("vals", "x") == [1.0, None, None, None, 2.0, None]
    assert b.columns_of("vals")["x"]["stats"]["count"] == 2
    assert b.decoded("vals", "s") == strings
    assert b.columns_of("vals")["s"]["categories"] == sorted({v for v in strings if v is not None})
    # No cell task for a column without values (it would have zero seeds).
    assert {k["name"] for k in b.meta["tasks"]} == {"vals.x", "vals.s"}
    assert b.task("vals.s")["num_seeds"] == 5


def test_timestamp_units_and_time_zones(tmp_path: Path) -> None:
    f = tmp_path / "ts.duckdb"
    con = duckdb.connect(str(f))
    con.execute(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, tz TIMESTAMPTZ, ns TIMESTAMP_NS, "
        "s TIMESTAMP_S, d DATE, v DOUBLE)"
    )
    con.execute(
        "INSERT INTO t VALUES "
        "(1, '2024-01-01 10:00:00.123456+02', '2024-01-01 10:00:00.123456789', "
        "'2024-01-01 10:00:00', '2024-01-01', 1.0), "
        "(2, NULL, '1969-12-31 23:59:59.999999999', NULL, '1960-02-29', 2.0)"
    )
    con.close()
    b = build_into(tmp_path / "out", f)
    base = 1704067200000000  # 2024-01-01 00:00:00 UTC in µs
    hour = 3_600_000_000
    assert b.decoded("t", "tz") == [base + 8 * hour + 123456, None]
    # Nanoseconds are floored to µs (also before the epoch).
    assert b.decoded("t", "ns") == [base + 10 * hour + 123456, -1]
    assert b.decoded("t", "s") == [base + 10 * hour, None]
    assert b.decoded("t", "d") == [base, micros(dt.date(1960, 2, 29))]


def test_json_schema_equals_toml_schema(
    tmp_path: Path, make_files: Callable[[Path], tuple[Path, Path]]
) -> None:
    import tomllib

    files, toml_schema = make_files(tmp_path / "files")
    json_schema = write_text(
        tmp_path / "schema.json", json.dumps(tomllib.loads(toml_schema.read_text()))
    )
    a = build_into(tmp_path / "a", files, toml_schema)
    b = build_into(tmp_path / "b", files, json_schema)
    assert a.db.content_hash == b.db.content_hash


def test_constant_numerical_column_uses_scale_one(tmp_path: Path) -> None:
    d = tmp_path / "src"
    d.mkdir()
    pq.write_table(
        pa.table({"a": pa.array([3.5, 3.5, None, 3.5]), "b": pa.array([1.0, 2.0, 3.0, 4.0])}),
        d / "t.parquet",
    )
    built = build_into(tmp_path / "out", d)
    cm = built.columns_of("t")["a"]
    assert cm["stats"]["std"] == 0.0 and cm["stats"]["mean"] == 3.5
    values, valid = built.column("t", "a")
    assert valid.tolist() == [1, 1, 0, 1]
    assert values.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert built.decoded("t", "a") == [3.5, 3.5, None, 3.5]


# ----------------------------------------------------------------------------
# 2. Graph (CSR)
# ----------------------------------------------------------------------------


def test_tpch_csr_matches_foreign_keys(tpch: Tpch) -> None:
    check_graph(tpch.built, source_tables_from_duckdb(tpch.source))
    # Parents with temporal children: lineitems of an order are in ship-date order.
    meta = tpch.built.meta
    assert meta["num_edges"] == 1500 + 25 + 100 + 2 * 8000 + 15000 + 3 * 60175


def test_small_csr_with_nulls_and_dangling(
    tmp_path: Path, small_data: SmallData, duckdb_source: tuple[Path, Path]
) -> None:
    src, schema = duckdb_source
    built = build_into(tmp_path / "out", src, schema)
    check_graph(built, small_data.tables)
    items = built.table("items")
    (fk,) = items["foreign_keys"]
    assert (fk["column"], fk["num_null"], fk["num_dangling"], fk["num_edges"]) == (
        "seller_id",
        1,
        1,
        23,
    )
    # The row holding the dangling value has no parent edge.
    g = built.db.graph_arrays()
    sellers = small_data.values("items", "seller_id")
    r = items["row_offset"] + sellers.index(DANGLING_SELLER)
    assert g["fwd_offsets"][r + 1] == g["fwd_offsets"][r]
    # Users without a time (one null signup) get i64::MIN.
    users = built.table("users")
    signups = small_data.values("users", "signup")
    assert g["row_time"][users["row_offset"] + signups.index(None)] == I64_MIN


# ----------------------------------------------------------------------------
# 3. Sources
# ----------------------------------------------------------------------------


@pytest.fixture
def four_sources(
    tmp_path: Path,
    make_relbench: Callable[..., Path],
    make_sqlite: Callable[[Path], Path],
    make_files: Callable[[Path], tuple[Path, Path]],
    duckdb_source: tuple[Path, Path],
) -> dict[str, Built]:
    rb = make_relbench(tmp_path / "relbench")
    sq = make_sqlite(tmp_path / "small.sqlite")
    files, files_schema = make_files(tmp_path / "files")
    duck, duck_schema = duckdb_source
    time_schema = write_text(tmp_path / "time_schema.toml", TIME_SCHEMA)
    return {
        "relbench": build_into(tmp_path / "out_relbench", rb),
        "duckdb": build_into(tmp_path / "out_duckdb", duck, duck_schema),
        "sqlite": build_into(tmp_path / "out_sqlite", sq, time_schema),
        "files": build_into(tmp_path / "out_files", files, files_schema),
    }


def _summary(b: Built) -> list[Any]:
    return [
        (
            t["name"],
            t["num_rows"],
            t["row_offset"],
            t["primary_key"],
            t["time_column"],
            [
                (
                    f["column"],
                    b.meta["tables"][f["references"]]["name"],
                    f["num_edges"],
                    f["num_null"],
                    f["num_dangling"],
                )
                for f in t["foreign_keys"]
            ],
        )
        for t in b.meta["tables"]
    ]


def test_sources_agree(four_sources: dict[str, Built], small_data: SmallData) -> None:
    ref = four_sources["duckdb"]
    assert [t["name"] for t in ref.meta["tables"]] == ["events", "items", "users"]
    assert ref.table("items")["foreign_keys"][0]["num_dangling"] == 1
    assert ref.table("events")["foreign_keys"][0]["num_null"] == 3
    g_ref = ref.db.graph_arrays()
    for kind, b in four_sources.items():
        assert json.loads(b.meta["source"])["kind"] == kind
        assert _summary(b) == _summary(ref), kind
        assert b.meta["num_edges"] == ref.meta["num_edges"] == 297 + 300 + 23
        g = b.db.graph_arrays()
        for k, v in g_ref.items():
            assert np.array_equal(g[k], v), (kind, k)
        for tname, table in small_data.tables.items():
            stored = {c: cm["stype"] for c, cm in b.columns_of(tname).items()}
            want = {c: cm["stype"] for c, cm in ref.columns_of(tname).items()}
            if kind == "relbench" and tname == "users":
                want.pop(USER_HIDDEN_BY_RELBENCH)
            assert stored == want, (kind, tname)
            for cname in stored:
                check_column_round_trip(b, tname, cname, table.column(cname))
    assert ref.stype("events", "note") == "text"
    assert ref.stype("users", "is_active") == "boolean"
    assert ref.stype("items", "category") == "categorical"


def test_relbench_task_is_imported(four_sources: dict[str, Built], small_data: SmallData) -> None:
    b = four_sources["relbench"]
    assert [k["name"] for k in b.meta["tasks"]] == [RELBENCH_TASK]  # no cell tasks added
    k = b.task(RELBENCH_TASK)
    labels = pa.concat_tables([small_data.labels[s] for s in ("train", "val", "test")])
    assert k["kind"] == "relbench"
    assert k["target_stype"] == "boolean"
    assert k["num_seeds"] == labels.num_rows - 1  # one label names no user
    assert k["temporal"] is True
    users = b.table("users")
    assert b.meta["tables"][k["anchor_table"]]["name"] == "users"
    arr = b.db.task_arrays(k["idx"])
    uids = small_data.values("users", "user_id")
    want = sorted(
        (users["row_offset"] + uids.index(u), micros(t), bool(c))
        for u, t, c in zip(
            labels.column("user_id").to_pylist(),
            labels.column("timestamp").to_pylist(),
            labels.column("churn").to_pylist(), strict=False,
        )
        if u in uids
    )
    got = sorted(
        zip(arr["anchor_row"].tolist(), arr["obs_time"].tolist(), [bool(x) for x in arr["target"]], strict=False)
    )
    assert got == want
    assert arr["target_valid"].all()


def test_relbench_remove_columns_hides_column(four_sources: dict[str, Built]) -> None:
    b = four_sources["relbench"]
    assert USER_HIDDEN_BY_RELBENCH not in b.columns_of("users")
    hidden = {u["name"]: u["stype"] for u in b.table("users")["unstored_columns"]}
    assert hidden[USER_HIDDEN_BY_RELBENCH] == "ignored"
    # Not embedded as a column name either.
    col_names = [b.db.embedded_string("column", i) for i in range(len(b.meta["columns"]))]
    assert f"{USER_HIDDEN_BY_RELBENCH} of users" not in col_names
    # The other sources keep it.
    assert USER_HIDDEN_BY_RELBENCH in four_sources["sqlite"].columns_of("users")


def test_relbench_without_remove_columns_keeps_column(
    tmp_path: Path, make_relbench: Callable[..., Path]
) -> None:
    rb = make_relbench(tmp_path / "rb", remove_columns=False)
    b = build_into(tmp_path / "out", rb)
    assert b.columns_of("users")[USER_HIDDEN_BY_RELBENCH]["stype"] == "numerical"


def test_declared_keys_come_from_the_source(
    tmp_path: Path, make_sqlite: Callable[[Path], Path], make_duckdb: Callable[[Path], Path]
) -> None:
    """SQLite/DuckDB constraints give the keys; no schema needed for them."""
    sq = build_into(tmp_path / "sq", make_sqlite(tmp_path / "a.sqlite"), time_columns="none")
    dk = build_into(tmp_path / "dk", make_duckdb(tmp_path / "a.duckdb"), time_columns="none")
    for b in (sq, dk):
        assert b.table("users")["primary_key"] == "user_id"
        assert [f["column"] for f in b.table("events")["foreign_keys"]] == ["user_id", "item_id"]
        assert b.table("users")["time_column"] is None  # not declared, none proposed
    assert [f["column"] for f in sq.table("items")["foreign_keys"]] == ["seller_id"]
    assert dk.table("items")["foreign_keys"] == []  # no constraint in the DuckDB file


# ----------------------------------------------------------------------------
# 4. Tasks
# ----------------------------------------------------------------------------

TASK_SCHEMA = '''
[[tasks]]
name = "user_events_30d"
anchor_table = "users"
target_stype = "numerical"
description = "events in the 30 days after signup"
query = """
SELECT u.user_id, u.signup + INTERVAL 30 DAY AS obs, count(e.event_id)::DOUBLE AS n
FROM users AS u LEFT JOIN events AS e
  ON e.user_id = u.user_id AND e.ts <= u.signup + INTERVAL 30 DAY
WHERE u.signup IS NOT NULL
GROUP BY ALL
ORDER BY u.user_id DESC
"""

[[tasks]]
name = "item_in_stock"
anchor_table = "items"
target_stype = "boolean"
query = "SELECT item_id, NULL, in_stock FROM items WHERE item_id % 2 = 0"

[[tasks]]
name = "event_kind"
anchor_table = "events"
target_stype = "categorical"
column = "kind"

[[tasks]]
name = "item_price"
anchor_table = "items"
target_stype = "numerical"
column = "price"
'''


def test_sql_and_cell_tasks(
    tmp_path: Path, small_data: SmallData, duckdb_source: tuple[Path, Path]
) -> None:
    src, schema = duckdb_source
    sch = write_text(tmp_path / "tasks.toml", schema.read_text() + TASK_SCHEMA)
    b = build_into(tmp_path / "out", src, sch)
    assert [k["name"] for k in b.meta["tasks"]] == [
        "user_events_30d",
        "item_in_stock",
        "event_kind",
        "item_price",
    ]
    con = duckdb.connect(str(src), read_only=True)
    # SQL task, numerical, temporal.
    k = b.task("user_events_30d")
    assert (k["kind"], k["target_stype"], k["temporal"]) == ("sql", "numerical", True)
    assert "INTERVAL 30 DAY" in k["query"] and k["description"].startswith("events")
    rows = con.execute(
        "SELECT u.user_id, u.signup + INTERVAL 30 DAY, count(e.event_id)::DOUBLE FROM users u "
        "LEFT JOIN events e ON e.user_id = u.user_id AND e.ts <= u.signup + INTERVAL 30 DAY "
        "WHERE u.signup IS NOT NULL GROUP BY ALL ORDER BY u.user_id DESC"
    ).fetchall()
    uids = small_data.values("users", "user_id")
    users = b.table("users")
    arr = b.db.task_arrays(k["idx"])
    assert k["num_seeds"] == len(rows) == _num_with_signup(small_data)
    assert arr["anchor_row"].tolist() == [users["row_offset"] + uids.index(r[0]) for r in rows]
    assert arr["obs_time"].tolist() == [micros(r[1]) for r in rows]
    target_col = b.meta["columns"][k["target_column"]]
    assert target_col["slot"] is None and target_col["table"] == users["idx"]
    got = decode(b.db, target_col, arr["target"], arr["target_valid"])
    assert_cells_equal(
        got, [r[2] for r in rows], "numerical", scale_of(target_col["stats"]), k["name"]
    )
    assert sum(r[2] for r in rows) > 0
    # SQL task, boolean, non-temporal (NULL observation time), a NULL target.
    k = b.task("item_in_stock")
    rows = con.execute("SELECT item_id, in_stock FROM items WHERE item_id % 2 = 0").fetchall()
    items = b.table("items")
    iids = small_data.values("items", "item_id")
    arr = b.db.task_arrays(k["idx"])
    assert k["temporal"] is False
    assert arr["obs_time"].tolist() == [I64_MAX] * len(rows)
    assert arr["anchor_row"].tolist() == [items["row_offset"] + iids.index(r[0]) for r in rows]
    assert [None if not ok else bool(v) for v, ok in zip(arr["target"], arr["target_valid"], strict=False)] == [
        r[1] for r in rows
    ]
    assert k["num_null_targets"] == sum(r[1] is None for r in rows) == 1
    con.close()
    # Cell task, temporal anchor table: every row is a seed at its row time.
    k = b.task("event_kind")
    ev = b.table("events")
    arr = b.db.task_arrays(k["idx"])
    kind_col = b.columns_of("events")["kind"]
    assert (k["kind"], k["target_column"]) == ("cell", kind_col["idx"])
    assert arr["anchor_row"].tolist() == list(
        range(ev["row_offset"], ev["row_offset"] + small_data.tables["events"].num_rows)
    )
    assert arr["obs_time"].tolist() == [micros(t) for t in small_data.values("events", "ts")]
    assert decode(b.db, kind_col, arr["target"], arr["target_valid"]) == small_data.values(
        "events", "kind"
    )
    # Cell task on a non-temporal table with a NULL: the null row is no seed.
    k = b.task("item_price")
    arr = b.db.task_arrays(k["idx"])
    prices = small_data.values("items", "price")
    keep = [i for i, p in enumerate(prices) if p is not None]
    assert k["num_seeds"] == len(keep) == len(prices) - 1
    assert arr["anchor_row"].tolist() == [items["row_offset"] + i for i in keep]
    assert arr["obs_time"].tolist() == [I64_MAX] * len(keep)
    price_col = b.columns_of("items")["price"]
    got = decode(b.db, price_col, arr["target"], arr["target_valid"])
    assert_cells_equal(
        got, [prices[i] for i in keep], "numerical", scale_of(price_col["stats"]), "price"
    )


def _num_with_signup(d: SmallData) -> int:
    return sum(v is not None for v in d.values("users", "signup"))


def test_default_cell_tasks_one_per_eligible_column(
    tmp_path: Path, small_data: SmallData, make_duckdb: Callable[[Path], Path]
) -> None:
    src = make_duckdb(tmp_path / "s.duckdb")
    # users has no time column here (none proposed), so users.signup is an
    # eligible timestamp.
    sch = write_text(tmp_path / "s.toml", '[tables.events]\ntime_column = "ts"\n')
    b = build_into(tmp_path / "out", src, sch, time_columns="none")
    names = {k["name"] for k in b.meta["tasks"]}
    assert names == {
        "events.amount",
        "events.kind",
        "items.category",
        "items.price",
        "items.in_stock",
        "users.country",
        "users.age",
        "users.is_active",
        "users.signup",
    }
    # Not: keys, the time column events.ts, the text column events.note.
    assert b.stype("events", "note") == "text" and b.stype("events", "ts") == "timestamp"
    for k in b.meta["tasks"]:
        tname, cname = k["name"].split(".")
        t = b.table(tname)
        cm = b.columns_of(tname)[cname]
        assert k["kind"] == "cell" and k["target_column"] == cm["idx"]
        assert k["target_stype"] == cm["stype"]
        values = small_data.values(tname, cname)
        keep = [i for i, v in enumerate(values) if v is not None]
        arr = b.db.task_arrays(k["idx"])
        assert k["num_seeds"] == len(keep)
        assert arr["anchor_row"].tolist() == [t["row_offset"] + i for i in keep]
        want_obs = (
            [micros(small_data.values("events", "ts")[i]) for i in keep]
            if tname == "events"
            else [I64_MAX] * len(keep)
        )
        assert arr["obs_time"].tolist() == want_obs
        stored, _ = b.column(tname, cname)
        assert np.array_equal(arr["target"], stored[keep])
        assert arr["target_valid"].all()


# ----------------------------------------------------------------------------
# 5. Bad input
# ----------------------------------------------------------------------------


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def expect_failure(
    tmp_path: Path,
    source: Path,
    schema: Any,
    exc: type[BaseException],
    *needles: str,
) -> str:
    """Preprocess must raise ``exc`` naming every needle; nothing published or escaped."""
    out = tmp_path / "out"
    before_parent = set(os.listdir(tmp_path.parent))
    before = _tree(tmp_path)
    with pytest.raises(exc) as ei:
        headwater.preprocess(source, out, schema=schema, embedder="hash", progress=False)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert not out.exists()
    new = {p for p in _tree(tmp_path) - before if not p.startswith("_cache")}
    assert all(p == "out.partial" or p.startswith("out.partial/") for p in new), new
    assert set(os.listdir(tmp_path.parent)) == before_parent
    return msg


def _files_dir(tmp_path: Path, small_data: SmallData, **extra: pa.Table) -> Path:
    d = tmp_path / "files"
    d.mkdir(exist_ok=True)
    for name, t in {**small_data.tables, **extra}.items():
        pq.write_table(t, d / f"{name}.parquet")
    return d


def test_missing_source(tmp_path: Path) -> None:
    expect_failure(tmp_path, tmp_path / "nope.duckdb", None, FileNotFoundError, "nope.duckdb")


def test_missing_schema_file(tmp_path: Path, small_data: SmallData) -> None:
    src = _files_dir(tmp_path, small_data)
    expect_failure(tmp_path, src, tmp_path / "nope.toml", FileNotFoundError, "nope.toml")


@pytest.mark.parametrize(
    "head",
    [
        b"\x00garbage" * 100,
        b"SQLite format 3\x00" + b"\xff" * 200,
        b"\x00" * 8 + b"DUCK" + b"\x13" * 500,
    ],
    ids=["random", "sqlite-header", "duckdb-header"],
)
def test_garbage_source_file(tmp_path: Path, head: bytes) -> None:
    f = tmp_path / "junk.db"
    f.write_bytes(head)
    expect_failure(tmp_path, f, None, SchemaError, "junk.db")


def test_garbage_parquet_in_directory(tmp_path: Path, small_data: SmallData) -> None:
    d = _files_dir(tmp_path, small_data)
    (d / "broken.parquet").write_bytes(b"PAR1 this is not parquet at all")
    expect_failure(tmp_path, d, None, SchemaError, "broken.parquet", "cannot read")


def test_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    expect_failure(tmp_path, tmp_path / "empty", None, SchemaError, "empty", "no .parquet")


def test_bad_toml(tmp_path: Path, small_data: SmallData) -> None:
    src = _files_dir(tmp_path, small_data)
    sch = write_text(tmp_path / "bad.toml", "[tables.users\nprimary_key = 1\n")
    expect_failure(tmp_path, src, sch, SchemaError, "bad.toml", "TOML")


SCHEMA_ERRORS = {
    "unknown-table": ('[tables.nosuch]\nprimary_key = "x"\n', ["`nosuch`", "not in the source"]),
    "mistyped-table": (
        '[tables.user]\nprimary_key = "user_id"\n',
        ["`user`", "not in the source (did you mean `users`?)"],
    ),
    "unknown-column": ('[tables.users.columns]\nnosuch = "numerical"\n', ["`users`", "`nosuch`"]),
    "mistyped-column": (
        '[tables.users.columns]\nages = "numerical"\n',
        ["`users`", "no column `ages` (did you mean `age`?)"],
    ),
    "unknown-pk-column": ('[tables.users]\nprimary_key = "uid"\n', ["`users`", "`uid`"]),
    "unknown-key": (
        '[tables.users]\nprimary_keys = "user_id"\n',
        ["tables.users", "'primary_keys' (did you mean `primary_key`?)"],
    ),
    "unknown-top-key": (
        '[table.users]\nprimary_key = "user_id"\n', ["'table' (did you mean `tables`?)"]
    ),
    "unknown-task-key": (
        '[[tasks]]\nname = "t"\nanchor_table = "users"\ntarget_stype = "numerical"\n'
        'colum = "age"\n',
        ["tasks[0]", "'colum' (did you mean `column`?)"],
    ),
    "bad-stype": (
        '[tables.users.columns]\nage = "numeric"\n',
        ["tables.users.columns.age", "'numeric' (did you mean `numerical`?)"],
    ),
    "fk-unknown-table": (
        '[tables.events]\nforeign_keys = { user_id = "people" }\n',
        ["`events`", "`user_id`", "`people`"],
    ),
    "fk-no-pk": (
        '[tables.events]\nforeign_keys = { user_id = "users" }\n',
        ["`events`", "`user_id`", "`users`", "no primary key"],
    ),
    "key-as-numerical": (
        '[tables.users]\nprimary_key = "user_id"\n[tables.users.columns]\nuser_id = "numerical"\n',
        ["`users`", "`user_id`", "key"],
    ),
    "cannot-encode": (
        '[tables.events.columns]\nnote = "numerical"\n',
        ["`events`", "`note`", "numerical"],
    ),
    "bad-target-stype": (
        '[[tasks]]\nname = "t"\nanchor_table = "users"\ntarget_stype = "text"\ncolumn = "country"\n',
        ["task `t`", "'text'"],
    ),
    "task-column-and-query": (
        (
            '[[tasks]]\nname = "t"\nanchor_table = "users"\ntarget_stype = "numerical"\n'
            'column = "age"\nquery = "SELECT 1"\n'
        ),
        ["task `t`", "exactly one"],
    ),
    "cell-task-wrong-stype": (
        '[[tasks]]\nname = "t"\nanchor_table = "users"\ntarget_stype = "boolean"\ncolumn = "age"\n',
        ["task `t`", "users.age", "numerical"],
    ),
    "sql-task-anchor-without-pk": (
        (
            '[[tasks]]\nname = "t"\nanchor_table = "users"\ntarget_stype = "numerical"\n'
            'query = "SELECT user_id, signup, age FROM users"\n'
        ),
        ["task `t`", "`users`", "no primary key"],
    ),
    "cell-task-unknown-anchor": (
        '[[tasks]]\nname = "t"\nanchor_table = "people"\ntarget_stype = "boolean"\ncolumn = "age"\n',
        ["task `t`", "`people`"],
    ),
    "cell-task-mistyped-anchor": (
        '[[tasks]]\nname = "t"\nanchor_table = "user"\ntarget_stype = "numerical"\ncolumn = "age"\n',
        ["task `t`", "`user` (did you mean `users`?)"],
    ),
    "cell-task-mistyped-column": (
        '[[tasks]]\nname = "t"\nanchor_table = "users"\ntarget_stype = "numerical"\ncolumn = "ag"\n',
        ["task `t`", "no column `ag` (did you mean `age`?)"],
    ),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_ERRORS))
def test_schema_errors(tmp_path: Path, small_data: SmallData, case: str) -> None:
    text, needles = SCHEMA_ERRORS[case]
    src = _files_dir(tmp_path, small_data)
    sch = write_text(tmp_path / "schema.toml", text)
    expect_failure(tmp_path, src, sch, SchemaError, *needles)


def test_duplicate_primary_key_shows_example(tmp_path: Path, small_data: SmallData) -> None:
    users = small_data.tables["users"]
    dup = pa.concat_tables([users, users.slice(6, 1)])  # user_id 7 twice
    src = _files_dir(tmp_path, small_data, users=dup)
    sch = write_text(tmp_path / "s.toml", FULL_SCHEMA)
    expect_failure(
        tmp_path, src, sch, SchemaError, "`users`", "`user_id`", "duplicated", "7 appears 2 times"
    )


def test_null_primary_key(tmp_path: Path, small_data: SmallData) -> None:
    users = small_data.tables["users"]
    ids = users.column("user_id").to_pylist()
    ids[3] = None
    bad = users.set_column(0, "user_id", pa.array(ids, pa.int64()))
    src = _files_dir(tmp_path, small_data, users=bad)
    sch = write_text(tmp_path / "s.toml", FULL_SCHEMA)
    expect_failure(tmp_path, src, sch, SchemaError, "`users`", "`user_id`", "null")


def _task_schema(query: str, name: str = "my_task") -> str:
    return FULL_SCHEMA + (
        f'\n[[tasks]]\nname = "{name}"\nanchor_table = "users"\n'
        f'target_stype = "numerical"\nquery = """{query}"""\n'
    )


def test_sql_task_error_carries_duckdb_message(tmp_path: Path, small_data: SmallData) -> None:
    src = _files_dir(tmp_path, small_data)
    query = "SELECT user_id, signup, no_such_column FROM users"
    con = duckdb.connect()
    con.execute(f"CREATE VIEW users AS SELECT * FROM read_parquet('{src / 'users.parquet'}')")
    with pytest.raises(duckdb.Error) as de:
        con.execute(query)
    duck_msg = str(de.value).splitlines()[0]
    sch = write_text(tmp_path / "s.toml", _task_schema(query))
    expect_failure(tmp_path, src, sch, SchemaError, "task `my_task`", duck_msg, "no_such_column")


def test_sql_task_zero_rows(tmp_path: Path, small_data: SmallData) -> None:
    src = _files_dir(tmp_path, small_data)
    sch = write_text(
        tmp_path / "s.toml", _task_schema("SELECT user_id, signup, age FROM users WHERE false")
    )
    expect_failure(tmp_path, src, sch, SchemaError, "task `my_task`", "zero rows")


def test_sql_task_no_matching_anchor(tmp_path: Path, small_data: SmallData) -> None:
    src = _files_dir(tmp_path, small_data)
    sch = write_text(
        tmp_path / "s.toml", _task_schema("SELECT user_id + 1000, signup, age FROM users")
    )
    expect_failure(tmp_path, src, sch, SchemaError, "task `my_task`", "`users`", "zero seeds")


def test_sql_task_two_columns(tmp_path: Path, small_data: SmallData) -> None:
    src = _files_dir(tmp_path, small_data)
    sch = write_text(tmp_path / "s.toml", _task_schema("SELECT user_id, age FROM users"))
    expect_failure(tmp_path, src, sch, SchemaError, "task `my_task`", "2 columns", "expected 3")


@pytest.mark.parametrize("name", ["..", "a\x01b", "tab\there"], ids=["dotdot", "control", "tab"])
def test_unsafe_parquet_table_name(tmp_path: Path, small_data: SmallData, name: str) -> None:
    d = tmp_path / "files"
    d.mkdir()
    pq.write_table(small_data.tables["items"], d / f"{name}.parquet")
    expect_failure(
        tmp_path,
        d,
        None,
        SchemaError,
        "unsafe table name",
        repr(name).strip("'").replace("\\x01", "\\u{1}"),
    )


@pytest.mark.parametrize("name", ["a/b", "..", "../../escape", "x\\y", "."])
def test_unsafe_duckdb_table_name(tmp_path: Path, name: str) -> None:
    f = tmp_path / "weird.duckdb"
    con = duckdb.connect(str(f))
    quoted = '"' + name.replace('"', '""') + '"'
    con.execute(f"CREATE TABLE {quoted} (x DOUBLE, y VARCHAR)")
    con.execute(f"INSERT INTO {quoted} VALUES (1.5, 'a'), (2.5, 'b')")
    con.close()
    expect_failure(tmp_path, f, None, SchemaError, "unsafe table name")


def test_unsafe_column_name(tmp_path: Path) -> None:
    f = tmp_path / "weird.duckdb"
    con = duckdb.connect(str(f))
    con.execute('CREATE TABLE t ("a/b" DOUBLE, y DOUBLE)')
    con.execute("INSERT INTO t VALUES (1.5, 2.0), (2.5, 3.0)")
    con.close()
    expect_failure(tmp_path, f, None, SchemaError, "unsafe column name", "a/b")


def test_failure_after_tables_keeps_only_staging(tmp_path: Path, small_data: SmallData) -> None:
    """A task error comes after tables were staged: still no out_dir."""
    src = _files_dir(tmp_path, small_data)
    sch = write_text(tmp_path / "s.toml", _task_schema("SELECT user_id FROM users"))
    expect_failure(tmp_path, src, sch, SchemaError, "1 columns")
    assert (tmp_path / "out.partial" / "parts").is_dir()


def test_bad_arguments(tmp_path: Path, small_data: SmallData) -> None:
    src = _files_dir(tmp_path, small_data)
    with pytest.raises(ValueError, match="embedder"):
        headwater.preprocess(src, tmp_path / "out", embedder="nope", progress=False)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------
# 6. Atomic output and restart
# ----------------------------------------------------------------------------


def test_existing_out_dir_and_overwrite(tmp_path: Path, duckdb_source: tuple[Path, Path]) -> None:
    src, schema = duckdb_source
    out = tmp_path / "out"
    first = build_into(out, src, schema)
    h1 = first.db.content_hash
    del first
    with pytest.raises(ValueError, match="already exists"):
        headwater.preprocess(src, out, schema=schema, embedder="hash", progress=False)
    assert open_built(out).db.content_hash == h1  # untouched
    # overwrite=True replaces it (a different schema → a different snapshot).
    sch2 = write_text(
        tmp_path / "s2.toml", schema.read_text() + '\n[tables.events.columns]\nnote = "ignored"\n'
    )
    second = build_into(out, src, sch2, overwrite=True)
    assert second.db.content_hash != h1
    assert "note" not in second.columns_of("events")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out"]


def test_failed_overwrite_keeps_the_old_database(
    tmp_path: Path, duckdb_source: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, schema = duckdb_source
    out = tmp_path / "out"
    h1 = build_into(out, src, schema).db.content_hash
    bad = write_text(tmp_path / "bad.toml", _task_schema("SELECT 1, 2"))
    with pytest.raises(SchemaError):
        headwater.preprocess(src, out, schema=bad, embedder="hash", overwrite=True, progress=False)
    assert open_built(out).db.content_hash == h1
    shutil.rmtree(tmp_path / "out.partial")  # so that the next run adds tables again
    with monkeypatch.context() as m:
        _interrupt_on(m, 2)
        with pytest.raises(KeyboardInterrupt):
            headwater.preprocess(src, out, schema=schema, embedder="hash", overwrite=True)
    assert open_built(out).db.content_hash == h1


class _WriterSpy:
    """Wraps the native writer to record ``num_resumed()`` before ``finish``."""

    instances: ClassVar[list[_WriterSpy]] = []

    def __init__(self, *a: Any, **k: Any) -> None:
        from headwater import _native

        self._w = _native.DatabaseWriter(*a, **k)
        self.resumed: int | None = None
        _WriterSpy.instances.append(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._w, name)

    def finish(self, *a: Any, **k: Any) -> Any:
        self.resumed = self._w.num_resumed()
        return self._w.finish(*a, **k)


def _spy_writer(monkeypatch: pytest.MonkeyPatch) -> type[_WriterSpy]:
    from headwater import _native

    shim = types.SimpleNamespace(
        **{k: getattr(_native, k) for k in dir(_native) if not k.startswith("__")},
        __version__=_native.__version__,
    )
    shim.DatabaseWriter = _WriterSpy
    _WriterSpy.instances = []
    monkeypatch.setattr(pipeline, "_native", shim)
    return _WriterSpy


def _interrupt_on(monkeypatch: pytest.MonkeyPatch, nth: int) -> list[str]:
    """Make ``_add_table`` raise on its ``nth`` call; returns the tables it finished."""
    done: list[str] = []
    orig = pipeline._add_table

    def flaky(writer: Any, src: Any, plan: Any, *a: Any, **k: Any) -> None:
        if len(done) + 1 == nth:
            raise KeyboardInterrupt(f"interrupted at {plan.name}")
        orig(writer, src, plan, *a, **k)
        done.append(plan.name)

    monkeypatch.setattr(pipeline, "_add_table", flaky)
    return done


def test_interrupt_and_resume_is_byte_identical(
    tmp_path: Path,
    duckdb_source: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, schema = duckdb_source
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        done = _interrupt_on(m, 3)
        with pytest.raises(KeyboardInterrupt):
            headwater.preprocess(src, out, schema=schema, embedder="hash", progress=False)
    assert done == ["events", "items"]
    assert not out.exists()
    staged = tmp_path / "out.partial"
    assert sorted(p.name for p in (staged / "parts").iterdir()) == [
        "0.bin",
        "0.json",
        "1.bin",
        "1.json",
    ]
    assert sorted(p.name for p in (staged / "tables").iterdir()) == ["0.bin", "1.bin"]
    capsys.readouterr()
    spy = _spy_writer(monkeypatch)
    headwater.preprocess(src, out, schema=schema, embedder="hash", progress=True)
    err = capsys.readouterr().err
    assert "events: reused from the interrupted run" in err
    assert "items: reused from the interrupted run" in err
    assert "users: reused" not in err
    assert spy.instances[-1].resumed == 2
    assert not staged.exists()
    # A clean run into another directory gives the same snapshot, byte for byte.
    clean = tmp_path / "clean"
    headwater.preprocess(src, clean, schema=schema, embedder="hash", progress=False)
    assert spy.instances[-1].resumed == 0
    a, b = open_built(out), open_built(clean)
    assert a.db.content_hash == b.db.content_hash
    files_a = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    files_b = sorted(str(p.relative_to(clean)) for p in clean.rglob("*") if p.is_file())
    assert files_a == files_b
    for f in files_a:
        assert (out / f).read_bytes() == (clean / f).read_bytes(), f


@pytest.mark.parametrize("changed", ["events", "users"])
def test_changed_source_invalidates_reuse(
    tmp_path: Path,
    small_data: SmallData,
    make_files: Callable[[Path], tuple[Path, Path]],
    monkeypatch: pytest.MonkeyPatch,
    changed: str,
) -> None:
    """Changing a staged table's file — or the file of a table it references
    (users, staged after events) — must not reuse stale rows or edges."""
    files, schema = make_files(tmp_path / "files")
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _interrupt_on(m, 3)
        with pytest.raises(KeyboardInterrupt):
            headwater.preprocess(files, out, schema=schema, embedder="hash", progress=False)
    # Rewrite one file: rows reversed (same size class, new content and mtime).
    t = small_data.tables[changed]
    pq.write_table(t.take(pa.array(range(t.num_rows - 1, -1, -1))), files / f"{changed}.parquet")
    spy = _spy_writer(monkeypatch)
    resumed = build_into(out, files, schema)
    assert spy.instances[-1].resumed == 0
    clean = build_into(tmp_path / "clean", files, schema)
    assert resumed.db.content_hash == clean.db.content_hash
    src = dict(small_data.tables)
    src[changed] = pq.read_table(files / f"{changed}.parquet")
    check_graph(resumed, src)


def test_unchanged_parent_allows_reuse_with_parquet_files(
    tmp_path: Path,
    make_files: Callable[[Path], tuple[Path, Path]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    files, schema = make_files(tmp_path / "files")
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _interrupt_on(m, 3)
        with pytest.raises(KeyboardInterrupt):
            headwater.preprocess(files, out, schema=schema, embedder="hash", progress=False)
    spy = _spy_writer(monkeypatch)
    resumed = build_into(out, files, schema)
    assert spy.instances[-1].resumed == 2
    clean = build_into(tmp_path / "clean", files, schema)
    assert resumed.db.content_hash == clean.db.content_hash


# ----------------------------------------------------------------------------
# 7. Corrupt files
# ----------------------------------------------------------------------------


@pytest.fixture
def built_small(tmp_path: Path, duckdb_source: tuple[Path, Path]) -> Path:
    src, schema = duckdb_source
    out = tmp_path / "good"
    build_into(out, src, schema)
    return out


def _copy(db: Path, tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(db, dst)
    for p in dst.rglob("*"):
        if p.is_file():
            p.chmod(0o644)
    return dst


def _flip(path: Path, at: int) -> None:
    b = bytearray(path.read_bytes())
    b[at] ^= 0x5A
    path.write_bytes(bytes(b))


def _payload_start(path: Path) -> int:
    b = path.read_bytes()
    n = int.from_bytes(b[12:16], "little")
    return -(-(48 + 16 * n) // 64) * 64


def _open_fails(db: Path, exc: type[BaseException], *needles: str) -> str:
    with pytest.raises(exc) as ei:
        headwater.Database(db)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def test_pristine_copy_opens(built_small: Path, tmp_path: Path) -> None:
    a = headwater.Database(built_small)
    b = headwater.Database(_copy(built_small, tmp_path, "copy"))
    assert a.content_hash == b.content_hash and len(a.content_hash) == 32
    total = sum(
        p.stat().st_size for p in built_small.rglob("*") if p.is_file() and p.suffix == ".bin"
    )
    assert a.bytes_on_disk >= total


def test_database_out_of_range_arguments(built_small: Path) -> None:
    db = headwater.Database(built_small)
    n_tables = len(json.loads(db.metadata_json())["tables"])
    with pytest.raises(ValueError, match="table"):
        db.column(n_tables, 0)
    with pytest.raises(ValueError, match="slot 99"):
        db.column(0, 99)
    with pytest.raises(ValueError, match="task"):
        db.task_arrays(99)
    with pytest.raises(ValueError, match="out of range"):
        db.embedded_string("text", 10**9)
    with pytest.raises(ValueError, match="embedding kind"):
        db.embeddings("nope")


def test_database_negative_index_is_value_error(built_small: Path) -> None:
    db = headwater.Database(built_small)
    with pytest.raises(ValueError, match="`table`: must be >= 0"):
        db.column(-1, 0)
    with pytest.raises(ValueError, match="`k`: must be >= 0"):
        db.task_arrays(-1)


def test_truncated_graph(built_small: Path, tmp_path: Path) -> None:
    db = _copy(built_small, tmp_path, "c")
    g = db / "graph.bin"
    size = g.stat().st_size
    for keep in (size - 1, size // 2, 100, 20, 0):
        with open(g, "r+b") as f:
            f.truncate(keep)
        _open_fails(db, FormatError, "graph.bin", "truncated")


def test_flipped_payload_byte(built_small: Path, tmp_path: Path) -> None:
    db = _copy(built_small, tmp_path, "c")
    f = db / "tables" / "0.bin"
    _flip(f, (_payload_start(f) + f.stat().st_size) // 2)
    from headwater import _native

    headwater.Database(db)  # opening reads no payload byte ...
    errors = _native.verify_database(db)["errors"]  # ... verify does
    assert len(errors) == 1, errors
    assert str(Path("tables") / "0.bin") in errors[0] and "checksum" in errors[0], errors


def test_flipped_header_bytes(built_small: Path, tmp_path: Path) -> None:
    """Any single flipped byte in a header is caught, naming the file."""
    src = built_small / "tasks" / "0.bin"
    end = _payload_start(src)
    db = _copy(built_small, tmp_path, "c")
    f = db / "tasks" / "0.bin"
    missed = []
    for at in range(end):
        shutil.copyfile(src, f)
        _flip(f, at)
        try:
            headwater.Database(db)
            missed.append(at)
        except FormatError as e:
            assert str(Path("tasks") / "0.bin") in str(e), (at, str(e))
    assert missed == [], f"header bytes whose corruption went unnoticed: {missed}"


@pytest.mark.parametrize(
    "at,needle",
    [
        (0, "bad magic"),
        (8, "format version"),
        (16, "header checksum"),
        (32, "header checksum"),
        (48, "header checksum"),
    ],
)
def test_flipped_header_field(built_small: Path, tmp_path: Path, at: int, needle: str) -> None:
    db = _copy(built_small, tmp_path, "c")
    _flip(db / "graph.bin", at)
    _open_fails(db, FormatError, "graph.bin", needle)


def _edit_meta(db: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    p = db / "metadata.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m, indent=2))


def test_metadata_future_version(built_small: Path, tmp_path: Path) -> None:
    db = _copy(built_small, tmp_path, "c")
    _edit_meta(db, lambda m: m.update(format_version=99))
    _open_fails(db, FormatError, "metadata.json", "format version 99")


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["tables"][0].update(num_rows=m["tables"][0]["num_rows"] + 1),
        lambda m: m.update(num_edges=m["num_edges"] - 1),
        lambda m: m["columns"][0]["stats"].update(mean=m["columns"][0]["stats"]["mean"] + 0.5),
        lambda m: m["tables"][0].update(name="renamed"),
    ],
    ids=["num_rows", "num_edges", "mean", "name"],
)
def test_metadata_edited(
    built_small: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]
) -> None:
    db = _copy(built_small, tmp_path, "c")
    _edit_meta(db, edit)
    _open_fails(db, FormatError, "metadata.json", "content hash")


def test_metadata_not_json(built_small: Path, tmp_path: Path) -> None:
    db = _copy(built_small, tmp_path, "c")
    (db / "metadata.json").write_text('{"format_version": 1, ')
    _open_fails(db, FormatError, "metadata.json", "not valid JSON")


def test_missing_files(built_small: Path, tmp_path: Path) -> None:
    db = _copy(built_small, tmp_path, "c")
    (db / "tasks" / "0.bin").unlink()
    _open_fails(db, FileNotFoundError, str(Path("tasks") / "0.bin"))
    db2 = _copy(built_small, tmp_path, "c2")
    (db2 / "metadata.json").unlink()
    _open_fails(db2, FormatError, "is not a headwater database", "metadata.json")
    _open_fails(tmp_path / "nowhere", FileNotFoundError, "nowhere")


def test_file_from_another_database(
    built_small: Path, tmp_path: Path, small_data: SmallData, duckdb_source: tuple[Path, Path]
) -> None:
    # Same schema, one changed value: every file has the same shape.
    _, schema = duckdb_source
    other_src = tmp_path / "other.duckdb"
    shutil.copyfile(duckdb_source[0], other_src)
    con = duckdb.connect(str(other_src))
    con.execute("UPDATE events SET amount = amount + 1 WHERE amount IS NOT NULL")
    con.close()
    other = build_into(tmp_path / "other", other_src, schema).path
    for rel in ("tables/0.bin", "graph.bin", "tasks/0.bin"):
        db = _copy(built_small, tmp_path, f"mix{rel.replace('/', '_')}")
        shutil.copyfile(other / rel, db / rel)
        if (other / rel).read_bytes() == (built_small / rel).read_bytes():
            headwater.Database(db)  # identical file: fine
            continue
        _open_fails(db, FormatError, str(Path(rel)), "does not belong to this snapshot")
    # Files swapped within one database.
    db = _copy(built_small, tmp_path, "swap")
    a, b = db / "tasks" / "0.bin", db / "tasks" / "1.bin"
    ta, tb = a.read_bytes(), b.read_bytes()
    a.write_bytes(tb)
    b.write_bytes(ta)
    _open_fails(db, FormatError, str(Path("tasks") / "0.bin"))
    # A file of the wrong kind.
    db = _copy(built_small, tmp_path, "kind")
    shutil.copyfile(db / "tables" / "0.bin", db / "graph.bin")
    _open_fails(db, FormatError, "graph.bin", "expected a Graph file")


# ----------------------------------------------------------------------------
# 8. Type inference
# ----------------------------------------------------------------------------


def _inference_table(n: int = 300) -> pa.Table:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    return pa.table(
        {
            "thing_id": pa.array(range(1, n + 1), pa.int64()),
            "owner_id": pa.array([i % 17 for i in range(n)], pa.int32()),
            "color": pa.array([["red", "green", "blue", None][i % 4] for i in range(n)]),
            "blurb": pa.array(
                [f"{words[i % 8]} {words[(i * 5) % 8]} thing number {i}" for i in range(n)]
            ),
            "code": pa.array([f"X{i:05d}Q" for i in range(n)]),
            "born": pa.array(
                [dt.date(2000, 1, 1) + dt.timedelta(days=i) for i in range(n)], pa.date32()
            ),
            "flag": pa.array([i % 3 == 0 for i in range(n)]),
            "score": pa.array([i * 0.25 for i in range(n)], pa.float64()),
            "count": pa.array([i % 11 for i in range(n)], pa.int64()),
        }
    )


EXPECTED_INFERENCE = {
    "thing_id": "identifier",
    "owner_id": "identifier",
    "color": "categorical",
    "blurb": "text",
    "code": "identifier",
    "born": "timestamp",
    "flag": "boolean",
    "score": "numerical",
    "count": "numerical",
}


def test_type_inference_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "src"
    d.mkdir()
    t = _inference_table()
    pq.write_table(t, d / "things.parquet")
    # No time column proposed: `born` stays a column (and a task) here.
    headwater.preprocess(d, tmp_path / "out", embedder="hash", progress=True, time_columns="none")
    err = capsys.readouterr().err
    b = open_built(tmp_path / "out")
    for col, st in EXPECTED_INFERENCE.items():
        assert b.stype("things", col) == st, col
        assert f"things.{col}: inferred {st} (" in err, (col, err)
    for cm in b.columns_of("things").values():
        assert cm["inferred"] is True
    check_column_round_trip(b, "things", "born", t.column("born"))
    check_column_round_trip(b, "things", "blurb", t.column("blurb"))
    # Default tasks cover the inferred target-able columns.
    assert {k["name"] for k in b.meta["tasks"]} == {
        "things.color",
        "things.born",
        "things.flag",
        "things.score",
        "things.count",
    }


def test_log_lines_never_share_a_line_with_the_progress_bar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The inference lines come while the `tables` bar is live: each is on a
    line of its own as a terminal shows it (the text after the last
    carriage return), never after the bar's text."""
    d = tmp_path / "src"
    d.mkdir()
    pq.write_table(_inference_table(), d / "things.parquet")
    headwater.preprocess(d, tmp_path / "out", embedder="hash", progress=True, time_columns="none")
    shown = [line.rsplit("\r", 1)[-1] for line in capsys.readouterr().err.split("\n")]
    inferred = [line for line in shown if ": inferred " in line]
    assert len(inferred) == len(EXPECTED_INFERENCE), shown
    for line in inferred:
        assert line.startswith("  things.") and "%|" not in line, line
    assert any(line.startswith("tables: 100%|") for line in shown), shown


def test_schema_override_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "src"
    d.mkdir()
    pq.write_table(_inference_table(), d / "things.parquet")
    sch = write_text(
        tmp_path / "s.toml",
        '[tables.things.columns]\ncode = "categorical"\nscore = "ignored"\nblurb = "text"\n'
        'count = "categorical"\nowner_id = "numerical"\n',
    )
    headwater.preprocess(d, tmp_path / "out", schema=sch, embedder="hash", progress=True)
    err = capsys.readouterr().err
    b = open_built(tmp_path / "out")
    assert b.stype("things", "code") == "categorical"
    assert b.stype("things", "score") == "ignored"
    assert b.stype("things", "count") == "categorical"
    assert b.stype("things", "owner_id") == "numerical"
    cols = b.columns_of("things")
    assert cols["code"]["inferred"] is False and cols["color"]["inferred"] is True
    assert len(cols["code"]["categories"]) == 300
    assert cols["count"]["categories"] == sorted(str(i) for i in range(11))
    for c in ("code", "score", "blurb", "count", "owner_id"):
        assert f"things.{c}: inferred" not in err
    assert "things.color: inferred categorical" in err
    unstored = {u["name"]: u for u in b.table("things")["unstored_columns"]}
    assert unstored["score"]["inferred"] is False and unstored["thing_id"]["inferred"] is True


def test_infer_stype_rules() -> None:
    from headwater.preprocessing.infer import infer_stype

    def inf(name: str, col: pa.Array, key: bool) -> str:
        # The statistics DuckDB computes in the pipeline, here from Arrow
        # (asked for string columns only).
        def stats() -> tuple[int, int, bool]:
            space = pc.any(pc.match_substring(col, " ")).as_py()
            return len(col) - col.null_count, pc.count_distinct(col).as_py(), bool(space)

        return infer_stype(name, col.type, key, stats)[0]

    assert inf("x", pa.array([1, 2]), True) == "identifier"
    assert inf("id", pa.array([1, 2]), False) == "identifier"
    assert inf("n", pa.array([1, 2]), False) == "numerical"
    assert inf("s", pa.array([None, None], pa.string()), False) == "ignored"
    assert inf("b", pa.array([b"x"], pa.binary()), False) == "ignored"
    assert inf("t", pa.array([dt.datetime(2020, 1, 1)]), False) == "timestamp"
    assert inf("c", pa.array(["a", "b", "a", "b"]), False) == "categorical"
    assert inf("e", pa.array([f"u{i}@x.org" for i in range(40)]), False) == "identifier"
    assert inf("d", pa.array([f"word {i}" for i in range(40)]), False) == "text"
