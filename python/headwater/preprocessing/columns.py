"""Columns out of DuckDB and into the writer's typed arrays: reading a
table's columns (whole or in chunks of ``memory.CHUNK_ROWS`` rows, in table
order), the Arrow → NumPy conversions (validity, timestamps to µs, filled
values, dictionaries) and the encoding of each semantic type, whole
(:func:`encode_column`) or streamed a chunk at a time into preallocated
(possibly spilled) arrays. A column is never whole in Python memory while it
streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater import _native
from headwater.errors import SchemaError
from headwater.preprocessing import memory
from headwater.preprocessing.memory import _into
from headwater.preprocessing.sources import quote

I64_MIN = np.iinfo(np.int64).min
I64_MAX = np.iinfo(np.int64).max


def _read(con: duckdb.DuckDBPyConnection, table: str, cols: list[str]) -> pa.Table:
    sel = ", ".join(quote(c) for c in cols) if cols else "1 AS __dummy"
    return con.execute(f"SELECT {sel} FROM {quote(table)}").to_arrow_table()



def _read_count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    row = con.execute(f"SELECT count(*) FROM {quote(table)}").fetchone()
    return int(row[0]) if row else 0



def _valid(col: pa.Array) -> np.ndarray:
    if col.null_count == 0:
        return np.ones(len(col), dtype=np.uint8)
    return np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=np.uint8)



def _to_micros(col: pa.Array, where: str) -> pa.Array:
    t = col.type
    try:
        if pa.types.is_date(t):
            col = col.cast(pa.timestamp("us"))
        elif pa.types.is_timestamp(t):
            if t.unit == "ns":
                # Stored in µs: drop sub-µs digits (floor), rather than fail.
                col = pc.floor_temporal(col, unit="microsecond")
            col = col.cast(pa.timestamp("us", t.tz))
        else:
            col = col.cast(pa.timestamp("us"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaError(f"{where}: cannot read {t} as a timestamp: {e}") from e
    return col.cast(pa.int64())



def _fill(col: pa.Array, value: Any, dtype: Any) -> np.ndarray:
    return np.ascontiguousarray(pc.fill_null(col, value).to_numpy(zero_copy_only=False), dtype=dtype)



def _dictionary(col: pa.Array, sort: bool) -> tuple[np.ndarray, pa.Array]:
    enc = pc.dictionary_encode(col)
    idx = enc.indices
    dictionary = enc.dictionary
    if sort and len(dictionary):
        order = pc.array_sort_indices(dictionary).to_numpy()
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        dictionary = dictionary.take(pa.array(order))
        codes = rank[_fill(idx, 0, np.int64)]
    else:
        codes = _fill(idx, 0, np.int64)
    return np.ascontiguousarray(codes, dtype=np.uint32), dictionary



def encode_column(stype: str, col: pa.Array, where: str) -> tuple[Any, Any, Any]:
    """Typed arrays for the Rust writer: ``(values, valid, extra)`` (text
    columns are interned chunk by chunk instead, :func:`_stream_text`)."""
    valid = _valid(col)
    try:
        if stype == "numerical":
            vals = col.cast(pa.float64())
            return _fill(vals, 0.0, np.float64), valid, None
        if stype == "boolean":
            vals = col if pa.types.is_boolean(col.type) else pc.not_equal(col.cast(pa.float64()), 0)
            return _fill(vals.cast(pa.uint8()), 0, np.uint8), valid, None
        if stype == "timestamp":
            return _fill(_to_micros(col, where), 0, np.int64), valid, None
        if stype == "categorical":
            codes, dictionary = _dictionary(col.cast(pa.string()), sort=True)
            return codes, valid, [str(v) for v in dictionary.to_pylist()]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise SchemaError(f"{where}: cannot encode {col.type} as {stype}: {e}") from e
    raise SchemaError(f"{where}: semantic type {stype} cannot be encoded")



def _string_buffers(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A ``large_string`` array's end offsets (``len(a) + 1``, into the data,
    not rebased) and its data buffer, as NumPy views."""
    _, offs_buf, data_buf = a.buffers()
    offs = np.frombuffer(offs_buf, dtype=np.int64)[a.offset : a.offset + len(a) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offs, data



def _chunks(con: duckdb.DuckDBPyConnection, table: str, col: str) -> Iterator[pa.Array]:
    """One column of ``table`` in record batches of :data:`memory.CHUNK_ROWS` rows,
    in table order: never the whole column in Python memory."""
    reader = con.execute(f"SELECT {quote(col)} FROM {quote(table)}").to_arrow_reader(memory.CHUNK_ROWS)
    for batch in reader:
        yield batch.column(0)



def _column_type(con: duckdb.DuckDBPyConnection, table: str, col: str) -> pa.DataType:
    return con.execute(f"SELECT {quote(col)} FROM {quote(table)} LIMIT 0").to_arrow_table().schema.field(0).type



def _string_stats(con: duckdb.DuckDBPyConnection, table: str, col: str) -> tuple[int, int, bool]:
    """(non-null values, distinct values, any value with a space), computed by
    DuckDB. Distinct values are counted by a GROUP BY, which spills to disk
    past the memory limit (``count(DISTINCT ...)`` does not)."""
    q, t = quote(col), quote(table)
    row = con.execute(
        f"SELECT (SELECT count({q}) FROM {t}), "
        f"(SELECT count(*) FROM (SELECT {q} FROM {t} WHERE {q} IS NOT NULL GROUP BY {q})), "
        f"(SELECT coalesce(bool_or(contains(CAST({q} AS VARCHAR), ' ')), false) FROM {t})"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), bool(row[2])



# What each fixed-width semantic type is stored as.
FIXED_DTYPES = {"numerical": np.float64, "boolean": np.uint8, "timestamp": np.int64}



def _stream_fixed(con: duckdb.DuckDBPyConnection, table: str, col: str, stype: str, n: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    values, valid, put, done = _into(n, FIXED_DTYPES[stype], where)
    for chunk in _chunks(con, table, col):
        v, ok, _ = encode_column(stype, chunk, where)
        put(v, ok)
    done()
    return values, valid



def _stream_categorical(con: duckdb.DuckDBPyConnection, table: str, col: str, n: int, where: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Two passes: the distinct values (sorted, as :func:`encode_column` sorts
    them), then each chunk's codes; memory is one chunk plus the categories."""
    try:
        seen = [pc.unique(c.cast(pa.string())) for c in _chunks(con, table, col)]
        uniq = pc.unique(pa.chunked_array(seen, type=pa.string())).drop_null() if seen else pa.array([], pa.string())
        dictionary = uniq.take(pc.array_sort_indices(uniq))
        values, valid, put, done = _into(n, np.uint32, where)
        for chunk in _chunks(con, table, col):
            s = chunk.cast(pa.string())
            put(_fill(pc.index_in(s, value_set=dictionary), 0, np.uint32), _valid(s))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise SchemaError(f"{where}: cannot encode as categorical: {e}") from e
    done()
    return values, valid, [str(v) for v in dictionary.to_pylist()]



def _stream_text(
    writer: _native.DatabaseWriter, con: duckdb.DuckDBPyConnection, table: str, col: str, n: int, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """A text column's global text ids, chunk by chunk: each chunk's
    dictionary (first appearance first) is interned by the writer, so new
    values are numbered in their order of first appearance in the column, as
    a whole-column dictionary would number them; memory is one chunk."""
    ids, valid, put, done = _into(n, np.uint32, where)
    for chunk in _chunks(con, table, col):
        try:
            codes, dictionary = _dictionary(chunk.cast(pa.large_string()), sort=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise SchemaError(f"{where}: cannot encode {chunk.type} as text: {e}") from e
        offs, data = _string_buffers(dictionary.cast(pa.large_string()))
        chunk_ids = writer.intern_texts(np.ascontiguousarray(offs), np.ascontiguousarray(data))
        put(chunk_ids[codes] if len(chunk_ids) else np.zeros(len(codes), np.uint32), _valid(chunk))
    done()
    return ids, valid
