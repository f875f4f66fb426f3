"""The Python ``Sampler`` (``headwater._native.Sampler``).

Batch layout against the table of the batch layout (docs/sampling.md), zero-copy hand-over to NumPy,
cell values against the stored database, determinism, splits and rank shards,
shutdown and lifecycle, faults (producer panic, RSS cap, Ctrl-C, fork),
argument checking, metadata accessors and task picking.

Most tests use a small database built from DuckDB (users, items, events; see
``conftest.py``) with declared tasks: three cell tasks, one boolean cell task
and two SQL ("virtual" target) tasks. The tests that need a slow producer use
the session TPC-H fixture with large batches and one worker thread.
"""

from __future__ import annotations

import calendar
import datetime as dt
import gc
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TASK_NAMES, Built, SmallData, SmallDb, Tpch, build_small_db

import headwater
from headwater import _native

# Untyped on purpose: the tests pass bad argument types, call private hooks
# (`_last_batch_pointers`) and must not lag the stubs.
N: Any = _native

# ----------------------------------------------------------------------------
# The contract: the batch layout (docs/sampling.md), transcribed by hand from the seed document.
# ----------------------------------------------------------------------------

LAYOUT: dict[str, tuple[tuple[str, ...], type[np.generic]]] = {
    "semantic_types": (("B", "S"), np.int8),
    "column_ids": (("B", "S"), np.int32),
    "seq_row_ids": (("B", "S"), np.uint16),
    "numeric_values": (("B", "S"), np.float32),
    "timestamp_values": (("B", "S", "15"), np.float32),
    "bool_values": (("B", "S"), np.uint8),
    "categorical_embed_ids": (("B", "S"), np.uint32),
    "text_embed_ids": (("B", "S"), np.uint32),
    "is_null": (("B", "S"), np.uint8),
    "is_target": (("B", "S"), np.uint8),
    "is_padding": (("B", "S"), np.uint8),
    "fk_adj": (("B", "R", "R"), np.uint8),
    "col_perm": (("B", "S"), np.uint16),
    "out_perm": (("B", "S"), np.uint16),
    "in_perm": (("B", "S"), np.uint16),
    "text_batch_embeddings": (("U", "D"), np.float16),
    "target_stype": (("1",), np.uint8),
    "task_idx": (("1",), np.uint32),
    "cat_emb_start": (("1",), np.uint32),
    "cat_emb_count": (("1",), np.uint32),
}
BS_KEYS = [k for k, (shape, _) in LAYOUT.items() if shape == ("B", "S")]


def test_native_tensor_list_is_the_contract() -> None:
    """The one Rust list (`batch_tensors()`, behind `BATCH_KEYS` and the
    binding's dict) against the hand transcription of the batch layout (docs/sampling.md)."""
    got = {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in N.batch_tensors()}
    want = {k: (shape, np.dtype(dt).name) for k, (shape, dt) in LAYOUT.items()}
    extra = {
        "fingerprint": (("1",), "uint64"),
        "seq_valid": (("B",), "uint8"),
        "segment_ids": (("B", "S"), "uint16"),
        "target_pos": (("B", "K"), "uint16"),
        "target_count": (("B",), "uint8"),
        "segment_seeds": (("B", "K"), "uint32"),
        "db_idx": (("1",), "uint32"),
        "seq_task_idx": (("B",), "uint32"),
        "seq_target_stype": (("B",), "uint8"),
        "seq_cat_emb_start": (("B",), "uint32"),
        "seq_cat_emb_count": (("B",), "uint32"),
        "seq_db_idx": (("B",), "uint32"),
        "is_masked": (("B", "S"), "uint8"),
        "mask_pos": (("B", "M"), "uint16"),
        "mask_count": (("B",), "uint16"),
        "mask_cat_start": (("B", "M"), "uint32"),
        "mask_cat_count": (("B", "M"), "uint32"),
    }
    assert got == {**want, **extra}
    assert list(got) == [*N.BATCH_KEYS, *extra] == [*LAYOUT, *extra]
CODES = {"numerical": 0, "boolean": 1, "timestamp": 2, "categorical": 3, "text": 4}
DAY_US = 86_400_000_000

# ----------------------------------------------------------------------------
# The small database with declared tasks
# ----------------------------------------------------------------------------

T_AMOUNT, T_KIND, T_COUNTRY, T_STOCK, T_SIGNUP1, T_AMOUNT2 = range(6)
SMALL = {"default_batch_size": 16, "default_sequence_length": 48}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, small_data: SmallData) -> SmallDb:
    return build_small_db(tmp_path_factory.mktemp("sampler_small"), small_data)


def sampler(db: SmallDb | Path, **kw: Any) -> Any:
    path = db.path if isinstance(db, SmallDb) else db
    for k, v in SMALL.items():
        kw.setdefault(k, v)
    return N.Sampler(path, **kw)


def one_hot(k: int, n: int = len(TASK_NAMES)) -> list[float]:
    w = [0.0] * n
    w[k] = 1.0
    return w


# ----------------------------------------------------------------------------
# Reference timestamp encoding (docs/format.md: 7 sin/cos pairs + z-scored epoch)
# ----------------------------------------------------------------------------


def encode_timestamp(us: int, mean: float, std: float) -> np.ndarray:
    days, rem = divmod(us, DAY_US)
    sec = rem / 1e6  # seconds into the day
    d = dt.date(1970, 1, 1) + dt.timedelta(days=days)
    leap = calendar.isleap(d.year)
    fracs = [
        (sec % 60.0) / 60.0,  # second of minute
        ((sec // 60.0) % 60.0) / 60.0,  # minute of hour
        (sec // 3600.0) / 24.0,  # hour of day
        d.weekday() / 7.0,  # day of week, Monday = 0
        (d.day - 1) / calendar.monthrange(d.year, d.month)[1],  # day of month
        (d.month - 1) / 12.0,  # month of year
        (d.timetuple().tm_yday - 1) / (366.0 if leap else 365.0),  # day of year
    ]
    out = np.empty(15, dtype=np.float64)
    for i, f in enumerate(fracs):
        out[2 * i] = math.sin(2 * math.pi * f)
        out[2 * i + 1] = math.cos(2 * math.pi * f)
    out[14] = (us - mean) / std
    return out.astype(np.float32)


def micros(v: dt.datetime) -> int:
    return (v - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def test_reference_encoder_on_known_dates() -> None:
    # 2024-01-01 08:00:00 is a Monday: every pair at angle 0 except the hour (8/24).
    t = micros(dt.datetime(2024, 1, 1, 8, 0, 0))
    e = encode_timestamp(t, float(t) - 2.0, 4.0)
    want = [0, 1, 0, 1, math.sin(2 * math.pi / 3), -0.5, 0, 1, 0, 1, 0, 1, 0, 1, 0.5]
    np.testing.assert_allclose(e, want, atol=1e-7)
    # 2024-12-31 23:59:30 (a Tuesday, leap year): half a minute, last day of year.
    t = micros(dt.datetime(2024, 12, 31, 23, 59, 30))
    e = encode_timestamp(t, 0.0, 1.0).astype(np.float64)
    assert abs(e[0]) < 1e-6 and abs(e[1] + 1) < 1e-6  # 30 s = half a turn
    angle = math.atan2(e[12], e[13]) % (2 * math.pi)
    assert math.isclose(angle, 2 * math.pi * 365 / 366, rel_tol=1e-6)
    assert math.isclose(math.atan2(e[6], e[7]), 2 * math.pi / 7, rel_tol=1e-6)  # Tuesday


# ----------------------------------------------------------------------------
# An oracle: which stored row can a sequence row be?
# ----------------------------------------------------------------------------


class Oracle:
    """Stored values of every column, to match batch cells against rows."""

    def __init__(self, built: Built) -> None:
        self.built = built
        self.meta = built.meta
        ts = self.meta["timestamp_stats"]
        self.ts_mean, self.ts_std = float(ts["mean_us"]), float(ts["std_us"])
        self.text_emb = built.db.embeddings("text")
        self.text_ids: dict[bytes, set[int]] = {}
        for g, row in enumerate(self.text_emb):
            self.text_ids.setdefault(row.tobytes(), set()).add(g)
        self.cols: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
        for c in self.meta["columns"]:
            if c["slot"] is None:
                continue
            values, valid = built.db.column(c["table"], c["slot"])
            enc = None
            if c["stype"] == "timestamp":
                enc = self.encode_all(values, valid)
            self.cols[c["idx"]] = (values, valid.astype(bool), enc)
        self.table_cols = {
            t["idx"]: sorted(t["columns"], key=lambda c: self.meta["columns"][c]["slot"])
            for t in self.meta["tables"]
        }
        self.fk_pairs = {
            (t["idx"], f["references"]) for t in self.meta["tables"] for f in t["foreign_keys"]
        }
        self.tasks = [built.db.task_arrays(k["idx"]) for k in self.meta["tasks"]]

    def encode_all(self, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
        out = np.zeros((len(values), 15), dtype=np.float32)
        for i, (v, ok) in enumerate(zip(values.tolist(), valid.tolist(), strict=True)):
            if ok:
                out[i] = encode_timestamp(int(v), self.ts_mean, self.ts_std)
        return out

    def ts_close(self, enc: np.ndarray, cell: np.ndarray) -> np.ndarray:
        return np.all(np.abs(enc - cell) <= 2e-6 * (1.0 + np.abs(cell)), axis=-1)

    def text_globals(self, batch: dict[str, np.ndarray], local: int) -> set[int]:
        return self.text_ids.get(batch["text_batch_embeddings"][local].tobytes(), set())

    def cell_matches(
        self,
        batch: dict[str, np.ndarray],
        b: int,
        p: int,
        stype: str,
        values: np.ndarray,
        valid: np.ndarray,
        enc: np.ndarray | None = None,
    ) -> np.ndarray:
        """Which of `values` (with validity `valid`) cell (b, p) can hold."""
        if batch["is_null"][b, p]:
            return ~valid
        if stype == "numerical":
            hit = values == batch["numeric_values"][b, p]
        elif stype == "boolean":
            hit = values == batch["bool_values"][b, p]
        elif stype == "categorical":
            hit = values == batch["categorical_embed_ids"][b, p]
        elif stype == "text":
            gs = self.text_globals(batch, int(batch["text_embed_ids"][b, p]))
            hit = np.isin(values, np.array(sorted(gs), dtype=np.int64))
        elif stype == "timestamp":
            assert enc is not None
            hit = self.ts_close(enc, batch["timestamp_values"][b, p])
        else:  # pragma: no cover
            raise AssertionError(stype)
        return np.asarray(valid & hit)

    def target_hit(
        self, batch: dict[str, np.ndarray], b: int, k: int, c: int, i: int, where: str
    ) -> bool:
        """Does the target cell of sequence `b` hold seed `i`'s target (anchor
        row `c` of task `k`)?"""
        task = self.meta["tasks"][k]
        tcol = self.meta["columns"][task["target_column"]]
        arr = self.tasks[k]
        if tcol["slot"] is None:
            t_values, t_valid = arr["target"][i : i + 1], arr["target_valid"][i : i + 1]
            enc = None
            if task["target_stype"] == "timestamp":
                enc = self.encode_all(t_values, t_valid)
            hit = self.cell_matches(
                batch, b, 0, task["target_stype"], t_values, t_valid.astype(bool), enc
            )[0]
        else:
            values, valid, enc = self.cols[tcol["idx"]]
            hit = self.cell_matches(
                batch,
                b,
                0,
                task["target_stype"],
                values[c : c + 1],
                valid[c : c + 1],
                None if enc is None else enc[c : c + 1],
            )[0]
            # The task file agrees with the stored cell.
            assert arr["target"][i] == values[c], where
        return bool(hit)

    def check_fk_adj(
        self, adj: np.ndarray, n_rows: int, row_tables: list[int], where: str
    ) -> None:
        """fk_adj: edges only among this sequence's rows, child -> parent tables,
        and every row but the seed has one."""
        assert not adj[n_rows:].any() and not adj[:, n_rows:].any(), where
        for i, j in zip(*np.nonzero(adj), strict=True):
            assert (row_tables[i], row_tables[j]) in self.fk_pairs, (where, i, j)
        for i in range(1, n_rows):
            assert adj[i].any() or adj[:, i].any(), f"{where}: row {i} has no FK edge"

    def check_sequence(self, batch: dict[str, np.ndarray], b: int) -> tuple[int, np.ndarray]:
        """Check sequence `b` cell by cell; return (anchor table, candidate anchor rows)."""
        meta = self.meta
        k = int(batch["task_idx"][0])
        task = meta["tasks"][k]
        tcol = meta["columns"][task["target_column"]]
        where = f"sequence {b} (task {task['name']})"
        pad = batch["is_padding"][b].astype(bool)
        n = int((~pad).sum())
        assert n > 0 and not pad[:n].any(), f"{where}: padding is not a suffix"
        rows = batch["seq_row_ids"][b, :n].astype(np.int64)
        n_rows = int(rows.max()) + 1
        assert rows[0] == 0 and np.all(np.diff(rows) >= 0), f"{where}: rows not contiguous"
        assert set(rows.tolist()) == set(range(n_rows)), f"{where}: a row index is skipped"
        # The target cell leads the seed row.
        assert batch["is_target"][b].tolist() == [1] + [0] * (len(pad) - 1), where
        assert batch["column_ids"][b, 0] == tcol["idx"], where
        assert batch["semantic_types"][b, 0] == CODES[task["target_stype"]], where
        virtual = tcol["slot"] is None
        row_tables = []
        anchor_mask = np.zeros(0, dtype=bool)
        for r in range(n_rows):
            pos = np.nonzero(rows == r)[0]
            if r == 0:
                pos = pos[1:]
            cols = batch["column_ids"][b, pos].tolist()
            assert cols, f"{where}: row {r} has no cells"
            table = meta["columns"][cols[0]]["table"]
            row_tables.append(table)
            want = list(self.table_cols[table])
            if r == 0:
                assert table == task["anchor_table"], f"{where}: seed row of the wrong table"
                if not virtual:
                    want.remove(tcol["idx"])
            # Every cell of a row, in column order (BFS adds whole rows only, and S
            # here is never shorter than a seed row).
            assert cols == want, f"{where}: row {r} holds columns {cols}, expected {want}"
            mask = np.ones(meta["tables"][table]["num_rows"], dtype=bool)
            for p, c in zip(pos.tolist(), cols, strict=True):
                cm = meta["columns"][c]
                assert batch["semantic_types"][b, p] == CODES[cm["stype"]], (where, p)
                values, valid, enc = self.cols[c]
                mask &= self.cell_matches(batch, b, p, cm["stype"], values, valid, enc)
            assert mask.any(), f"{where}: row {r} matches no stored row of table {table}"
            if r == 0:
                anchor_mask = mask
        self.check_fk_adj(batch["fk_adj"][b], n_rows, row_tables, where)
        # The target value is that of the anchor row (and the row is a seed).
        offset = meta["tables"][task["anchor_table"]]["row_offset"]
        arr = self.tasks[k]
        seeds = {int(a): i for i, a in enumerate(arr["anchor_row"].tolist())}
        cand = np.zeros_like(anchor_mask)
        for c in np.nonzero(anchor_mask)[0].tolist():
            i = seeds.get(offset + c)
            if i is None:
                continue
            hit = self.target_hit(batch, b, k, c, i, where)
            cand[c] = bool(hit)
        assert cand.any(), f"{where}: the target cell is not the anchor row's target"
        return int(task["anchor_table"]), cand

    def check_batch(self, batch: dict[str, np.ndarray]) -> list[tuple[int, np.ndarray]]:
        out = [self.check_sequence(batch, b) for b in range(batch["is_padding"].shape[0])]
        # Batch-local text ids: 0..U-1, one per distinct stored text value.
        text = (batch["semantic_types"] == 4) & (batch["is_null"] == 0) & (batch["is_padding"] == 0)
        local = np.unique(batch["text_embed_ids"][text])
        u = batch["text_batch_embeddings"].shape[0]
        assert local.tolist() == list(range(u))
        rows = {batch["text_batch_embeddings"][i].tobytes() for i in range(u)}
        assert len(rows) == u, "a text value is gathered twice"
        assert all(self.text_globals(batch, i) for i in range(u))
        # Categorical cells sit in their column's block.
        cat = (batch["semantic_types"] == 3) & (batch["is_null"] == 0) & (batch["is_padding"] == 0)
        for c, v in zip(batch["column_ids"][cat].tolist(), batch["categorical_embed_ids"][cat], strict=True):
            cm = self.meta["columns"][c]
            assert cm["cat_emb_start"] <= v < cm["cat_emb_start"] + cm["cat_emb_count"], (c, v)
        return out


@pytest.fixture(scope="module")
def oracle(small: SmallDb) -> Oracle:
    return Oracle(small.built)


# ----------------------------------------------------------------------------
# 1. Layout
# ----------------------------------------------------------------------------


def check_layout(batch: dict[str, np.ndarray], b: int, s: int, d: int) -> None:
    """Shapes, dtypes and invariants of the 20 tensors (key set: a test of its own)."""
    assert set(LAYOUT) <= set(batch), f"missing keys: {set(LAYOUT) - set(batch)}"
    pad = batch["is_padding"].astype(bool)
    real = ~pad
    r_min = max((len(np.unique(batch["seq_row_ids"][i][real[i]])) for i in range(b)), default=0)
    r = batch["fk_adj"].shape[1]
    assert r >= r_min
    text = (batch["semantic_types"] == 4) & (batch["is_null"] == 0) & real
    u = len(np.unique(batch["text_embed_ids"][text]))
    dims = {"B": b, "S": s, "R": r, "U": u, "D": d, "15": 15, "1": 1}
    for key, (shape, dtype) in LAYOUT.items():
        a = batch[key]
        assert isinstance(a, np.ndarray), key
        assert a.dtype == np.dtype(dtype), f"{key}: {a.dtype} != {np.dtype(dtype)}"
        assert a.shape == tuple(dims[x] for x in shape), f"{key}: {a.shape} vs {shape}"
        assert a.flags.c_contiguous, key
    # Flags are 0/1; padding cells are zero everywhere else.
    for key in ("bool_values", "is_null", "is_target", "is_padding", "fk_adj"):
        assert set(np.unique(batch[key]).tolist()) <= {0, 1}, key
    for key in BS_KEYS:
        if key not in ("is_padding", "col_perm", "out_perm", "in_perm"):
            assert not batch[key][pad].any(), f"{key} is not zero on padding"
    assert not batch["timestamp_values"][pad].any()
    # The three attention permutations: permutations of 0..S-1, padding last in place.
    for key in ("col_perm", "out_perm", "in_perm"):
        perm = batch[key].astype(np.int64)
        assert (np.sort(perm, axis=1) == np.arange(s)).all(), f"{key} is not a permutation"
        for i in range(b):
            n = int(real[i].sum())
            assert perm[i, n:].tolist() == list(range(n, s)), key
            if key == "col_perm":
                cols = batch["column_ids"][i, perm[i, :n]]
                assert np.all(np.diff(cols) >= 0), "col_perm does not order by column"
            else:  # cells of one row stay together
                rows = batch["seq_row_ids"][i, perm[i, :n]].tolist()
                runs = [x for j, x in enumerate(rows) if j == 0 or rows[j - 1] != x]
                assert len(runs) == len(set(runs)), f"{key} splits a row"


def test_batch_layout_matches_seed_000(small: SmallDb, closing: list[Any]) -> None:
    d = small.built.meta["embedder"]["dim"]
    s = sampler(small, task_pick="round_robin", default_batch_size=8, default_sequence_length=40)
    closing.append(s)
    seen_r: list[tuple[int, int]] = []
    for _ in range(2 * len(TASK_NAMES)):
        for batch in (s.next_train_batch(), s.next_val_batch()):
            check_layout(batch, 8, 40, d)
            # Every table stores columns and only whole rows are included, so
            # R is exactly the most rows of any sequence here.
            rows = max(
                int(batch["seq_row_ids"][i][batch["is_padding"][i] == 0].max()) + 1
                for i in range(8)
            )
            seen_r.append((batch["fk_adj"].shape[1], rows))
    assert all(r == n for r, n in seen_r), seen_r
    assert len({r for r, _ in seen_r}) > 1, "R does not vary with the batch"


def test_batch_layout_tpch(tpch: Tpch, closing: list[Any]) -> None:
    s = N.Sampler(tpch.built.path, default_batch_size=4, default_sequence_length=256)
    closing.append(s)
    for _ in range(4):
        check_layout(s.next_train_batch(), 4, 256, tpch.built.meta["embedder"]["dim"])


def test_batch_keys_constant() -> None:
    assert list(N.BATCH_KEYS) == list(LAYOUT)


def test_batch_has_exactly_the_contract_keys(small: SmallDb, closing: list[Any]) -> None:
    s = sampler(small)
    closing.append(s)
    for batch in (s.next_train_batch(), s.next_val_batch()):
        # The 20 keys of the batch layout (docs/sampling.md) in order, then the telemetry fingerprint,
        # the per-sequence validity mask (all 1 outside evaluation passes),
        # the packing tensors (one segment per sequence here), db_idx, the
        # per-sequence target tensors (mixed-task batches) and the masked
        # cells' (none here).
        assert list(batch)[:20] == list(LAYOUT), "keys or key order differ from the batch layout (docs/sampling.md)"
        assert list(batch)[:20] == list(N.BATCH_KEYS)
        assert list(batch)[20:22] == ["fingerprint", "seq_valid"]
        assert list(batch)[22:] == [
            "segment_ids", "target_pos", "target_count", "segment_seeds", "db_idx",
            "seq_task_idx", "seq_target_stype", "seq_cat_emb_start", "seq_cat_emb_count",
            "seq_db_idx", "is_masked", "mask_pos", "mask_count", "mask_cat_start",
            "mask_cat_count",
        ]
        assert not batch["is_masked"].any() and not batch["mask_count"].any()
        assert batch["db_idx"].tolist() == [0], "one database is database 0 of its mixture"
        assert batch["fingerprint"].dtype == np.uint64 and batch["fingerprint"].shape == (1,)
        assert batch["seq_valid"].dtype == np.uint8 and np.all(batch["seq_valid"] == 1)


# ----------------------------------------------------------------------------
# 2. Zero copy
# ----------------------------------------------------------------------------


def _check_no_copy(key: str, a: np.ndarray, ptr: int | None) -> None:
    if ptr is not None and a.size:
        assert a.ctypes.data == ptr, f"{key}: data is not the Rust buffer"
    assert not a.flags.owndata, f"{key}: NumPy owns (copied) the data"
    base = a.base
    assert base is not None, key
    while isinstance(base, np.ndarray):  # a reshape view of the 1-D array
        assert not base.flags.owndata, f"{key}: base array owns a copy"
        assert base.ctypes.data == a.ctypes.data, f"{key}: base array is another buffer"
        base = base.base
    assert base is not None, f"{key}: no owner object behind the array"


def test_zero_copy(small: SmallDb, closing: list[Any]) -> None:
    s = sampler(small)
    closing.append(s)
    for _ in range(3):
        batch = s.next_train_batch()
        ptrs = dict(s._last_batch_pointers())
        # Every tensor (one-element ones too) is a Rust buffer handed over.
        assert set(ptrs) == set(batch) == {t["name"] for t in N.batch_tensors()}
        for key, a in batch.items():
            _check_no_copy(key, a, ptrs.get(key))
        # Distinct tensors, distinct buffers.
        nonempty = [batch[k].ctypes.data for k in ptrs if batch[k].size]
        assert len(set(nonempty)) == len(nonempty)


def test_batch_outlives_sampler(small: SmallDb) -> None:
    s = sampler(small)
    batch = s.next_train_batch()
    ptrs = dict(s._last_batch_pointers())
    snapshot = {k: v.copy() for k, v in batch.items()}
    s.shutdown()
    del s
    gc.collect()
    # Churn the allocator so a freed buffer would likely be reused.
    other = sampler(small)
    junk = [other.next_train_batch() for _ in range(4)]
    junk.append({"x": np.ones(1 << 20, dtype=np.uint8)})
    other.shutdown()
    for k, v in batch.items():
        assert np.array_equal(v, snapshot[k]), f"{k} changed after the sampler was deleted"
        if k in ptrs and v.size:
            assert v.ctypes.data == ptrs[k]
    # The arrays are NumPy's: writable, and survive dropping the dict.
    a = batch.pop("numeric_values")
    del batch
    gc.collect()
    a[...] = 1.5
    assert a.sum() == 1.5 * a.size
    del junk


# ----------------------------------------------------------------------------
# 3. Values
# ----------------------------------------------------------------------------


def test_values_match_the_database(small: SmallDb, oracle: Oracle, closing: list[Any]) -> None:
    meta = small.built.meta
    events = small.data.tables["events"]
    notes = events.column("note").to_pylist()
    amounts = events.column("amount").to_pylist()
    kinds = events.column("kind").to_pylist()
    amount_col = small.built.columns_of("events")["amount"]
    note_col = small.built.columns_of("events")["note"]
    kind_col = small.built.columns_of("events")["kind"]
    note_values, _ = small.built.column("events", "note")
    # All seeds in train; round robin so every task shows up.
    s = sampler(
        small,
        split_ratios=(1.0, 0.0, 0.0),
        task_pick="round_robin",
        default_batch_size=24,
        default_sequence_length=48,
    )
    closing.append(s)
    text_checked = numeric_checked = 0
    for step in range(3 * len(TASK_NAMES)):
        batch = s.next_train_batch()
        k = int(batch["task_idx"][0])
        assert k == step % len(TASK_NAMES)
        task = meta["tasks"][k]
        tcol = meta["columns"][task["target_column"]]
        assert batch["target_stype"][0] == CODES[task["target_stype"]]
        assert (batch["cat_emb_start"][0], batch["cat_emb_count"][0]) == (
            tcol["cat_emb_start"],
            tcol["cat_emb_count"],
        )
        if task["target_stype"] == "categorical":
            assert tcol["cat_emb_count"] > 0
            ids = batch["categorical_embed_ids"][:, 0][batch["is_null"][:, 0] == 0]
            assert ids.size and np.all(ids >= tcol["cat_emb_start"])
            assert np.all(ids < tcol["cat_emb_start"] + tcol["cat_emb_count"])
        for b, (table, cand) in enumerate(oracle.check_batch(batch)):
            if table != small.built.table_idx("events"):
                continue
            # An event's time (µs, unique here) pins the anchor row down.
            (rows,) = np.nonzero(cand)
            assert len(rows) == 1, f"sequence {b}: anchor rows {rows}"
            r = int(rows[0])
            pos = {int(c): p for p, c in enumerate(batch["column_ids"][b]) if p < 5}
            if notes[r] is not None:
                p = pos[note_col["idx"]]
                local = int(batch["text_embed_ids"][b, p])
                g = int(note_values[r])
                assert small.built.db.embedded_string("text", g) == notes[r]
                assert np.array_equal(batch["text_batch_embeddings"][local], oracle.text_emb[g])
                text_checked += 1
            if amounts[r] is not None and k != T_AMOUNT2:
                p = pos[amount_col["idx"]]
                assert (k == T_AMOUNT) == (p == 0)
                z = (amounts[r] - amount_col["stats"]["mean"]) / amount_col["stats"]["std"]
                assert math.isclose(batch["numeric_values"][b, p], z, rel_tol=1e-6, abs_tol=1e-6)
                numeric_checked += 1
            if k == T_KIND:
                v = int(batch["categorical_embed_ids"][b, 0])
                assert kind_col["categories"][v - kind_col["cat_emb_start"]] == kinds[r]
    assert text_checked > 20 and numeric_checked > 20


def test_timestamp_encoding_of_a_known_date(
    small: SmallDb, oracle: Oracle, closing: list[Any]
) -> None:
    meta = small.built.meta
    ts = meta["timestamp_stats"]
    users = small.built.table("users")
    signup = small.built.columns_of("users")["signup"]
    # user 0 signed up on 2024-01-01 08:00:00 (a Monday).
    t0 = micros(dt.datetime(2024, 1, 1, 8, 0, 0))
    assert small.data.values("users", "signup")[0] == dt.datetime(2024, 1, 1, 8, 0, 0)
    z = (t0 - ts["mean_us"]) / ts["std_us"]
    want = np.array(
        [0, 1, 0, 1, math.sin(2 * math.pi / 3), -0.5, 0, 1, 0, 1, 0, 1, 0, 1, z], np.float32
    )
    # A pool of all user_country seeds, drawn in one batch: user 0 is among them.
    n_seeds = meta["tasks"][T_COUNTRY]["num_seeds"]
    s = sampler(
        small,
        split_ratios=(1.0, 0.0, 0.0),
        task_weights=one_hot(T_COUNTRY),
        default_batch_size=n_seeds,
    )
    closing.append(s)
    batch = s.next_train_batch()
    found = []
    for b, (table, cand) in enumerate(oracle.check_batch(batch)):
        assert table == users["idx"]
        if cand[0]:
            assert cand.sum() == 1
            p = batch["column_ids"][b].tolist().index(signup["idx"])
            found.append(batch["timestamp_values"][b, p])
    assert len(found) == 1, "user 0 is not drawn exactly once in one epoch"
    got = found[0]
    np.testing.assert_allclose(got[:14], want[:14], atol=1e-6)
    assert math.isclose(got[14], z, rel_tol=1e-6, abs_tol=1e-6)
    # Every pair is on the unit circle, in every timestamp cell of the batch.
    cells = batch["timestamp_values"][(batch["semantic_types"] == 2) & (batch["is_null"] == 0)]
    assert len(cells) > n_seeds
    radius = cells[:, 0:14:2] ** 2 + cells[:, 1:14:2] ** 2
    np.testing.assert_allclose(radius, 1.0, atol=1e-5)


def test_virtual_timestamp_target(small: SmallDb, oracle: Oracle, closing: list[Any]) -> None:
    """SQL task target signup + 1 day: the target cell encodes the task value."""
    s = sampler(small, split_ratios=(1.0, 0.0, 0.0), task_weights=one_hot(T_SIGNUP1))
    closing.append(s)
    signup = small.built.columns_of("users")["signup"]
    batch = s.next_train_batch()
    oracle.check_batch(batch)
    for b in range(batch["is_padding"].shape[0]):
        p = batch["column_ids"][b].tolist().index(signup["idx"])
        if batch["is_null"][b, p] or batch["is_null"][b, 0]:
            continue
        # The day-of-week pair turns by one day (1/7 of a turn) from the row's signup.
        a0 = math.atan2(batch["timestamp_values"][b, p, 6], batch["timestamp_values"][b, p, 7])
        a1 = math.atan2(batch["timestamp_values"][b, 0, 6], batch["timestamp_values"][b, 0, 7])
        assert math.isclose((a1 - a0) % (2 * math.pi), 2 * math.pi / 7, abs_tol=1e-5)
        dz = batch["timestamp_values"][b, 0, 14] - batch["timestamp_values"][b, p, 14]
        want = DAY_US / small.built.meta["timestamp_stats"]["std_us"]
        assert math.isclose(dz, want, rel_tol=1e-3)


# ----------------------------------------------------------------------------
# 4. Determinism, splits, shards
# ----------------------------------------------------------------------------


def _first(s: Any, n: int, split: str = "train") -> list[dict[str, np.ndarray]]:
    get = s.next_train_batch if split == "train" else s.next_val_batch
    return [get() for _ in range(n)]


def _identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return list(a) == list(b) and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes()
        for k in a
    )


def test_deterministic_across_thread_counts(small: SmallDb, closing: list[Any]) -> None:
    kw: dict[str, Any] = {"seed": 7, "split_seed": 3, "default_batch_size": 32}
    s1 = sampler(small, num_threads=1, **kw)
    s2 = sampler(small, num_threads=2, **kw)
    s3 = sampler(small, num_threads=2, **{**kw, "seed": 8})
    closing.extend([s1, s2, s3])
    assert (s1.num_threads, s2.num_threads) == (1, 2)
    assert s1.content_hash == s2.content_hash == small.built.db.content_hash
    a, b, c = _first(s1, 3), _first(s2, 3), _first(s3, 3)
    for i in range(3):
        assert _identical(a[i], b[i]), f"train batch {i} differs between 1 and 2 threads"
    assert not all(_identical(a[i], c[i]) for i in range(3)), "seed has no effect"
    va, vb = _first(s1, 2, "val"), _first(s2, 2, "val")
    assert all(_identical(x, y) for x, y in zip(va, vb, strict=True))
    assert not _identical(a[0], va[0])


def _amount_targets(s: Any, split: str, draws: int) -> list[float]:
    """Target values (unique per event) of the first `draws` event_amount seeds."""
    out: list[float] = []
    get = s.next_train_batch if split == "train" else s.next_val_batch
    while len(out) < draws:
        batch = get()
        assert batch["task_idx"][0] == T_AMOUNT
        assert not batch["is_null"][:, 0].any()
        out.extend(batch["numeric_values"][:, 0].tolist())
    return out[:draws]


def _epoch(draws: list[float]) -> set[float]:
    """The pool behind `draws` (at least one epoch); its first epoch has no repeats."""
    pool = set(draws)
    assert len(set(draws[: len(pool)])) == len(pool), "a seed repeats within an epoch"
    return pool


def _all_amounts(small: SmallDb) -> set[float]:
    values, valid = small.built.column("events", "amount")
    every = set(values[valid == 1].astype(np.float32).tolist())
    # Amounts are distinct: a target value names its seed.
    assert len(every) == small.built.meta["tasks"][T_AMOUNT]["num_seeds"]
    return every


def test_split_seed_changes_val_membership(small: SmallDb, closing: list[Any]) -> None:
    every = _all_amounts(small)
    n = len(every)

    def val_and_train(**kw: Any) -> tuple[set[float], set[float]]:
        s = sampler(
            small,
            split_ratios=(0.5, 0.5, 0.0),
            task_weights=one_hot(T_AMOUNT),
            default_batch_size=64,
            **kw,
        )
        closing.append(s)
        # n draws cover at least one whole epoch of either pool.
        return _epoch(_amount_targets(s, "val", n)), _epoch(_amount_targets(s, "train", n))

    v0, t0 = val_and_train(split_seed=0, seed=0)
    assert v0 and t0 and not v0 & t0, "a seed is both train and val"
    assert v0 | t0 == every, "train + val do not cover the task"
    assert 0.35 < len(v0) / n < 0.65
    v1, _ = val_and_train(split_seed=0, seed=99)
    assert v1 == v0, "the sampling seed changed the split"
    v2, t2 = val_and_train(split_seed=1, seed=0)
    assert v2 != v0, "split_seed has no effect on val membership"
    assert not v2 & t2 and v2 | t2 == every


def _rank_batches(s: Any, steps: int) -> list[list[float]]:
    """The event_amount targets of each of the first `steps` train batches of `s`."""
    b = s.config()["default_batch_size"]
    flat = _amount_targets(s, "train", steps * b)
    return [flat[t * b : (t + 1) * b] for t in range(steps)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_slice_one_global_epoch(small: SmallDb, closing: list[Any], world_size: int) -> None:
    """One global pool per (task, split): within one global epoch
    (⌈pool / (W·B)⌉ steps) the ranks' draws are disjoint and together cover
    the pool, and position p of the global order is the same seed whatever W."""
    every = _all_amounts(small)
    b = 16
    kw: dict[str, Any] = {
        "split_ratios": (0.5, 0.5, 0.0),
        "task_weights": one_hot(T_AMOUNT),
        "default_batch_size": b,
        "seed": 4,
    }
    one = sampler(small, rank=0, world_size=1, **kw)
    closing.append(one)
    order = _amount_targets(one, "train", len(every))  # > one epoch of the train pool
    pool = _epoch(order)
    assert pool < every and len(pool) > 2 * world_size * b
    steps = -(-len(pool) // (world_size * b))
    assert len(pool) % (world_size * b), "pick B so that the last step crosses the epoch"
    ranks = []
    for r in range(world_size):
        s = sampler(small, rank=r, world_size=world_size, **kw)
        closing.append(s)
        ranks.append(_rank_batches(s, steps))
    # Step t, rank r, row j is global position t·W·B + r·B + j.
    glob = [x for t in range(steps) for r in range(world_size) for x in ranks[r][t]]
    epoch = glob[: len(pool)]
    # What each rank drew within the epoch (the last step's rows past the
    # epoch's end belong to the next one).
    mine = [{x for p, x in enumerate(epoch) if p // b % world_size == r} for r in range(world_size)]
    for r in range(world_size):
        for q in range(r):
            assert not mine[r] & mine[q], f"ranks {q} and {r} both drew {len(mine[r] & mine[q])}"
    assert len(set(epoch)) == len(pool), "a seed repeats within the global epoch"
    assert set(epoch) == pool, f"{len(pool - set(epoch))} seeds of the pool never drawn"
    assert sum(len(m) for m in mine) == len(pool)
    # The order is the pool's, not the world size's; the last step went on
    # into the next epoch.
    assert epoch == order[: len(pool)]
    assert set(glob[len(pool) :]) <= pool and glob[len(pool) :] == order[len(pool) : len(glob)]


def test_val_stream_does_not_depend_on_train_consumption(
    small: SmallDb, closing: list[Any]
) -> None:
    a, b = sampler(small, seed=5), sampler(small, seed=5)
    closing.extend([a, b])
    _first(a, 4)
    va, vb = _first(a, 2, "val"), _first(b, 2, "val")
    assert all(_identical(x, y) for x, y in zip(va, vb, strict=True))


# ----------------------------------------------------------------------------
# 5. Shutdown and lifecycle
# ----------------------------------------------------------------------------


def test_exception_hierarchy() -> None:
    for name in ("SamplerShutdown", "WorkerError", "ResourceError", "FormatError"):
        assert issubclass(getattr(N, name), N.HeadwaterError), name
    assert issubclass(N.HeadwaterError, Exception)
    assert headwater.HeadwaterError is N.HeadwaterError


def test_shutdown_then_next_raises(small: SmallDb) -> None:
    s = sampler(small)
    s.next_train_batch()
    assert not s.is_shut_down
    s.shutdown()
    assert s.is_shut_down
    for get in (s.next_train_batch, s.next_val_batch):
        with pytest.raises(N.SamplerShutdown):
            get()
    with pytest.raises(N.HeadwaterError, match="shut down"):
        s.next_train_batch()
    assert s.queue_depth("train") == 0 and s.queue_depth("val") == 0
    s.shutdown()  # twice is fine
    assert s.is_shut_down
    # Accessors still work after shutdown.
    assert s.config()["default_batch_size"] == SMALL["default_batch_size"]


def test_context_manager(small: SmallDb) -> None:
    with sampler(small) as s:
        assert s.next_train_batch()["is_padding"].shape[0] == SMALL["default_batch_size"]
        assert not s.is_shut_down
    assert s.is_shut_down
    with pytest.raises(N.SamplerShutdown):
        s.next_train_batch()
    # An exception in the body propagates and still shuts down.
    with pytest.raises(RuntimeError, match="boom"), sampler(small) as s2:
        raise RuntimeError("boom")
    assert s2.is_shut_down


def test_prefetch_queue_is_bounded(small: SmallDb, closing: list[Any]) -> None:
    s = sampler(small, num_prefetch=2)
    closing.append(s)
    deadline = time.monotonic() + 10
    while min(s.queue_depth("train"), s.queue_depth("val")) < 2:
        assert time.monotonic() < deadline, "the prefetch queues never filled"
        time.sleep(0.01)
    time.sleep(0.1)  # the producers are blocked, not filling past the bound
    assert s.queue_depth("train") == 2 and s.queue_depth("val") == 2
    assert s.queue_depth() == 2  # train by default
    with pytest.raises(ValueError, match="`split`"):
        s.queue_depth("bogus")


def test_queue_depth_rejects_the_test_split(small: SmallDb, closing: list[Any]) -> None:
    s = sampler(small)
    closing.append(s)
    with pytest.raises(ValueError, match="`split`"):
        s.queue_depth("test")


def _slow_tpch(tpch: Tpch) -> Any:
    """A sampler whose first train batch takes a good fraction of a second.

    One worker thread, full 1024-cell sequences (part_retail_price), and every
    seed in train so the val producer stops at once (no val seeds) instead of
    competing for the CPU.
    """
    names = [k["name"] for k in tpch.built.meta["tasks"]]
    return N.Sampler(
        tpch.built.path,
        default_batch_size=2048,
        default_sequence_length=1024,
        num_threads=1,
        num_prefetch=1,
        split_ratios=(1.0, 0.0, 0.0),
        task_weights=[float(n == "part_retail_price") for n in names],
    )


def test_shutdown_wakes_a_blocked_consumer(tpch: Tpch) -> None:
    s = _slow_tpch(tpch)
    outcome: list[BaseException] = []
    got = [0]
    t_end = [0.0]
    in_call = threading.Event()

    def consume() -> None:
        try:
            while True:
                in_call.set()
                s.next_train_batch()
                got[0] += 1
        except BaseException as e:
            t_end[0] = time.monotonic()
            outcome.append(e)

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    assert in_call.wait(5)
    time.sleep(0.05)
    assert th.is_alive() and got[0] == 0 and s.queue_depth("train") == 0
    t0 = time.monotonic()
    s.shutdown()  # joins the producer, which first finishes its batch
    t_joined = time.monotonic()
    th.join(5)
    assert not th.is_alive(), "the consumer thread hangs after shutdown()"
    assert len(outcome) == 1 and isinstance(outcome[0], N.SamplerShutdown), outcome
    assert got[0] == 0, "the consumer was not blocked when shutdown() was called"
    # Woken at once, not when the producer's batch was done.
    assert t_end[0] - t0 < 0.05 + 0.5 * (t_joined - t0), (t_end[0] - t0, t_joined - t0)


# ----------------------------------------------------------------------------
# 6. Faults
# ----------------------------------------------------------------------------


def test_producer_panic_becomes_worker_error(small: SmallDb) -> None:
    s = sampler(small, debug_panic_at_step=1)
    got = 0
    with pytest.raises(N.WorkerError, match="panicked") as ei:
        for _ in range(5):
            s.next_train_batch()
            got += 1
    assert got == 1, "the batch before the panic is delivered, the panic right after"
    assert "debug_panic_at_step" in str(ei.value)
    # Further calls raise too, promptly (no hang), on both splits.
    for get in (s.next_train_batch, s.next_train_batch, s.next_val_batch):
        t0 = time.monotonic()
        with pytest.raises(N.WorkerError, match="panicked"):
            get()
        assert time.monotonic() - t0 < 2
    s.shutdown()
    with pytest.raises(N.SamplerShutdown):
        s.next_train_batch()


def test_rss_cap_raises_resource_error(small: SmallDb) -> None:
    s = sampler(small, max_rss_bytes=1)
    with pytest.raises(N.ResourceError, match="max_rss_bytes"):
        s.next_train_batch()
    with pytest.raises(N.HeadwaterError, match="max_rss_bytes"):
        s.next_train_batch()
    s.shutdown()
    # A generous cap does not trip.
    with sampler(small, max_rss_bytes=1 << 50) as ok:
        ok.next_train_batch()


def _run_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


CTRL_C_CHILD = """
import signal, sys, time
from headwater import _native as N
# Python's own Ctrl-C handler, whatever the child inherited: a shell runs a
# background job with SIGINT ignored, and Python then installs none.
signal.signal(signal.SIGINT, signal.default_int_handler)
w = [0.0] * int(sys.argv[3]); w[int(sys.argv[2])] = 1.0
# The producer sleeps 3 s before each batch (fault injection), so the wait
# below is still blocked when the signal arrives however fast batches are.
s = N.Sampler(sys.argv[1], default_batch_size=8, default_sequence_length=64,
              num_threads=1, num_prefetch=1, split_ratios=(1.0, 0.0, 0.0), task_weights=w,
              debug_batch_delay_ms=3000.0)
print("READY", flush=True)
try:
    s.next_train_batch()
    print("NO-INTERRUPT", flush=True)
except KeyboardInterrupt:
    t_exc = time.monotonic()
    s.next_train_batch()  # when the batch the wait was for is ready
    print("INTERRUPTED", t_exc, time.monotonic(), flush=True)
    raise
"""


def test_ctrl_c_interrupts_a_blocked_wait(tpch: Tpch) -> None:
    names = [k["name"] for k in tpch.built.meta["tasks"]]
    env = {**os.environ, "RUST_BACKTRACE": "0"}
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(CTRL_C_CHILD),
            str(tpch.built.path),
            str(names.index("part_retail_price")),
            str(len(names)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
        time.sleep(0.05)
        t_sig = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines = [ln for ln in out.splitlines() if ln.startswith("INTERRUPTED")]
    assert lines, f"no KeyboardInterrupt in the child; stdout {out!r}; stderr:\n{err}"
    t_exc, t_ready = (float(x) for x in lines[0].split()[1:])
    # Interrupted promptly, long before the batch it waited for was ready.
    assert t_exc - t_sig < 1.0, t_exc - t_sig
    assert t_exc - t_sig < 0.5 * (t_ready - t_sig), (t_exc - t_sig, t_ready - t_sig)
    assert "KeyboardInterrupt" in err
    assert p.returncode == -signal.SIGINT, (p.returncode, err)


FORK_CHILD = """
import os, sys, time
from headwater import _native as N
s = N.Sampler(sys.argv[1], default_batch_size=8, default_sequence_length=32)
s.next_train_batch()
pid = os.fork()
if pid == 0:
    code = 1
    t0 = time.monotonic()
    try:
        s.next_train_batch()
        code = 2
    except N.WorkerError as e:
        code = 0 if "fork" in str(e) and time.monotonic() - t0 < 2 else 3
    except BaseException:
        code = 4
    if sys.argv[2] == "drop":
        # Dropping the inherited sampler must not touch the parent's threads.
        bad = []
        sys.unraisablehook = lambda u: bad.append(u.exc_value)
        del s
        import gc; gc.collect()
        code = code or (5 if bad else 0)
    os._exit(code)
_, status = os.waitpid(pid, 0)
# The parent's sampler is unaffected.
s.next_train_batch()
s.shutdown()
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_fork_child_gets_worker_error(small: SmallDb) -> None:
    r = _run_child(FORK_CHILD, str(small.path), "keep", timeout=30)
    assert r.returncode == 0, f"child outcome {r.returncode}\n{r.stderr}"


def test_fork_child_drops_sampler_quietly(small: SmallDb) -> None:
    r = _run_child(FORK_CHILD, str(small.path), "drop", timeout=30)
    assert r.returncode == 0, f"child outcome {r.returncode}\n{r.stderr}"
    assert "panicked" not in r.stderr


# ----------------------------------------------------------------------------
# 7. Bad arguments
# ----------------------------------------------------------------------------

BAD_ARGS: list[tuple[dict[str, Any], str]] = [
    ({"rank": 2, "world_size": 2}, "rank"),
    ({"rank": 5}, "rank"),
    ({"world_size": 0}, "world_size"),
    ({"rank": -1}, "rank"),
    ({"world_size": -2}, "world_size"),
    ({"task_weights": [1.0, 1.0]}, "task_weights"),
    ({"task_weights": [1.0, -1.0, 0, 0, 0, 0]}, "task_weights"),
    ({"task_weights": [1.0, float("nan"), 0, 0, 0, 0]}, "task_weights"),
    ({"task_weights": [0.0] * 6}, "task_weights"),
    ({"split_ratios": (0.5, 0.1, 0.1)}, "split_ratios"),
    ({"split_ratios": (1.2, -0.1, -0.1)}, "split_ratios"),
    ({"default_batch_size": 0}, "default_batch_size"),
    ({"default_batch_size": -1}, "default_batch_size"),
    ({"default_sequence_length": 0}, "default_sequence_length"),
    ({"default_sequence_length": 65536}, "default_sequence_length"),
    ({"num_prefetch": 0}, "num_prefetch"),
    ({"task_pick": "bogus"}, "task_pick"),
    ({"bfs_child_width": 0}, "bfs_child_width"),
    ({"num_threads": 0}, "num_threads"),
    ({"max_rss_bytes": 0}, "max_rss_bytes"),
]


@pytest.mark.parametrize("kw,name", BAD_ARGS, ids=[f"{n}-{i}" for i, (_, n) in enumerate(BAD_ARGS)])
def test_bad_argument_is_value_error(small: SmallDb, kw: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=f"`{name}`"):
        sampler(small, **kw)


def test_missing_database(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        N.Sampler(tmp_path / "nowhere")


def test_directory_that_is_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "junk.txt").write_text("hello")
    with pytest.raises((FileNotFoundError, N.FormatError), match=r"metadata\.json"):
        N.Sampler(tmp_path)


def test_future_format_version(small: SmallDb, tmp_path: Path) -> None:
    import shutil

    db = tmp_path / "db"
    shutil.copytree(small.path, db)
    meta = db / "metadata.json"
    meta.chmod(0o644)
    m = json.loads(meta.read_text())
    m["format_version"] = 99
    meta.write_text(json.dumps(m))
    with pytest.raises(N.FormatError, match="version 99"):
        N.Sampler(db)


# ----------------------------------------------------------------------------
# 8. Metadata accessors
# ----------------------------------------------------------------------------


def test_metadata_accessors(small: SmallDb, closing: list[Any]) -> None:
    db = small.built.db
    d = small.built.meta["embedder"]["dim"]
    s = sampler(small)
    closing.append(s)
    for which, got in (
        ("column", s.column_embeddings()),
        ("categorical", s.categorical_embeddings()),
    ):
        want = db.embeddings(which)
        assert got.dtype == np.float16 and got.ndim == 2 and got.shape[1] == d, which
        assert got.shape == want.shape and np.array_equal(got, want), which
    assert s.categorical_embeddings().shape[0] == small.built.meta["num_categorical_embeddings"]
    m = s.database_metadata()
    assert isinstance(m, dict)
    # One database is a mixture of one: its metadata plus the mixture's
    # record of it (name, content hash, share 1, offsets 0).
    dbs = m.pop("databases")
    memory = m.pop("memory")  # the read plan: every mapped byte, the budget
    assert memory["mapped_bytes"] == sum(f["bytes"] for f in m["files"].values()) > 0
    assert m == small.built.meta
    assert len(dbs) == 1 and dbs[0]["content_hash"] == db.content_hash
    assert dbs[0]["share"] == 1.0 and dbs[0]["column_offset"] == dbs[0]["categorical_offset"] == 0
    assert [t["name"] for t in m["tables"]] == ["events", "items", "users"]
    assert [k["name"] for k in m["tasks"]] == TASK_NAMES
    assert s.content_hash == db.content_hash == m["content_hash"]


def test_config_echoes_arguments(small: SmallDb, closing: list[Any]) -> None:
    schema = N.sampler_config_schema()
    echoed = [f["name"] for f in schema]
    kw: dict[str, Any] = {
        "rank": 1,
        "world_size": 3,
        "split_ratios": (0.7, 0.2, 0.1),
        "split_seed": 11,
        "seed": 12,
        "num_prefetch": 2,
        "default_batch_size": 5,
        "default_sequence_length": 33,
        "bfs_child_width": 4,
        "max_hops": 2,
        "task_weights": [1.0, 2.0, 0.0, 0.5, 0.0, 1.0],
        "task_pick": "round_robin",
        "num_threads": 2,
        "max_rss_bytes": 1 << 40,
        "temporal_filter": False,
    }
    assert set(kw) <= set(echoed)
    s = N.Sampler(small.path, **kw)
    closing.append(s)
    cfg = s.config()
    assert list(cfg) == echoed, "config() keys are not the constructor's arguments"
    assert {k: cfg[k] for k in kw} == {**kw, "split_ratios": [0.7, 0.2, 0.1]}
    assert s.num_threads == 2
    assert s.next_train_batch()["is_padding"].shape == (5, 33)
    # Defaults: those of the signature (and of the sampler's documented defaults).
    d = N.Sampler(small.path)
    closing.append(d)
    defaults = {f["name"]: f["default"] for f in schema}
    assert d.config() == defaults
    assert {k: defaults[k] for k in ("num_prefetch", "default_batch_size", "bfs_child_width")} == {
        "num_prefetch": 3,
        "default_batch_size": 32,
        "bfs_child_width": 16,
    }
    assert (defaults["default_sequence_length"], defaults["max_hops"]) == (1024, 3)
    assert (defaults["task_pick"], defaults["task_weights"], defaults["num_threads"]) == (
        "weighted",
        None,
        None,
    )


# ----------------------------------------------------------------------------
# 9. Task weights and task picking
# ----------------------------------------------------------------------------


def test_one_hot_weights_pick_one_task(small: SmallDb, closing: list[Any]) -> None:
    for k in (0, T_STOCK):
        s = sampler(small, task_weights=one_hot(k), default_batch_size=2)
        closing.append(s)
        assert {int(s.next_train_batch()["task_idx"][0]) for _ in range(12)} == {k}
        assert {int(s.next_val_batch()["task_idx"][0]) for _ in range(6)} == {k}


def test_round_robin_cycles_in_order(small: SmallDb, closing: list[Any]) -> None:
    n = len(TASK_NAMES)
    s = sampler(small, task_pick="round_robin", default_batch_size=2)
    closing.append(s)
    seq = [int(s.next_train_batch()["task_idx"][0]) for _ in range(2 * n + 1)]
    assert seq == [i % n for i in range(2 * n + 1)]
    # Tasks of weight 0 are left out of the cycle.
    s = sampler(
        small, task_pick="round_robin", task_weights=[1, 0, 2, 0, 1, 0], default_batch_size=2
    )
    closing.append(s)
    seq = [int(s.next_train_batch()["task_idx"][0]) for _ in range(7)]
    assert seq == [0, 2, 4, 0, 2, 4, 0]


def test_weighted_pick_follows_weights(small: SmallDb, closing: list[Any]) -> None:
    s = sampler(
        small,
        task_weights=[3.0, 1.0, 0, 0, 0, 0],
        default_batch_size=1,
        default_sequence_length=8,
        num_prefetch=8,
    )
    closing.append(s)
    picks = [int(s.next_train_batch()["task_idx"][0]) for _ in range(400)]
    assert set(picks) == {0, 1}
    assert 0.65 < picks.count(0) / len(picks) < 0.85  # expect 0.75, sd 0.022
