"""Shared fixtures for the preprocessing tests.

* ``small_data``: one small relational database (users, items, events) as
  in-memory Arrow tables, with NULLs, a boolean, a categorical, a text column,
  numerical columns, timestamps with microseconds and one dangling foreign-key
  value (``items.seller_id = 999``).
* ``make_relbench`` / ``make_duckdb`` / ``make_sqlite`` / ``make_files``: write
  that database as each kind of source under a given directory.
* ``build``: preprocess a source into a fresh directory (``embedder="hash"``)
  and open the result.
* ``tpch``: TPC-H SF0.01 generated with ``headwater.data.tpch.generate_tpch`` and
  preprocessed with ``headwater/data/tpch_schema.toml`` (session-scoped).

None of these fixtures is autouse, so they do not affect other test modules.
"""

from __future__ import annotations

import atexit
import datetime as dt
import importlib.resources
import importlib.util
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headwater

TPCH_SCHEMA = Path(str(importlib.resources.files("headwater") / "data" / "tpch_schema.toml"))

# ----------------------------------------------------------------------------
# The small relational database
# ----------------------------------------------------------------------------

N_USERS, N_ITEMS, N_EVENTS = 40, 25, 300
DANGLING_SELLER = 999
BASE_TIME = dt.datetime(2024, 1, 1, 8, 0, 0)
USER_HIDDEN_BY_RELBENCH = "age"  # remove_columns of the RelBench task
RELBENCH_TASK = "user_churn"


def _small_tables(seed: int = 7) -> dict[str, pa.Table]:
    rng = np.random.default_rng(seed)
    # users: ids ascending (SQLite `INTEGER PRIMARY KEY` is the rowid, so
    # `SELECT *` returns it in id order).
    user_ids = list(range(1, N_USERS + 1))
    countries = ["DE", "FR", "US", "JP"]
    users = pa.table(
        {
            "user_id": pa.array(user_ids, pa.int64()),
            "country": pa.array(
                [None if i % 11 == 5 else countries[i % 4] for i in range(N_USERS)], pa.string()
            ),
            "age": pa.array(
                [None if i % 9 == 2 else float(18 + (i * 7) % 50) + 0.5 for i in range(N_USERS)],
                pa.float64(),
            ),
            "is_active": pa.array(
                [None if i % 13 == 3 else bool(i % 3) for i in range(N_USERS)], pa.bool_()
            ),
            "signup": pa.array(
                [
                    None if i == 17 else BASE_TIME + dt.timedelta(days=i, microseconds=37 * i)
                    for i in range(N_USERS)
                ],
                pa.timestamp("us"),
            ),
        }
    )
    # items: seller_id references users, one NULL and one dangling value.
    cats = ["book", "toy", "food"]
    seller = [int(rng.integers(1, N_USERS + 1)) for _ in range(N_ITEMS)]
    seller[3] = None  # type: ignore[call-overload]
    seller[8] = DANGLING_SELLER
    items = pa.table(
        {
            "item_id": pa.array([100 + i for i in range(N_ITEMS)], pa.int64()),
            "seller_id": pa.array(seller, pa.int64()),
            "category": pa.array([cats[i % 3] for i in range(N_ITEMS)], pa.string()),
            "price": pa.array(
                [None if i == 4 else round(float(rng.uniform(1, 100)), 2) for i in range(N_ITEMS)],
                pa.float64(),
            ),
            "in_stock": pa.array(
                [None if i == 6 else bool(i % 2) for i in range(N_ITEMS)], pa.bool_()
            ),
        }
    )
    # events: ids shuffled (row order != key order), FKs to users and items.
    event_ids = rng.permutation(np.arange(1000, 1000 + N_EVENTS)).tolist()
    ev_user: list[int | None] = [int(x) for x in rng.integers(1, N_USERS + 1, N_EVENTS)]
    for i in (5, 50, 150):
        ev_user[i] = None
    ev_item = [100 + int(x) for x in rng.integers(0, N_ITEMS, N_EVENTS)]
    kinds = ["view", "click", "buy"]
    words = ["red", "green", "blue", "fast", "slow", "big", "small", "shiny"]
    events = pa.table(
        {
            "event_id": pa.array(event_ids, pa.int64()),
            "user_id": pa.array(ev_user, pa.int64()),
            "item_id": pa.array(ev_item, pa.int64()),
            "ts": pa.array(
                [
                    BASE_TIME
                    + dt.timedelta(
                        days=int(rng.integers(0, 120)),
                        seconds=int(rng.integers(0, 86400)),
                        microseconds=int(rng.integers(0, 1_000_000)),
                    )
                    for _ in range(N_EVENTS)
                ],
                pa.timestamp("us"),
            ),
            "amount": pa.array(
                [None if i % 17 == 0 else float(rng.normal(50, 20)) for i in range(N_EVENTS)],
                pa.float64(),
            ),
            "kind": pa.array([kinds[int(x)] for x in rng.integers(0, 3, N_EVENTS)], pa.string()),
            # > 256 distinct values with spaces: inferred as text.
            "note": pa.array(
                [
                    None if i % 23 == 1 else f"note {i} {words[i % 8]} {words[(i * 3) % 8]} item"
                    for i in range(N_EVENTS)
                ],
                pa.string(),
            ),
        }
    )
    return {"users": users, "items": items, "events": events}


@dataclass
class SmallData:
    tables: dict[str, pa.Table]
    labels: dict[str, pa.Table]  # RelBench task labels per split

    def values(self, table: str, column: str) -> list[Any]:
        return self.tables[table].column(column).to_pylist()


def _labels(tables: dict[str, pa.Table]) -> dict[str, pa.Table]:
    out = {}
    k = 0
    for split, n in (("train", 20), ("val", 6), ("test", 6)):
        uids: list[int] = []
        times, churn = [], []
        for _ in range(n):
            uids.append(1 + (k * 7) % N_USERS)
            times.append(BASE_TIME + dt.timedelta(days=30 + k))
            churn.append(k % 3 == 0)
            k += 1
        if split == "test":
            uids[-1] = 12345  # matches no user: dropped with a warning
        out[split] = pa.table(
            {
                "timestamp": pa.array(times, pa.timestamp("ns")),
                "user_id": pa.array(uids, pa.int64()),
                "churn": pa.array([int(c) for c in churn], pa.int64()),
            }
        )
    return out


@pytest.fixture(scope="session")
def small_data() -> SmallData:
    tables = _small_tables()
    return SmallData(tables=tables, labels=_labels(tables))


# Schema fragments for the sources that cannot declare everything themselves.
TIME_SCHEMA = """
[tables.users]
time_column = "signup"
[tables.events]
time_column = "ts"
"""

FULL_SCHEMA = """
[tables.users]
primary_key = "user_id"
time_column = "signup"
[tables.items]
primary_key = "item_id"
foreign_keys = { seller_id = "users" }
[tables.events]
primary_key = "event_id"
time_column = "ts"
foreign_keys = { user_id = "users", item_id = "items" }
"""


def write_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def relbench_manifest_module() -> Any:
    """``relbench.manifest``; loaded from its file when ``import relbench`` fails.

    ``relbench/__init__`` imports pandas, which need not be installed; the
    manifest module itself needs only PyYAML.
    """
    try:
        import relbench.manifest as m

        return m
    except ImportError:
        spec = importlib.util.find_spec("relbench")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("relbench is not installed")
        path = Path(next(iter(spec.submodule_search_locations))) / "manifest.py"
        name = "_relbench_manifest_standalone"
        if name in sys.modules:
            return sys.modules[name]
        mspec = importlib.util.spec_from_file_location(name, path)
        assert mspec is not None and mspec.loader is not None
        mod = importlib.util.module_from_spec(mspec)
        sys.modules[name] = mod
        mspec.loader.exec_module(mod)
        return mod


def relbench_metrics_module() -> Any:
    """``relbench/metrics.py`` loaded on its own (the package's ``__init__``
    needs pandas, which headwater does not; the module needs only sklearn)."""
    spec = importlib.util.find_spec("relbench")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("relbench is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "metrics.py"
    mspec = importlib.util.spec_from_file_location("relbench_metrics", path)
    assert mspec is not None and mspec.loader is not None
    mod = importlib.util.module_from_spec(mspec)
    mspec.loader.exec_module(mod)
    return mod


def _write_relbench(root: Path, data: SmallData, remove_columns: bool = True) -> Path:
    rb = relbench_manifest_module()
    root.mkdir(parents=True)
    (root / "db").mkdir()
    for name, t in data.tables.items():
        # RelBench (pandas) writes nanosecond timestamps.
        cols = [
            c.cast(pa.timestamp("ns")) if pa.types.is_timestamp(c.type) else c for c in t.columns
        ]
        pq.write_table(pa.table(cols, names=t.column_names), root / "db" / f"{name}.parquet")
    rb.DatasetManifest(
        name="small",
        val_timestamp="2024-03-01",
        test_timestamp="2024-04-01",
        description="headwater test database",
        tables={
            "users": rb.TableSpec(pkey="user_id", time_col="signup"),
            "items": rb.TableSpec(pkey="item_id", fkeys={"seller_id": "users"}),
            "events": rb.TableSpec(
                pkey="event_id", time_col="ts", fkeys={"user_id": "users", "item_id": "items"}
            ),
        },
    ).save(root / "manifest.yaml")
    tdir = root / "tasks" / RELBENCH_TASK
    rb.TaskManifest(
        name=RELBENCH_TASK,
        kind="forecast",
        task_type="binary_classification",
        description="will the user stay inactive for 30 days",
        entity_table="users",
        entity_col="user_id",
        target_col="churn",
        time_col="timestamp",
        timedelta="30 days",
        remove_columns=[["users", USER_HIDDEN_BY_RELBENCH]] if remove_columns else [],
        sql="SELECT timestamp, user_id, 0 AS churn FROM timestamps, users",
    ).save(tdir / "manifest.yaml")
    for split, t in data.labels.items():
        pq.write_table(t, tdir / f"{split}.parquet")
    return root


def _write_duckdb(path: Path, data: SmallData) -> Path:
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE users (user_id BIGINT PRIMARY KEY, country VARCHAR, age DOUBLE, "
        "is_active BOOLEAN, signup TIMESTAMP)"
    )
    # DuckDB enforces foreign keys, so items.seller_id (which holds a dangling
    # value) has no constraint; the schema file declares it.
    con.execute(
        "CREATE TABLE items (item_id BIGINT PRIMARY KEY, seller_id BIGINT, category VARCHAR, "
        "price DOUBLE, in_stock BOOLEAN)"
    )
    con.execute(
        "CREATE TABLE events (event_id BIGINT PRIMARY KEY, "
        "user_id BIGINT REFERENCES users(user_id), item_id BIGINT REFERENCES items(item_id), "
        "ts TIMESTAMP, amount DOUBLE, kind VARCHAR, note VARCHAR)"
    )
    for name in ("users", "items", "events"):
        arrow = data.tables[name]  # noqa: F841  (read by DuckDB's replacement scan)
        con.execute(f"INSERT INTO {name} SELECT * FROM arrow")
    con.close()
    return path


def _write_sqlite(path: Path, data: SmallData) -> Path:
    sq = sqlite3.connect(str(path))
    sq.execute(
        "CREATE TABLE users (user_id INTEGER PRIMARY KEY, country TEXT, age REAL, "
        "is_active BOOLEAN, signup TIMESTAMP)"
    )
    sq.execute(
        "CREATE TABLE items (item_id INTEGER PRIMARY KEY, "
        "seller_id INTEGER REFERENCES users(user_id), category TEXT, price REAL, in_stock BOOLEAN)"
    )
    # BIGINT PRIMARY KEY is not a rowid alias: rows keep insertion order.
    sq.execute(
        "CREATE TABLE events (event_id BIGINT PRIMARY KEY, "
        "user_id INTEGER REFERENCES users(user_id), item_id INTEGER REFERENCES items(item_id), "
        "ts TIMESTAMP, amount REAL, kind TEXT, note TEXT)"
    )

    def cell(v: Any) -> Any:
        if isinstance(v, dt.datetime):
            return v.isoformat(sep=" ")
        return v

    for name in ("users", "items", "events"):
        t = data.tables[name]
        rows = [tuple(cell(v) for v in r.values()) for r in t.to_pylist()]
        marks = ", ".join("?" * t.num_columns)
        sq.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    sq.commit()
    sq.close()
    return path


def _write_files(root: Path, data: SmallData) -> tuple[Path, Path]:
    """Parquet for users/events, CSV for items, plus a schema declaring the keys."""
    root.mkdir(parents=True)
    pq.write_table(data.tables["users"], root / "users.parquet")
    pq.write_table(data.tables["events"], root / "events.parquet")
    lines = ["item_id,seller_id,category,price,in_stock"]
    for r in data.tables["items"].to_pylist():
        cells = []
        for k in ("item_id", "seller_id", "category", "price", "in_stock"):
            v = r[k]
            cells.append(
                ""
                if v is None
                else (
                    "true"
                    if v is True
                    else "false"
                    if v is False
                    else repr(v)
                    if isinstance(v, float)
                    else str(v)
                )
            )
        lines.append(",".join(cells))
    (root / "items.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    schema = write_text(root.parent / f"{root.name}_schema.toml", FULL_SCHEMA)
    return root, schema


@pytest.fixture
def make_relbench(small_data: SmallData) -> Callable[..., Path]:
    def make(root: Path, remove_columns: bool = True) -> Path:
        return _write_relbench(root, small_data, remove_columns)

    return make


@pytest.fixture
def make_duckdb(small_data: SmallData) -> Callable[[Path], Path]:
    return lambda path: _write_duckdb(path, small_data)


@pytest.fixture
def make_sqlite(small_data: SmallData) -> Callable[[Path], Path]:
    return lambda path: _write_sqlite(path, small_data)


@pytest.fixture
def make_files(small_data: SmallData) -> Callable[[Path], tuple[Path, Path]]:
    return lambda root: _write_files(root, small_data)


@pytest.fixture
def duckdb_source(tmp_path: Path, make_duckdb: Callable[[Path], Path]) -> tuple[Path, Path]:
    """The small database as a DuckDB file plus the schema it needs (time columns, items FK)."""
    src = make_duckdb(tmp_path / "small.duckdb")
    schema = write_text(
        tmp_path / "duck_schema.toml",
        TIME_SCHEMA + '\n[tables.items]\nforeign_keys = { seller_id = "users" }\n',
    )
    return src, schema


# ----------------------------------------------------------------------------
# Building and opening databases
# ----------------------------------------------------------------------------


@dataclass
class Built:
    path: Path
    db: Any  # headwater.Database
    meta: dict[str, Any]

    def table(self, name: str) -> dict[str, Any]:
        return next(t for t in self.meta["tables"] if t["name"] == name)

    def table_idx(self, name: str) -> int:
        return int(self.table(name)["idx"])

    def columns_of(self, name: str) -> dict[str, dict[str, Any]]:
        """Stored columns of table ``name`` by column name."""
        t = self.table(name)
        return {self.meta["columns"][c]["name"]: self.meta["columns"][c] for c in t["columns"]}

    def column(self, table: str, column: str) -> tuple[np.ndarray, np.ndarray]:
        cm = self.columns_of(table)[column]
        return self.db.column(self.table_idx(table), cm["slot"])

    def decoded(self, table: str, column: str) -> list[Any]:
        """Values of a stored column decoded back to source values (None = null)."""
        cm = self.columns_of(table)[column]
        values, valid = self.column(table, column)
        return decode(self.db, cm, values, valid)

    def task(self, name: str) -> dict[str, Any]:
        return next(k for k in self.meta["tasks"] if k["name"] == name)

    def stype(self, table: str, column: str) -> str:
        t = self.table(table)
        for c in t["columns"]:
            if self.meta["columns"][c]["name"] == column:
                return str(self.meta["columns"][c]["stype"])
        for u in t["unstored_columns"]:
            if u["name"] == column:
                return str(u["stype"])
        raise KeyError(f"{table}.{column}")


def scale_of(stats: dict[str, Any]) -> float:
    """The std the writer z-scores with: population std, 1 when it is 0."""
    s = float(stats["std"])
    return s if s > 0 and np.isfinite(s) else 1.0


def decode(db: Any, cm: dict[str, Any], values: np.ndarray, valid: np.ndarray) -> list[Any]:
    st = cm["stype"]
    out: list[Any] = []
    for v, ok in zip(values.tolist(), valid.tolist(), strict=False):
        if not ok:
            out.append(None)
        elif st == "numerical":
            out.append(v * scale_of(cm["stats"]) + cm["stats"]["mean"])
        elif st == "boolean":
            out.append(bool(v))
        elif st == "timestamp":
            out.append(int(v))
        elif st == "categorical":
            out.append(cm["categories"][v - cm["cat_emb_start"]])
        elif st == "text":
            out.append(db.embedded_string("text", v))
        else:  # pragma: no cover
            raise AssertionError(st)
    return out


def open_built(path: Path) -> Built:
    import headwater

    db = headwater.Database(path)
    return Built(path=path, db=db, meta=json.loads(db.metadata_json()))


@pytest.fixture
def build(tmp_path: Path) -> Callable[..., Built]:
    """``build(source, schema=None, name=None, **kw)``: preprocess into tmp_path and open."""
    import headwater

    counter = iter(range(10_000))

    def run(source: Path, schema: Any = None, name: str | None = None, **kw: Any) -> Built:
        out = tmp_path / (name or f"db{next(counter)}")
        kw.setdefault("progress", False)
        headwater.preprocess(source, out, schema=schema, embedder="hash", **kw)
        return open_built(out)

    return run


# ----------------------------------------------------------------------------
# TPC-H SF0.01
# ----------------------------------------------------------------------------


@dataclass
class Tpch:
    source: Path
    built: Built


@pytest.fixture(scope="session")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> Tpch:
    import headwater
    from headwater.data.tpch import generate_tpch

    root = tmp_path_factory.mktemp("tpch")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWATER_CACHE_DIR", str(root / "cache"))
    try:
        src = generate_tpch(root / "tpch_sf001.duckdb", 0.01)
        out = root / "db"
        headwater.preprocess(src, out, schema=TPCH_SCHEMA, embedder="hash", progress=False)
    finally:
        mp.undo()
    return Tpch(source=Path(src), built=open_built(out))


# ----------------------------------------------------------------------------
# The small database with declared tasks (sampler and telemetry tests)
# ----------------------------------------------------------------------------

TASKS = """
[tables.items]
foreign_keys = { seller_id = "users" }

[[tasks]]
name = "event_amount"
anchor_table = "events"
target_stype = "numerical"
column = "amount"

[[tasks]]
name = "event_kind"
anchor_table = "events"
target_stype = "categorical"
column = "kind"

[[tasks]]
name = "user_country"
anchor_table = "users"
target_stype = "categorical"
column = "country"

[[tasks]]
name = "item_in_stock"
anchor_table = "items"
target_stype = "boolean"
column = "in_stock"

[[tasks]]
name = "user_signup_next_day"
anchor_table = "users"
target_stype = "timestamp"
query = "SELECT user_id, NULL, signup + INTERVAL 1 DAY FROM users WHERE signup IS NOT NULL"

[[tasks]]
name = "event_amount_x2"
anchor_table = "events"
target_stype = "numerical"
query = "SELECT event_id, NULL, amount * 2 FROM events WHERE amount IS NOT NULL"
"""
TASK_NAMES = [
    "event_amount",
    "event_kind",
    "user_country",
    "item_in_stock",
    "user_signup_next_day",
    "event_amount_x2",
]


@dataclass
class SmallDb:
    path: Path
    built: Built
    data: SmallData


def build_small_db(root: Path, data: SmallData) -> SmallDb:
    """The small database (DuckDB source + TIME_SCHEMA + TASKS) preprocessed into ``root/db``."""
    import headwater

    src = _write_duckdb(root / "small.duckdb", data)
    schema = write_text(root / "schema.toml", TIME_SCHEMA + TASKS)
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWATER_CACHE_DIR", str(root / "cache"))
    try:
        headwater.preprocess(src, root / "db", schema=schema, embedder="hash", progress=False)
    finally:
        mp.undo()
    built = open_built(root / "db")
    assert [k["name"] for k in built.meta["tasks"]] == TASK_NAMES
    return SmallDb(path=root / "db", built=built, data=data)


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Samplers appended here are shut down after the test, pass or fail."""
    made: list[Any] = []
    yield made
    for s in made:
        s.shutdown()


def drop_cached_pages(root: Path) -> None:
    """Evict the (clean, unmapped) page-cache pages of every file under
    ``root``: each synced, then ``posix_fadvise(DONTNEED)`` (no root needed)."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def build_db_from_sql(
    root: Path, name: str, sql: list[str], schema: str, expected_tasks: list[str]
) -> Path:
    """Run `sql` in a fresh DuckDB file, preprocess it with `schema` (hash
    embedder, cache under `root`), check the task list, return the database."""
    con = duckdb.connect(str(root / f"{name}.duckdb"))
    for q in sql:
        con.execute(q)
    con.close()
    (root / "schema.toml").write_text(schema, encoding="utf-8")
    mp = pytest.MonkeyPatch()
    mp.setenv("HEADWATER_CACHE_DIR", str(root / "cache"))
    try:
        headwater.preprocess(
            root / f"{name}.duckdb",
            root / "db",
            schema=root / "schema.toml",
            embedder="hash",
            progress=False,
        )
    finally:
        mp.undo()
    meta = json.loads(headwater.Database(root / "db").metadata_json())
    assert [k["name"] for k in meta["tasks"]] == expected_tasks
    return root / "db"


def tiny_model(sampler: Any, seed: int) -> tuple[Any, Any, Any, Any]:
    """A one-layer d32 model for ``sampler``'s database, ``(cfg, params, col,
    cat)`` with the embedding tables as float16 arrays; the sampler is shut
    down."""
    import jax
    import jax.numpy as jnp

    from headwater.model import transformer as M

    try:
        col = jnp.asarray(sampler.column_embeddings(), jnp.float16)
        cat = jnp.asarray(sampler.categorical_embeddings(), jnp.float16)
        meta = sampler.database_metadata()
    finally:
        sampler.shutdown()
    cfg = M.ModelConfig(max_categories=M.max_categories(meta), num_layers=1, d_model=32)
    params = M.init_params(jax.random.key(seed), cfg, int(col.shape[1]))
    return cfg, params, col, cat


# ----------------------------------------------------------------------------
# Subprocesses that use JAX and W&B (hook, train and diag tests)
# ----------------------------------------------------------------------------


_JAX_CACHE: list[str] = []

#: XLA's CPU backend spends most of a tiny model's run compiling: LLVM
#: optimises each of the train step's ~400 fused kernels (14 s of a 35 s
#: 20-step `headwater train`, measured). The subprocesses tests start run
#: tiny models for a few steps, where optimised code buys nothing: they
#: compile without LLVM's optimisations (6 s). What a step computes is the
#: same program. This process keeps XLA's defaults: its tests run hundreds
#: of steps in process (overfitting a batch took 50 s unoptimised, 27 s
#: optimised). So do runs of many steps over a warm compilation cache
#: (``child_env(optimised=True)``: the diag matrix, 15 runs of 40-100 steps
#: mostly of one shape, took 264 s optimised against ~400 s unoptimised,
#: a step 0.1 against 0.3 s).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def jax_cache_dir() -> str:
    """This test session's persistent JAX compilation cache (made on first
    use, removed at exit). Every run of a tiny model compiles the same train
    and eval steps (10-30 s each on a loaded 2-core host); the first run of
    the session compiles them, later runs load them. The cache does not
    change what a run computes, and each process's jit cache still counts
    its own compilations (``train_step_compiles``)."""
    if not _JAX_CACHE:
        shared = os.environ.get("HEADWATER_TEST_JAX_CACHE")
        if shared:
            # Set by scripts/test.sh for both of its phases and every xdist
            # worker: one cache, compiled once (the script removes it).
            _JAX_CACHE.append(shared)
        else:
            path = tempfile.mkdtemp(prefix="headwater-jax-cache-")
            atexit.register(shutil.rmtree, path, ignore_errors=True)
            _JAX_CACHE.append(path)
    return _JAX_CACHE[0]


def child_env(
    tmp_path: Path, short_tmp: Path | None = None, *, optimised: bool = False
) -> dict[str, str]:
    """The environment of every subprocess: CPU JAX (sharing the session's
    compilation cache, :func:`jax_cache_dir`; unoptimised code unless
    ``optimised``, see :data:`TEST_XLA_FLAGS`), offline and silent W&B
    with every directory under ``tmp_path``; ``TMPDIR`` (where wandb-core
    puts its Unix sockets, whose paths must stay under 108 bytes) is the
    short pytest directory ``short_tmp``."""
    env = dict(os.environ)
    env.update(
        {
            "JAX_PLATFORMS": "cpu",
            "JAX_COMPILATION_CACHE_DIR": jax_cache_dir(),
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_DIR": str(tmp_path / "wandb"),
            "WANDB_CONFIG_DIR": str(tmp_path / "wandb_config"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb_cache"),
            "WANDB_DATA_DIR": str(tmp_path / "wandb_data"),
            "WANDB_ARTIFACT_DIR": str(tmp_path / "wandb_artifacts"),
            "HEADWATER_CACHE_DIR": str(tmp_path / "cache"),
            "OPENBLAS_NUM_THREADS": "1",
            "XLA_FLAGS": "" if optimised else TEST_XLA_FLAGS,
            # Every compilation is cached, not only those over a second: a
            # run's ~50 small ones take 1.5 s to compile again.
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        }
    )
    for d in ("wandb", "wandb_config", "wandb_cache", "wandb_data", "wandb_artifacts"):
        (tmp_path / d).mkdir(exist_ok=True)
    if short_tmp is not None and len(str(short_tmp)) <= 60:
        env["TMPDIR"] = str(short_tmp)
    return env


READ_WANDB = Path(__file__).resolve().parent / "read_wandb.py"


def train_batches(sampler: Any, n: int) -> list[dict[str, np.ndarray]]:
    """The next ``n`` train batches of ``sampler``, copied (to compare later)."""
    return [{k: np.array(v) for k, v in sampler.next_train_batch().items()} for _ in range(n)]


def tiny_train_config(db: Path, steps: int, train: str = "val_every = 3", extra: str = "") -> str:
    """A TOML config for a fast `headwater train` run on ``db``: ``train`` adds
    lines to ``[train]``, ``extra`` adds sections verbatim. The final
    evaluation scores 64 seeds per task unless ``train`` says otherwise (a
    test of it needs its passes, not 2 × 5 × 256 forwards at B = 4)."""
    if "eval_final_max_seeds" not in train:
        train += "\neval_final_max_seeds = 64"
    return f"""
[database]
path = "{db}"

[sampler]
default_batch_size = 4
default_sequence_length = 64
num_threads = 1

[model]
d_model = 32
num_layers = 1
num_heads = 2

[train]
steps = {steps}
val_batches = 1
log_every = 1
warmup_steps = 1
{train}

[logging]
prometheus_port = 0
""" + extra



def read_wandb_run(run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    """The offline W&B run in ``run_dir`` (its ``run-*.wandb`` file) read back
    with ``read_wandb.py``: ``{"history": [...], "metrics": {...}}``."""
    (wandb_file,) = Path(run_dir).glob("run-*.wandb")
    read = subprocess.run(
        [sys.executable, str(READ_WANDB), str(wandb_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert read.returncode == 0, read.stderr[-3000:]
    return json.loads(read.stdout)


# ----------------------------------------------------------------------------
# A real Prometheus server (telemetry and diag tests)
# ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


def binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        pytest.fail(
            f"`{name}` is not installed; the telemetry tests need it (apt-get install prometheus)"
        )
    return path


def stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a process this test started, by its PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def running_prometheus(
    tmp_path: Path,
    targets: list[str],
    interval: str = "1s",
    rules: Path | None = None,
    file_sd: str | None = None,
) -> Iterator[str]:
    """A real Prometheus (Debian's package) on a free loopback port scraping
    ``targets``, or the targets it discovers from the ``file_sd`` glob
    (re-read every second); yields its base URL and stops it by PID."""
    port = free_port()
    # Indented for its place under the job (after the dedent below).
    discovery = f"static_configs:\n      - targets: {json.dumps(targets)}"
    if file_sd is not None:
        discovery = (
            f"file_sd_configs:\n      - files: {json.dumps([file_sd])}\n"
            "        refresh_interval: 1s"
        )
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        textwrap.dedent(
            f"""\
            global:
              scrape_interval: {interval}
              scrape_timeout: {interval}
              evaluation_interval: {interval}
            rule_files: {json.dumps([str(rules)] if rules else [])}
            scrape_configs:
              - job_name: headwater
                scrape_interval: {interval}
                @DISCOVERY@
            """
        ).replace("@DISCOVERY@", discovery),
        encoding="utf-8",
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            binary("prometheus"),
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Prometheus never became ready"
            time.sleep(0.1)
        yield base
    finally:
        stop(proc)
        log.close()


def prom_query(base: str, q: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


# ----------------------------------------------------------------------------
# Which tests must run alone
# ----------------------------------------------------------------------------

#: Modules whose tests judge the host as they run (verdicts and diagnostic
#: bands under load, stall and Ctrl-C timing, watchdog and peer timeouts, the
#: page cache and memory cgroups): marked ``serial``. scripts/test.sh runs
#: the rest on two xdist workers, then these alone.
SERIAL_MODULES = frozenset(
    {
        "test_checkpoint",
        "test_cluster",
        "test_context_diag",
        "test_dead_rank",
        "test_diag",
        "test_large",
        "test_memory_diag",
        "test_memory_limits",
        "test_out_of_core",
        "test_sampler",
        "test_stalls",
        "test_threads",
        "test_watchdog",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
