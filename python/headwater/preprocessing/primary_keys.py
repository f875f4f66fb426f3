"""Primary keys: each referenced or anchor table's key column read once,
checked unique, and indexed by value → row (:class:`_KeyIndex`), so foreign
keys and task anchors resolve to parent rows chunk by chunk. Integer keys are
binary-searched in (spilled) sorted order; other keys by the hash of their
text, each hit confirmed by comparing the texts. A sort too large for the
run's budget is DuckDB's, which spills.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater.errors import SchemaError
from headwater.preprocessing import memory
from headwater.preprocessing.columns import (
    _chunks,
    _column_type,
    _fill,
    _read,
    _string_buffers,
    _valid,
)
from headwater.preprocessing.memory import _SORT_BUDGET, _into, _release_arrow_memory, _Spool
from headwater.preprocessing.plan import TablePlan
from headwater.preprocessing.sources import Source, quote

#: The SQL expression that hashes a string key (``{}``: the key as VARCHAR).
KEY_HASH = "hash({})"



class _KeyIndex:
    """A table's primary key, looked up by value → row. Integer keys (the
    common case) are binary-searched in ascending order: the key array itself
    when it is already ascending (no copy), else a sorted copy and its order
    (12 bytes per key, spilled like a large column). Other key types go
    through Arrow's ``index_in``, which builds a hash table of every key on
    each call (about 50 bytes per key: 0.75 GiB of private memory for TPC-H
    SF10's 15 M order keys, rebuilt for each of lineitem's chunks).

    :meth:`stream` builds it from a source table in chunks: integer keys
    never sit whole in private memory (spilled array; a sort too large for
    the run's budget is DuckDB's, which spills too). Other keys are indexed
    by the DuckDB ``hash`` of their text (``::VARCHAR``) the same way, the
    texts themselves kept in spilled Arrow buffers (``values``) so that
    every hash match is confirmed by comparing the texts: strings, and
    dates, timestamps, decimals, floats, UUIDs, blobs and the like, whose
    DuckDB text is one per value and another for any other value (as
    Arrow's lookup, ``-0.0`` is not ``0.0``). Keys that share a hash are
    read whole, their values held privately."""

    def __init__(self, col: pa.Array) -> None:
        self.arrow: pa.Array | None = col
        self.type = col.type
        self.sorted: np.ndarray | None = None
        self.order: np.ndarray | None = None
        # Keys by the hash of their text: the texts in row order, and the
        # cursor that hashes looked-up values exactly as the keys were hashed.
        self.values: pa.Array | None = None
        self.hasher: duckdb.DuckDBPyConnection | None = None
        if not pa.types.is_integer(col.type) or col.null_count:
            return
        self.arrow = None
        keys = col.to_numpy(zero_copy_only=True)
        if len(keys) < 2 or bool(np.all(keys[1:] > keys[:-1])):
            self.sorted = keys
            return
        self.sorted, self.order = _sort_keys(keys)

    @classmethod
    def stream(cls, con: duckdb.DuckDBPyConnection, table: str, key: str, n: int, where: str) -> _KeyIndex:
        """The index of ``table``'s key column ``key`` (``n`` rows), read in
        chunks; a null key is a :class:`SchemaError` naming ``where``."""
        t = _column_type(con, table, key)
        if not pa.types.is_integer(t):
            return cls._stream_texts(con, table, key, t, n, where)
        dtype = np.dtype(t.to_pandas_dtype())
        keys, _, put, done = _into(n, dtype, where, with_valid=False)
        nulls, ascending, last = 0, True, None
        for chunk in _chunks(con, table, key):
            nulls += chunk.null_count
            if nulls:
                continue
            v = chunk.cast(t).to_numpy(zero_copy_only=False)
            if ascending and len(v):
                ascending = bool(np.all(v[1:] > v[:-1])) and (last is None or bool(v[0] > last))
                last = v[-1]
            put(v, None)
        if nulls:
            raise SchemaError(f"{where} has {nulls} null value(s)")
        done()
        index = cls(pa.array([], t))
        index.arrow = None
        if ascending:
            index.sorted = keys
        else:
            index.sorted, index.order = _sort_keys(keys, con)
        return index

    @classmethod
    def _stream_texts(
        cls, con: duckdb.DuckDBPyConnection, table: str, key: str, t: pa.DataType, n: int, where: str
    ) -> _KeyIndex:
        """The index of a key of Arrow type ``t`` by text: each key's DuckDB
        ``hash`` of its text (8 bytes) and the text itself (its bytes plus an
        8-byte offset) streamed into spilled arrays, the hashes sorted as
        integer keys are. Two keys that share a hash are found by
        :func:`_primary_keys`' duplicate check."""
        hashes, _, put, done = _into(n, np.uint64, where, with_valid=False)
        offsets = memory.column_array(n + 1, np.int64)
        offsets[0] = 0
        data = _Spool(np.uint8)
        q = quote(key)
        h = KEY_HASH.format(f"{q}::VARCHAR")
        reader = con.execute(f"SELECT {h}, {q}::VARCHAR FROM {quote(table)}").to_arrow_reader(memory.CHUNK_ROWS)
        nulls, at, size = 0, 0, 0
        for batch in reader:
            k = batch.column(1)
            nulls += k.null_count
            if nulls or not len(k):
                continue
            put(batch.column(0).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False), None)
            o, buf = _string_buffers(k.cast(pa.large_string()))
            data.append(buf[o[0] : o[-1]])
            offsets[at + 1 : at + 1 + len(k)] = size + (o[1:] - o[0])
            at, size = at + len(k), size + int(o[-1] - o[0])
        if nulls:
            raise SchemaError(f"{where} has {nulls} null value(s)")
        done()
        index = cls(pa.array([], t))
        index.arrow = None
        index.values = pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.array())])
        index.hasher = con.cursor()
        index.sorted, index.order = _sort_keys(hashes, con)
        return index

    def _hashes(self, col: pa.Array) -> tuple[np.ndarray, pa.Array]:
        """DuckDB's hash of each value's text and the text itself, for the
        values ``col`` of the key's type, as the keys were hashed (on a
        cursor of their connection, so a result the caller is streaming
        stays open). A string is its own text."""
        assert self.hasher is not None
        name = f"__headwater_lookup_{os.getpid()}"
        texts = pa.types.is_string(self.type) or pa.types.is_large_string(self.type)
        self.hasher.register(name, pa.table({"v": col}))
        try:
            got = self.hasher.execute(
                f"SELECT {KEY_HASH.format('v::VARCHAR')}{'' if texts else ', v::VARCHAR'} FROM {quote(name)}"
            ).to_arrow_table()
        finally:
            self.hasher.unregister(name)
        # A null value's hash (if the expression gives none) is masked later.
        text = col if texts else got.column(1).combine_chunks()
        return _fill(got.column(0), 0, np.uint64), text

    def rows(self, col: pa.Array, where: str) -> tuple[np.ndarray, int]:
        """The row (int64; -1 for a null or unmatched value) of each value of
        ``col``, and how many non-null values match no key."""
        if col.type != self.type:
            try:
                col = col.cast(self.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaError(f"{where}: {col.type} values cannot match primary key of type {self.type}: {e}") from e
        if self.sorted is None:
            assert self.arrow is not None
            idx = pc.index_in(col, value_set=self.arrow)
            return _fill(idx.cast(pa.int64()), -1, np.int64), idx.null_count - col.null_count
        out = np.full(len(col), -1, dtype=np.int64)
        if len(self.sorted) == 0 or len(col) == 0:
            return out, len(col) - col.null_count
        if self.values is not None:
            v, text = self._hashes(col)
        else:
            v, text = _fill(col, 0, self.sorted.dtype), col
        pos = np.searchsorted(self.sorted, v)
        np.minimum(pos, len(self.sorted) - 1, out=pos)
        hit = self.sorted[pos] == v
        if col.null_count:
            hit &= _valid(col).astype(bool)
        rows = pos if self.order is None else self.order[pos]
        if self.values is not None:
            # A value that shares its hash with a key but is not that key
            # matches nothing (the keys' hashes are distinct).
            at = np.flatnonzero(hit)
            same = pc.equal(text.take(at).cast(pa.large_string()), self.values.take(pa.array(rows[at])))
            hit[at[~same.to_numpy(zero_copy_only=False)]] = False
        np.copyto(out, rows, where=hit)
        return out, len(col) - col.null_count - int(np.count_nonzero(hit))



def _sort_keys(keys: np.ndarray, con: duckdb.DuckDBPyConnection | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``keys`` in ascending order and the row of each (uint32), both spilled
    when large. A sort whose NumPy scratch (about 24 bytes per key, private)
    would exceed the run's share for it (:data:`_SORT_BUDGET`) is DuckDB's
    ``ORDER BY`` over the keys streamed with their rows in chunks, which
    spills to the run's temp directory past DuckDB's memory limit."""
    n = len(keys)
    budget = _SORT_BUDGET.get()
    sorted_keys = memory.column_array(n, keys.dtype)
    order = memory.column_array(n, np.uint32)
    if con is None or budget is None or n * 24 <= budget:
        rows = np.argsort(keys, kind="stable")
        np.take(keys, rows, out=sorted_keys)
        order[:] = rows
        return sorted_keys, order

    def batches() -> Iterator[pa.RecordBatch]:
        for a in range(0, n, memory.CHUNK_ROWS):
            b = min(a + memory.CHUNK_ROWS, n)
            yield pa.record_batch([pa.array(keys[a:b]), pa.array(np.arange(a, b, dtype=np.uint32))], names=["k", "i"])

    schema = pa.schema([("k", pa.from_numpy_dtype(keys.dtype)), ("i", pa.uint32())])
    name = f"__headwater_keys_{os.getpid()}_{id(keys):x}"
    con.register(name, pa.RecordBatchReader.from_batches(schema, batches()))
    try:
        at = 0
        for batch in con.execute(f"SELECT k, i FROM {quote(name)} ORDER BY k").to_arrow_reader(memory.CHUNK_ROWS):
            m = batch.num_rows
            sorted_keys[at : at + m] = batch.column(0).to_numpy()
            order[at : at + m] = batch.column(1).to_numpy()
            at += m
    finally:
        con.unregister(name)
    if at != n:
        raise RuntimeError(f"DuckDB sorted {at} of {n} keys")
    return sorted_keys, order



def _duplicates(sorted_keys: np.ndarray) -> tuple[int, Any, int]:
    """(how many distinct values appear more than once, the smallest of them,
    how many times it appears) in ascending ``sorted_keys``, chunk by chunk."""
    n = len(sorted_keys)
    num, first, prev_eq = 0, None, False
    for a in range(0, max(n - 1, 0), memory.CHUNK_ROWS):
        s = np.asarray(sorted_keys[a : min(a + memory.CHUNK_ROWS + 1, n)])
        eq = s[1:] == s[:-1]
        starts = eq & ~np.concatenate([[prev_eq], eq[:-1]])
        if first is None and starts.any():
            first = s[int(np.argmax(starts))]
        num += int(np.count_nonzero(starts))
        prev_eq = bool(eq[-1])
    if first is None:
        return 0, None, 0
    times = int(np.searchsorted(sorted_keys, first, "right") - np.searchsorted(sorted_keys, first, "left"))
    return num, first.item(), times



def _grouped_duplicates(con: duckdb.DuckDBPyConnection, table: str, key: str) -> tuple[int, Any, int]:
    """What :func:`_duplicates` tells, by a DuckDB ``GROUP BY`` over the key."""
    k = quote(key)
    row = con.execute(
        f"SELECT count(*), min(k), arg_min(n, k) FROM "
        f"(SELECT {k} AS k, count(*) AS n FROM {quote(table)} GROUP BY {k} HAVING count(*) > 1)"
    ).fetchone()
    return (int(row[0]), row[1], int(row[2] or 0)) if row else (0, None, 0)



def _primary_keys(src: Source, plans: list[TablePlan], counts: dict[str, int]) -> dict[str, _KeyIndex]:
    """The primary key column of every referenced or anchor table (``counts``:
    rows per table), checked unique, streamed from the source
    (:meth:`_KeyIndex.stream`)."""
    keys: dict[str, _KeyIndex] = {}
    for p in plans:
        if p.primary_key is None:
            continue
        where = f"table `{p.name}`: primary key `{p.primary_key}`"
        index = _KeyIndex.stream(src.con, p.name, p.primary_key, counts[p.name], where)
        if index.sorted is None:
            num_dup, example, times = _grouped_duplicates(src.con, p.name, p.primary_key)
        else:
            # On the sorted keys: DuckDB's GROUP BY ran out of its memory
            # limit on 30 M keys at a 256 MiB budget.
            num_dup, example, times = _duplicates(index.sorted)
            if num_dup and index.values is not None:
                # Repeated hashes of keys by text: repeated keys, or (rarely)
                # two keys sharing a 64-bit hash, then looked up by Arrow.
                num_dup, example, times = _grouped_duplicates(src.con, p.name, p.primary_key)
                if not num_dup:
                    index = _KeyIndex(_read(src.con, p.name, [p.primary_key]).column(0).combine_chunks())
        if num_dup:
            raise SchemaError(f"{where} has {num_dup} duplicated value(s), e.g. {example!r} appears {times} times")
        keys[p.name] = index
        _release_arrow_memory()
    return keys
