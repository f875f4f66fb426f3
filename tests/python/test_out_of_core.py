"""Preprocessing in bounded memory and the sampler's page-cache knob.

* DuckDB's memory limit far below the data size (a SQL task that must spill),
  with output byte-identical to a run with the default budget;
* ``memory_limit`` parsing and the CLI flag;
* ``page_cache``: every mode samples the same batches, and ``mlock`` past
  ``RLIMIT_MEMLOCK`` fails naming the key;
* ``slow``: a generated database several times larger than a 256 MiB budget
  preprocessed in a child process whose peak private memory (RssAnon) stays
  under the budget plus the interpreter's (``pytest -m slow``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import drop_cached_pages

import headwater
from headwater.preprocessing import columns, memory, pipeline, primary_keys, tasks

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden_v1"

TASK = """
[tables.parent]
primary_key = "id"

[tables.child]
primary_key = "id"
foreign_keys = { parent_id = "parent" }
time_column = "ts"

[[tasks]]
name = "parent_spend"
anchor_table = "parent"
target_stype = "numerical"
query = "SELECT parent_id, max(ts), sum(CAST(amount * 10 AS BIGINT)) FROM child GROUP BY parent_id ORDER BY parent_id"
"""


def _source(path: Path, parents: int, children: int, wide: int = 0) -> Path:
    """parent(id, grp, x, t) and child(id, parent_id, amount, note, flag, ts,
    v0..v{wide-1}), deterministic."""
    con = duckdb.connect(str(path))
    con.execute(
        f"""CREATE TABLE parent AS SELECT i AS id, 'g' || (i % 7) AS grp, (i * 0.37) % 11 AS x,
        TIMESTAMP '2020-01-01' + to_seconds(i * 97) AS t FROM range({parents}) r(i)"""
    )
    extra = "".join(f", ((i * {k + 3}) % 1009) * 0.5 AS v{k}" for k in range(wide))
    con.execute(
        f"""CREATE TABLE child AS SELECT i AS id, (i * 7919) % {parents} AS parent_id,
        ((i * 13) % 1000) / 10.0 AS amount, 'note ' || (i % 300) AS note, i % 3 = 0 AS flag,
        TIMESTAMP '2020-01-01' + to_seconds(i * 61) AS ts{extra} FROM range({children}) r(i)"""
    )
    con.close()
    return path


def _hashes(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def test_duckdb_limit_far_below_the_data_spills_and_changes_no_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _source(tmp_path / "src.duckdb", parents=20_000, children=1_000_000)
    schema = tmp_path / "schema.toml"
    schema.write_text(TASK)
    settings: list[tuple[Any, ...]] = []
    configure = memory._configure_duckdb

    def spy(con: duckdb.DuckDBPyConnection, budget: int, temp: Path) -> None:
        configure(con, budget, temp)
        row = con.execute(
            "SELECT current_setting('memory_limit'), current_setting('temp_directory')"
        ).fetchone()
        assert row is not None
        settings.append(row)

    monkeypatch.setattr(pipeline, "_configure_duckdb", spy)  # where preprocess() looks it up
    # Uncompressed: 8 bytes per number/timestamp, ~9 per note, 1 per flag.
    raw_mib = (1_000_000 * (8 * 4 + 10) + 20_000 * 34) / 2**20
    # The tiny run also spills every column array, row times and foreign
    # keys included, to file-backed maps (the default run: none at this size).
    spilled: list[bool] = []
    column_array = memory.column_array

    def spy_array(n: int, dtype: Any) -> np.ndarray:
        a = column_array(n, dtype)
        if n:
            spilled.append(isinstance(a, np.memmap))
        return a

    monkeypatch.setattr(memory, "column_array", spy_array)
    monkeypatch.setattr(memory, "SPILL_MIN_ROWS", 1)
    tiny = headwater.preprocess(src, tmp_path / "tiny", schema=schema, embedder="hash", progress=False, memory_limit="48MiB")
    tiny_spilled = list(spilled)
    spilled.clear()
    monkeypatch.setattr(memory, "SPILL_MIN_ROWS", 1 << 20)
    default = headwater.preprocess(src, tmp_path / "default", schema=schema, embedder="hash", progress=False)
    assert len(tiny_spilled) > 10 and all(tiny_spilled), tiny_spilled
    assert spilled and not any(spilled), spilled
    # DuckDB got a third of 48 MiB, far below the data, spilling beside the output.
    assert settings[0][0] == "16.0 MiB", settings
    assert raw_mib > 2.5 * 16, raw_mib
    assert settings[0][1] == str(tmp_path / "tiny.duckdb_tmp")
    assert not (tmp_path / "tiny.duckdb_tmp").exists()  # the spill directory is removed
    assert _hashes(tiny) == _hashes(default)
    meta = json.loads(headwater.Database(tiny).metadata_json())
    assert meta["num_rows"] == 1_020_000
    assert [t["num_seeds"] for t in meta["tasks"]] == [20_000]


@pytest.mark.parametrize("order", ["ascending", "shuffled"])
def test_key_index_matches_arrow_index_in(order: str, tmp_path: Path) -> None:
    """Foreign keys and task anchors are resolved by binary search over the
    primary key (ascending keys in place, other orders through a spilled
    sorted copy): every row equals Arrow's hash lookup, nulls and values
    that match no key give -1 and are counted apart."""
    rng = np.random.default_rng(7)
    n = (1 << 20) + 3  # spilled when shuffled (SPILL_MIN_ROWS)
    keys = np.sort(rng.choice(1 << 40, size=n, replace=False)).astype(np.int64) - (1 << 39)
    if order == "shuffled":
        rng.shuffle(keys)
    pk = pa.array(keys)
    token = memory._SPILL_DIR.set(tmp_path)
    try:
        index = primary_keys._KeyIndex(pk)
    finally:
        memory._SPILL_DIR.reset(token)
    assert index.sorted is not None
    assert (index.order is None) == (order == "ascending")
    assert isinstance(index.sorted, np.memmap) == (order == "shuffled")
    hits = rng.choice(keys, size=5000)
    misses = rng.integers(-(1 << 41), 1 << 41, size=5000)
    values = np.concatenate([hits, misses, [keys.min() - 1, keys.max() + 1]])
    nulls = rng.random(len(values)) < 0.1
    col = pa.array(values.astype(np.int64), mask=nulls)
    for c in (col, col.cast(pa.decimal128(20, 0))):
        rows, unmatched = index.rows(c, "here")
        want = pc.index_in(col, value_set=pk)
        np.testing.assert_array_equal(rows, pc.fill_null(want, -1).to_numpy(zero_copy_only=False))
        assert unmatched == want.null_count - col.null_count > 0
    # Narrower integer types are cast to the key's type first.
    small = pa.array([int(keys[0]) & 0x7FFF, None], type=pa.int64()).cast(pa.int16())
    assert index.rows(small, "here")[0][1] == -1
    with pytest.raises(headwater.SchemaError, match="here: string values cannot match primary key of type int64"):
        index.rows(pa.array(["x"]), "here")
    # Non-integer keys go through Arrow's index_in; an empty key matches nothing.
    text = primary_keys._KeyIndex(pa.array(["b", "a", "c"]))
    assert text.sorted is None
    rows, unmatched = text.rows(pa.array(["c", None, "z", "a"]), "here")
    assert rows.tolist() == [2, -1, -1, 1] and unmatched == 1
    empty = primary_keys._KeyIndex(pa.array([], type=pa.int64()))
    rows, unmatched = empty.rows(pa.array([1, None, 3]), "here")
    assert rows.tolist() == [-1, -1, -1] and unmatched == 2


@pytest.mark.parametrize("order", ["ascending", "shuffled", "shuffled-duckdb-sort"])
def test_key_index_streamed_from_the_source(order: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's primary keys are streamed out of DuckDB into a spilled array,
    never held whole in private memory; a sort larger than the run's share
    for it is DuckDB's (NumPy's argsort is not called). Every path resolves
    exactly as Arrow's hash lookup over the whole key column does."""
    rng = np.random.default_rng(11)
    n = (1 << 20) + 5
    keys = np.sort(rng.choice(1 << 40, size=n, replace=False)).astype(np.int64)
    if order != "ascending":
        rng.shuffle(keys)
    con = duckdb.connect()
    con.register("k_src", pa.table({"id": keys}))
    con.execute("CREATE TABLE t AS SELECT id FROM k_src")
    con.unregister("k_src")
    con.execute("SET memory_limit='64MiB'")
    con.execute(f"SET temp_directory='{tmp_path / 'duck'}'")
    if order == "shuffled-duckdb-sort":
        def no_argsort(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("argsort called for a sort past the budget")

        monkeypatch.setattr(np, "argsort", no_argsort)
    spill = memory._SPILL_DIR.set(tmp_path)
    budget = memory._SORT_BUDGET.set(1 << 20 if order == "shuffled-duckdb-sort" else None)
    try:
        index = primary_keys._KeyIndex.stream(con, "t", "id", n, "table `t`: primary key `id`")
    finally:
        memory._SORT_BUDGET.reset(budget)
        memory._SPILL_DIR.reset(spill)
    monkeypatch.undo()
    assert index.arrow is None and isinstance(index.sorted, np.memmap)
    assert (index.order is None) == (order == "ascending")
    if index.order is not None:
        assert isinstance(index.order, np.memmap)
        np.testing.assert_array_equal(index.sorted, np.sort(keys))
        np.testing.assert_array_equal(keys[index.order], index.sorted)
    values = np.concatenate([rng.choice(keys, size=4000), rng.integers(0, 1 << 41, size=4000)])
    nulls = rng.random(len(values)) < 0.1
    col = pa.array(values, mask=nulls)
    rows, unmatched = index.rows(col, "here")
    want = pc.index_in(col, value_set=pa.array(keys))
    np.testing.assert_array_equal(rows, pc.fill_null(want, -1).to_numpy(zero_copy_only=False))
    assert unmatched == want.null_count - col.null_count > 0
    # A null key is named with its count.
    con.execute("CREATE TABLE bad AS SELECT * FROM (VALUES (1), (NULL), (3), (NULL)) v(id)")
    with pytest.raises(headwater.SchemaError, match=r"table `bad`: primary key `id` has 2 null value\(s\)"):
        primary_keys._KeyIndex.stream(con, "bad", "id", 4, "table `bad`: primary key `id`")


def test_string_keys_indexed_by_hash_and_confirmed_by_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """String primary keys are streamed as their hashes (sorted like integer
    keys) beside the keys themselves in spilled buffers: no key column in
    private memory. Lookups equal Arrow's hash lookup over the whole column;
    a value sharing a key's hash is not that key; keys sharing a hash fall
    back to the exact lookup, and repeated keys are still named."""
    monkeypatch.setattr(memory, "CHUNK_ROWS", 5000)
    monkeypatch.setattr(memory, "SPILL_MIN_ROWS", 1000)
    rng = np.random.default_rng(5)
    n = 60_000
    keys = np.array([f"k{i}-é{i % 97}" for i in range(n - 1)] + [""], dtype=object)
    rng.shuffle(keys)
    con = duckdb.connect()
    con.register("k_src", pa.table({"id": pa.array(keys, pa.string())}))
    con.execute("CREATE TABLE s AS SELECT id FROM k_src")
    con.unregister("k_src")
    spill = memory._SPILL_DIR.set(tmp_path)
    try:
        index = primary_keys._KeyIndex.stream(con, "s", "id", n, "table `s`: primary key `id`")
    finally:
        memory._SPILL_DIR.reset(spill)
    assert index.arrow is None and index.values is not None
    assert isinstance(index.sorted, np.memmap) and index.sorted.dtype == np.uint64
    values = np.concatenate([rng.choice(keys, size=3000), [f"miss{i}" for i in range(3000)], [""]])
    nulls = rng.random(len(values)) < 0.1
    for typ in (pa.string(), pa.large_string()):
        col = pa.array(list(values), typ, mask=nulls)
        rows, unmatched = index.rows(col, "here")
        want = pc.index_in(col.cast(pa.string()), value_set=pa.array(keys, pa.string()))
        np.testing.assert_array_equal(rows, pc.fill_null(want, -1).to_numpy(zero_copy_only=False))
        assert unmatched == want.null_count - col.null_count > 0

    # A weak hash (the string's length) makes values share hashes with keys.
    monkeypatch.setattr(primary_keys, "KEY_HASH", "length({})")
    con.execute("CREATE TABLE d AS SELECT * FROM (VALUES ('a'), ('bb'), ('ccc')) v(id)")
    weak = primary_keys._KeyIndex.stream(con, "d", "id", 3, "d")
    assert weak.values is not None
    rows, unmatched = weak.rows(pa.array(["x", "bb", "yyy", None, "ccc"]), "here")
    assert rows.tolist() == [-1, 1, -1, -1, 2] and unmatched == 2
    # Keys sharing a hash: the exact lookup; repeated keys: named.
    src = SimpleNamespace(con=con)
    con.execute("CREATE TABLE c AS SELECT * FROM (VALUES ('a'), ('b'), ('cc')) v(id)")
    con.execute("CREATE TABLE r AS SELECT * FROM (VALUES ('a'), ('bb'), ('a')) v(id)")
    plans = [SimpleNamespace(name=t, primary_key="id") for t in ("c", "r")]
    with pytest.raises(headwater.SchemaError, match=r"table `r`: primary key `id` has 1 duplicated value\(s\), e.g. 'a' appears 2 times"):
        primary_keys._primary_keys(src, plans, {"c": 3, "r": 3})  # type: ignore[arg-type]
    exact = primary_keys._primary_keys(src, plans[:1], {"c": 3})["c"]  # type: ignore[arg-type]
    assert exact.values is None and exact.sorted is None
    assert exact.rows(pa.array(["b", "x", "cc"]), "here")[0].tolist() == [1, -1, 2]


@pytest.mark.parametrize(
    ("key", "miss", "fk_type"),
    [
        ("DATE '2001-02-03' + i::INTEGER", "DATE '1800-01-01' + i::INTEGER", None),
        ("TIMESTAMP '2001-02-03 04:05:06.789' + to_microseconds(i * 1001)", "TIMESTAMP '1800-01-01' + to_seconds(i)", None),
        ("TIMESTAMPTZ '2001-02-03 04:05:06+00' + to_seconds(i)", "TIMESTAMPTZ '1800-01-01 00:00:00+00' + to_seconds(i)", None),
        ("(i * 1.5 - 7000)::DECIMAL(18, 3)", "(i + 0.25)::DECIMAL(18, 3) + 1000000", "DECIMAL(12, 2)"),
        ("md5(i::VARCHAR)::UUID", "md5('miss' || i)::UUID", None),
        ("unhex(md5(i::VARCHAR))::BLOB", "unhex(md5('miss' || i))::BLOB", None),
        ("(i * 0.37 - 100)::DOUBLE", "(i * 0.37 + 0.001)::DOUBLE + 1e6", None),
        ("(i / 7)::FLOAT", "(i / 7)::FLOAT + 1e5", "DOUBLE"),
    ],
    ids=["date", "timestamp", "timestamptz", "decimal", "uuid", "blob", "double", "float-as-double"],
)
def test_other_keys_indexed_by_the_hash_of_their_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, miss: str, fk_type: str | None
) -> None:
    """Keys that are not integers are streamed as the hash of
    their DuckDB text beside the texts (no key column in private memory), and
    every lookup equals Arrow's exact lookup over the whole key column: hits,
    misses, nulls, and referencing values of another type cast to the key's."""
    monkeypatch.setattr(memory, "CHUNK_ROWS", 997)
    monkeypatch.setattr(memory, "SPILL_MIN_ROWS", 100)
    n = 5000
    con = duckdb.connect()
    con.execute(f"CREATE TABLE s AS SELECT {key} AS id FROM range({n}) t(i) ORDER BY hash(i)")
    cast = f"::{fk_type}" if fk_type else ""
    con.execute(
        f"CREATE TABLE f AS SELECT * FROM ("
        f"SELECT id{cast} AS v FROM s USING SAMPLE 1500 ROWS "
        f"UNION ALL SELECT ({miss}){cast} FROM range(700) t(i) "
        f"UNION ALL SELECT NULL FROM range(50)) ORDER BY hash(v)"
    )
    spill = memory._SPILL_DIR.set(tmp_path)
    try:
        index = primary_keys._KeyIndex.stream(con, "s", "id", n, "table `s`: primary key `id`")
    finally:
        memory._SPILL_DIR.reset(spill)
    assert index.arrow is None and index.values is not None and isinstance(index.sorted, np.memmap)
    keys = con.execute("SELECT id FROM s").to_arrow_table().column(0).combine_chunks()
    exact = primary_keys._KeyIndex(keys)
    assert exact.sorted is None  # Arrow's index_in over the whole column
    col = con.execute("SELECT v FROM f").to_arrow_table().column(0).combine_chunks()
    rows, unmatched = index.rows(col, "here")
    want, want_unmatched = exact.rows(col, "here")
    np.testing.assert_array_equal(rows, want)
    assert unmatched == want_unmatched == 700
    assert np.count_nonzero(rows >= 0) == 1500


def test_float_keys_by_text_match_as_arrow_does() -> None:
    """A float key's text is one per value, as Arrow's exact lookup sees
    values: ``-0.0`` is not ``0.0``, and NaN matches NaN."""
    con = duckdb.connect()
    con.execute("CREATE TABLE s AS SELECT * FROM (VALUES (0.0::DOUBLE), (1.5), ('nan'::DOUBLE), (-2.25), (0.1)) v(id)")
    index = primary_keys._KeyIndex.stream(con, "s", "id", 5, "s")
    assert index.values is not None
    col = pa.array([-0.0, 0.0, 1.5, float("nan"), 7.0, None, 0.1, 0.30000000000000004 - 0.2])
    rows, unmatched = index.rows(col, "here")
    exact = primary_keys._KeyIndex(con.execute("SELECT id FROM s").to_arrow_table().column(0).combine_chunks())
    want, want_unmatched = exact.rows(col, "here")
    assert rows.tolist() == want.tolist() and unmatched == want_unmatched
    assert rows[1:4].tolist() == [0, 1, 2] and rows[6] == 4


def test_duplicate_keys_counted_on_the_sorted_keys_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Duplicated integer keys are found on the sorted keys chunk by chunk
    (runs that straddle a chunk boundary counted once), matching a count
    over the whole array."""
    monkeypatch.setattr(memory, "CHUNK_ROWS", 7)
    rng = np.random.default_rng(3)
    for trial in range(200):
        keys = np.sort(rng.integers(0, 60, size=int(rng.integers(0, 80))))
        values, counts = np.unique(keys, return_counts=True)
        dup = values[counts > 1]
        want = (len(dup), int(dup[0]), int(counts[counts > 1][0])) if len(dup) else (0, None, 0)
        assert primary_keys._duplicates(keys) == want, (trial, keys.tolist())


TEXT_SCHEMA = """
[tables.t]
primary_key = "id"
[tables.t.columns]
body = "text"
[tables.u]
primary_key = "id"
foreign_keys = { t_id = "t" }
[tables.u.columns]
body = "text"
"""


def test_text_columns_streamed_in_chunks_write_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text columns are read chunk by chunk, each chunk's dictionary interned
    by the writer: values shared between chunks and tables, nulls, empty and
    multi-byte strings give the same database whatever the chunk size."""
    src = tmp_path / "src.duckdb"
    con = duckdb.connect(str(src))
    con.execute(
        """CREATE TABLE t AS SELECT i AS id, CASE WHEN i % 11 = 0 THEN NULL WHEN i % 13 = 0 THEN ''
        ELSE 'tèxt ' || ((i * 7919) % 997) END AS body, (i * 0.37) % 11 AS x FROM range(5000) r(i)"""
    )
    con.execute(
        """CREATE TABLE u AS SELECT i AS id, i % 5000 AS t_id, CASE WHEN i % 7 = 0 THEN NULL
        ELSE 'tèxt ' || ((i * 31) % 1500) END AS body FROM range(3000) r(i)"""
    )
    con.close()
    schema = tmp_path / "schema.toml"
    schema.write_text(TEXT_SCHEMA)
    whole = pipeline.preprocess(src, tmp_path / "whole", schema, embedder="hash", progress=False)
    monkeypatch.setattr(memory, "CHUNK_ROWS", 37)
    chunked = pipeline.preprocess(src, tmp_path / "chunked", schema, embedder="hash", progress=False)
    assert _hashes(chunked) == _hashes(whole)
    meta = json.loads(headwater.Database(chunked).metadata_json())
    # Distinct non-null values over both tables: 'tèxt 0'..'tèxt 1499' and ''.
    assert meta["num_text_embeddings"] == 1501
    writer = headwater._native.DatabaseWriter(str(tmp_path / "w"), "{}", "hash", 8)
    with pytest.raises(headwater.HeadwaterError, match="intern_texts: no table begun"):
        writer.intern_texts(np.zeros(1, np.int64), np.zeros(0, np.uint8))
    with pytest.raises(ValueError, match="c: a text column takes ids from intern_texts, not a dictionary"):
        writer.add_column(
            "c", "text", "VARCHAR", False, np.zeros(1, np.uint32), np.ones(1, np.uint8),
            (np.zeros(2, np.int64), np.zeros(0, np.uint8)),
        )


def test_memory_limit_sizes_and_errors() -> None:
    assert memory.parse_size("512MiB") == 512 << 20
    assert memory.parse_size("2GiB") == 2 << 30
    assert memory.parse_size("1.5G") == 3 << 29
    assert memory.parse_size("300MB") == 300 * 10**6
    assert memory.parse_size(1 << 30) == 1 << 30
    with pytest.raises(ValueError, match="memory_limit '12 parsecs'"):
        memory.parse_size("12 parsecs")
    with pytest.raises(ValueError, match="memory_limit '1MiB': at least 48MiB"):
        memory.parse_size("1MiB")


def test_cli_memory_limit_flag(tmp_path: Path) -> None:
    src = _source(tmp_path / "src.duckdb", parents=50, children=500)
    r = subprocess.run(
        [sys.executable, "-m", "headwater.cli", "preprocess", str(src), str(tmp_path / "out"),
         "--embedder", "hash", "--memory-limit", "64MiB"],
        capture_output=True, text=True, env={**os.environ, "HEADWATER_CACHE_DIR": str(tmp_path / "c")},
    )
    assert r.returncode == 0, r.stderr
    # One line per phase with its throughput and peak RSS.
    for phase in ("keys", "tables", "tasks", "embeddings", "graph and write"):
        assert f"phase {phase}: " in r.stderr and "/s), peak RSS " in r.stderr, r.stderr
    assert "MiB (private " in r.stderr, r.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "headwater.cli", "preprocess", str(src), str(tmp_path / "out2"),
         "--embedder", "hash", "--memory-limit", "lots"],
        capture_output=True, text=True, env={**os.environ, "HEADWATER_CACHE_DIR": str(tmp_path / "c")},
    )
    assert bad.returncode != 0 and "memory_limit 'lots'" in bad.stderr


def _batches(**kw: Any) -> list[dict[str, np.ndarray]]:
    with headwater.Sampler(GOLDEN, default_batch_size=4, default_sequence_length=64, seed=3, **kw) as s:
        return [s.next_train_batch() for _ in range(3)]


def test_every_page_cache_mode_samples_the_same_batches() -> None:
    want = _batches()
    for mode in ("lazy", "willneed", "populate", "mlock"):
        got = _batches(page_cache=mode)
        for a, b in zip(got, want, strict=True):
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), mode
    with pytest.raises(headwater.ConfigError, match="`page_cache`"):
        headwater.Sampler(GOLDEN, page_cache="eager")


def _maps_of(under: Path) -> tuple[int, int, int]:
    """(mappings, of them advised huge pages (``hg`` in ``VmFlags``),
    ``FilePmdMapped`` KiB) of this process's maps of files under ``under``."""
    maps = advised = pmd = 0
    mine = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):
            mine = len(head) >= 6 and head[5].startswith(str(under))
            maps += mine
        elif mine and head[0] == "FilePmdMapped:":
            pmd += int(head[1])
        elif mine and head[0] == "VmFlags:":
            advised += "hg" in head[1:]
    return maps, advised, pmd


def _kernel_maps_file_huge_pages(tmp: Path) -> bool:
    """Does a file here, read through a ``MADV_HUGEPAGE`` mapping with a cold
    page cache, get 2 MiB mappings (transparent huge pages on, a filesystem
    with large folios)?"""
    probe = tmp / "probe"
    probe.mkdir()
    (probe / "f").write_bytes(os.urandom(8 << 20))
    drop_cached_pages(probe)
    with open(probe / "f", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        m.madvise(mmap.MADV_HUGEPAGE)
        sum(m[i] for i in range(0, len(m), 4096))
        return _maps_of(probe)[2] > 0


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this platform")
def test_eager_page_cache_modes_read_huge_pages_lazy_does_not(tmp_path: Path) -> None:
    """``populate`` advises huge pages on every map before anything is read:
    a database whose pages are not cached enters the page cache in 2 MiB
    folios, mapped by 2 MiB entries; ``lazy`` advises none."""
    if not _kernel_maps_file_huge_pages(tmp_path):
        pytest.skip("this kernel or filesystem maps no file by 2 MiB pages (THP off or no large folios)")
    src = _source(tmp_path / "src.duckdb", parents=2_000, children=300_000, wide=8)
    db = pipeline.preprocess(src, tmp_path / "db", embedder="hash", progress=False, time_columns="none")
    assert max(p.stat().st_size for p in db.rglob("*.bin")) >= 8 << 20
    # `lazy` advises nothing (its faults read 4 KiB pages, or what the
    # device's read-ahead makes them).
    with headwater.Sampler(db, page_cache="lazy") as s:
        s.next_train_batch()
        maps, advised, _ = _maps_of(db)
        assert maps > 0 and advised == 0
    del s
    gc.collect()  # unmaps the files, so their pages can be dropped
    assert _maps_of(db)[0] == 0
    drop_cached_pages(db)
    with headwater.Sampler(db, page_cache="populate") as s:
        maps, advised, pmd = _maps_of(db)
        assert advised == maps > 0 and pmd >= 2048
        s.next_train_batch()


def test_bench_runs_with_the_page_cache_mode_it_is_given() -> None:
    cmd = [sys.executable, "-m", "headwater.cli", "bench", str(GOLDEN), "--batch-size", "4",
           "--seq-len", "64", "--threads", "1", "--steps", "3", "--warmup", "1"]
    r = subprocess.run([*cmd, "--page-cache", "populate", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["conditions"]["page_cache"] == "populate" and out["runs"][0]["batches_per_s"] > 0
    bad = subprocess.run([*cmd, "--page-cache", "eager"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--page-cache" in bad.stderr
    with pytest.raises(headwater.ConfigError, match=r"`page_cache`.*\"eager\""):
        headwater._native.bench_sampler(str(GOLDEN), 1, 2, 1, 4, 64, page_cache="eager")


def test_bench_process_scaling_counts_the_batches_of_one_window() -> None:
    """``--process-scaling``: one-thread processes count the batches they
    finish inside one shared wall-clock window; the figure is their sum over
    one process alone, printed beside the thread scaling."""
    from headwater.bench import format_bench

    t = time.time()
    start, stop = t + 1.0, t + 1.5
    r = headwater._native.bench_sampler(str(GOLDEN), 1, 0, 1, 4, 64, window=(start, stop))
    assert time.time() >= stop
    assert r["seconds"] == pytest.approx(0.5) and r["batches"] > 0
    assert r["batches_per_s"] == pytest.approx(r["batches"] / 0.5)
    with pytest.raises(ValueError, match=r"`window`: opening and 1 warm-up batches ended .* after the window's start"):
        headwater._native.bench_sampler(str(GOLDEN), 1, 0, 1, 4, 64, window=(t - 5, t + 1))
    with pytest.raises(ValueError, match=r"`window`: stop .* is not after start"):
        headwater._native.bench_sampler(str(GOLDEN), 1, 0, 1, 4, 64, window=(t + 1, t + 1))

    cmd = [sys.executable, "-m", "headwater.cli", "bench", str(GOLDEN), "--batch-size", "4", "--seq-len", "64",
           "--threads", "1,2", "--steps", "200", "--warmup", "2", "--process-scaling", "--rounds", "2", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    ps = out["process_scaling"]
    assert ps["processes"] == 2 and ps["rounds"] == 2 and len(ps["per_process_batches_per_s"]) == 2
    assert min(ps["per_process_batches_per_s"]) > 0 and ps["alone_batches_per_s"] > 0
    assert ps["together_batches_per_s"] == pytest.approx(sum(ps["per_process_batches_per_s"]))
    assert ps["ratio"] == pytest.approx(ps["together_batches_per_s"] / ps["alone_batches_per_s"])
    reach = out["scaling"]["2/1"] / ps["ratio"]
    assert f"2 one-thread processes at once: {ps['ratio']:.2f}x" in format_bench(out)
    assert f"2 threads reach {reach:.0%} of it" in format_bench(out)
    # A process that fails is named with its error, not read as 0 batches/s.
    from headwater import bench

    with pytest.raises(RuntimeError, match=r"bench process \d+ exited with 1: .*no-such-db"):
        bench._window_runs(2, {"db_path": "/no-such-db", "warmup": 1}, 0.1, 0.5)


MLOCK_CHILD = """
import resource, sys
import headwater
resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
try:
    headwater.Sampler(sys.argv[1], page_cache="mlock")
except headwater.ConfigError as e:
    print("ConfigError:", e)
"""


def test_mlock_past_rlimit_memlock_is_an_error_naming_the_key(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", MLOCK_CHILD, str(GOLDEN)]
    if os.geteuid() == 0:
        # Root bypasses RLIMIT_MEMLOCK through CAP_IPC_LOCK: drop it.
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop CAP_IPC_LOCK")
        cmd = [setpriv, "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ConfigError:" in r.stdout and "`page_cache`" in r.stdout, r.stdout
    assert "RLIMIT_MEMLOCK is 0 bytes" in r.stdout, r.stdout


def _peak_rss_of(cmd: list[str], env: dict[str, str]) -> tuple[int, int, str]:
    """Run ``cmd``; its peak private memory (RssAnon) and peak RSS (VmHWM),
    in bytes, polled every 20 ms, and its stderr. VmRSS also counts the
    mapped pages of the output the writer reads back to verify it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    anon = hwm = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        anon = max(anon, int(line.split()[1]) * 1024)
                    elif line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    _, err = proc.communicate()
    assert proc.returncode == 0, err[-4000:]
    return anon, hwm, err


@pytest.mark.slow
def test_preprocess_a_database_larger_than_the_budget_within_it(tmp_path: Path) -> None:
    budget = 256 << 20
    # 1.5 M wide child rows: 45 numerical columns, twice the budget.
    src = _source(tmp_path / "big.duckdb", parents=200_000, children=1_500_000, wide=40)
    env = {**os.environ, "HEADWATER_CACHE_DIR": str(tmp_path / "cache")}
    # Uncompressed: 8 bytes per number/timestamp, ~9 per note, 1 per flag.
    raw = 1_500_000 * (8 * 45 + 10) + 200_000 * 34
    assert raw > 2 * budget, raw
    # The interpreter with everything preprocessing imports, doing nothing.
    base, base_hwm, _ = _peak_rss_of(
        [sys.executable, "-c", "import duckdb, numpy, pyarrow, pyarrow.compute, headwater.preprocessing, headwater._native"],
        env,
    )
    peak, hwm, err = _peak_rss_of(
        [sys.executable, "-m", "headwater.cli", "preprocess", str(src), str(tmp_path / "out"),
         "--embedder", "hash", "--memory-limit", "256MiB"],
        env,
    )
    print(err[-3000:], f"private {peak >> 20} MiB (interpreter {base >> 20}), VmHWM {hwm >> 20} MiB (interpreter {base_hwm >> 20})")
    assert peak < base + budget, f"private peak {peak >> 20} MiB, interpreter {base >> 20} MiB + budget {budget >> 20} MiB"
    assert json.loads(headwater.Database(tmp_path / "out").metadata_json())["num_rows"] == 1_700_000


def test_spool_spills_what_it_is_given_and_opens_nothing_when_empty(tmp_path: Path) -> None:
    """A task result's spool: appended chunks come back whole and in order,
    mapped from a file in the spill directory (not private memory); a spool
    that stays empty (a task without a split column) opens no file."""
    rng = np.random.default_rng(3)
    chunks = [rng.integers(0, 1 << 30, size=n).astype(np.uint32) for n in (5, 0, 70_000, 1)]
    spill = tmp_path / "spill"
    token = memory._SPILL_DIR.set(spill)
    try:
        full, empty = memory._Spool(np.uint32), memory._Spool(np.uint8)
        for c in chunks:
            full.append(c)
            empty.append(np.empty(0, np.uint8))
        opened = {p.name for p in Path("/proc/self/fd").iterdir() if "spool" in _fd_target(p)}
    finally:
        memory._SPILL_DIR.reset(token)
    assert len(opened) == 1, opened
    got = full.array()
    assert isinstance(got, np.memmap)
    np.testing.assert_array_equal(got, np.concatenate(chunks))
    out = empty.array()
    assert out.dtype == np.uint8 and len(out) == 0


def _fd_target(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:
        return ""


def test_categorical_task_target_streamed_as_the_whole_column_encodes(tmp_path: Path) -> None:
    """A categorical task target is encoded chunk by chunk (codes by first
    appearance, spilled, renumbered in place at the end): the same codes and
    dictionary as encoding the whole column at once, for the valid rows."""
    rng = np.random.default_rng(9)
    names = ["zeta", "alpha", "émile", "Beta", "", "m"]
    n = 5000
    keys = pa.array(np.arange(n, dtype=np.int64))
    index = primary_keys._KeyIndex(keys)
    labels = [None if rng.random() < 0.1 else names[int(rng.integers(0, len(names)))] for _ in range(n)]
    labels[:40] = ["m"] * 40  # the first chunk sees one category only
    token = memory._SPILL_DIR.set(tmp_path)
    try:
        res = tasks._TaskResult(index, "kind", "categorical", with_splits=False)
        for a in range(0, n, 700):
            b = min(a + 700, n)
            batch = pa.record_batch(
                [pa.array(np.arange(a, b, dtype=np.int64)), pa.nulls(b - a, pa.int64()), pa.array(labels[a:b], pa.string())],
                names=["k", "o", "t"],
            )
            res.add(batch)
        values, valid, categories = res.target()
    finally:
        memory._SPILL_DIR.reset(token)
    want_values, want_valid, want_categories = columns.encode_column("categorical", pa.array(labels, pa.string()), "w")
    assert categories == want_categories == sorted(set(names), key=lambda s: s.encode())
    np.testing.assert_array_equal(valid, want_valid)
    ok = np.asarray(valid).astype(bool)
    np.testing.assert_array_equal(np.asarray(values)[ok], want_values[ok])
    res = tasks._TaskResult(index, "kind", "categorical", with_splits=False)
    with pytest.raises(headwater.SchemaError, match="task `kind` target: cannot encode struct"):
        res.add(pa.record_batch([keys[:1], pa.nulls(1, pa.int64()), pa.array([{"x": 1}])], names=["k", "o", "t"]))
