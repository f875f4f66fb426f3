"""One table into the writer: each column's semantic type (declared, else
inferred), its values streamed and encoded a chunk at a time, the row times,
and each foreign key resolved to parent rows through the target's primary
key index (dangling values counted, reported and dropped). Peak memory is one
column's encoded arrays, never the table. A table staged by an interrupted
run gets its semantic types back from the staged metadata
(:func:`_restore_stypes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from headwater import _native
from headwater.errors import SchemaError
from headwater.preprocessing import memory
from headwater.preprocessing.columns import (
    FIXED_DTYPES,
    I64_MIN,
    _chunks,
    _column_type,
    _fill,
    _read_count,
    _stream_categorical,
    _stream_fixed,
    _stream_text,
    _string_stats,
    _to_micros,
)
from headwater.preprocessing.infer import infer_stype
from headwater.preprocessing.memory import _into, _release_arrow_memory
from headwater.preprocessing.plan import TablePlan
from headwater.preprocessing.primary_keys import _KeyIndex
from headwater.preprocessing.sources import Source


def _column_stype(
    src: Source, plan: TablePlan, c: str, is_key: bool, log: Callable[[str], None]
) -> tuple[str, str]:
    """The column's semantic type and why: declared, else inferred from its
    type (and, for strings, counts DuckDB computes) without reading it here."""
    declared = plan.declared.get(c)
    if declared is not None and is_key and declared not in ("identifier", "ignored"):
        raise SchemaError(f"table `{plan.name}` column `{c}` is a key; it cannot be {declared}")
    if declared is not None:
        return declared, "declared"
    t = _column_type(src.con, plan.name, c)
    st, reason = infer_stype(c, t, is_key, lambda: _string_stats(src.con, plan.name, c))
    log(f"  {plan.name}.{c}: inferred {st} ({reason})")
    return st, reason



def _add_column(
    writer: _native.DatabaseWriter, src: Source, plan: TablePlan, c: str, st: str, inferred: bool, n: int
) -> None:
    """Read, encode and hand over one column; the arrays die with this call."""
    types = dict(plan.source.columns)
    where = f"table `{plan.name}` column `{c}`"
    if st in ("identifier", "ignored"):
        writer.add_column(c, st, types[c], inferred)
    elif st in FIXED_DTYPES:
        values, valid = _stream_fixed(src.con, plan.name, c, st, n, where)
        writer.add_column(c, st, types[c], inferred, values, valid)
    elif st == "categorical":
        codes, valid, cats = _stream_categorical(src.con, plan.name, c, n, where)
        writer.add_column(c, st, types[c], inferred, codes, valid, cats)
    else:
        ids, valid = _stream_text(writer, src.con, plan.name, c, n, where)
        writer.add_column(c, st, types[c], inferred, ids, valid, None)



def _add_table(
    writer: _native.DatabaseWriter,
    src: Source,
    plan: TablePlan,
    keys: dict[str, _KeyIndex],
    log: Callable[[str], None],
    fingerprint: str,
) -> None:
    """Stream one table into the writer, one column at a time, each column in
    chunks: peak memory is one column's encoded arrays, never the table."""
    key_cols = {c for c in [plan.primary_key, *plan.foreign_keys] if c}
    n = _read_count(src.con, plan.name)
    for c, _ in plan.source.columns:
        plan.stypes[c], plan.reasons[c] = _column_stype(src, plan, c, c in key_cols, log)
    stored = sum(1 for st in plan.stypes.values() if st not in ("identifier", "ignored"))
    # The row times go first: with a statistics cutoff only the rows dated at
    # or before it feed the columns' statistics (held beside one column).
    row_time = _row_times(src, plan, n)
    writer.begin_table(plan.name, n, plan.primary_key, plan.time_column, fingerprint, stored)
    writer.set_row_times(row_time)
    for c, _ in plan.source.columns:
        _add_column(writer, src, plan, c, plan.stypes[c], plan.reasons[c] != "declared", n)
        _release_arrow_memory()
    fks = _foreign_keys(src, plan, keys, n, log)
    writer.end_table(row_time, fks)



def _row_times(src: Source, plan: TablePlan, n: int) -> np.ndarray:
    """The table's row times in µs (``I64_MIN`` where undated or without a
    time column), a chunk at a time."""
    if not plan.time_column:
        row_time = memory.column_array(n, np.int64)
        row_time.fill(I64_MIN)
        return row_time
    where = f"table `{plan.name}` time column"
    row_time, _, put, done = _into(n, np.int64, where, with_valid=False)
    for chunk in _chunks(src.con, plan.name, plan.time_column):
        put(_fill(_to_micros(chunk, where), I64_MIN, np.int64), None)
    done()
    return row_time



def _foreign_keys(
    src: Source, plan: TablePlan, keys: dict[str, _KeyIndex], n: int, log: Callable[[str], None]
) -> list[tuple[Any, ...]]:
    """Each foreign key of ``plan`` as row indices into its target (-1: null
    or dangling), resolved chunk by chunk against the target's primary key."""
    fks = []
    for fk, target in plan.foreign_keys.items():
        where = f"table `{plan.name}` foreign key `{fk}` → `{target}`"
        parents, _, put, done = _into(n, np.int64, where, with_valid=False)
        num_null = num_dangling = 0
        for col in _chunks(src.con, plan.name, fk):
            rows, unmatched = keys[target].rows(col, where)
            num_null += col.null_count
            num_dangling += unmatched
            put(rows, None)
        done()
        if num_dangling:
            log(f"  warning: {where}: {num_dangling} value(s) match no row of `{target}`; edges dropped")
        fks.append((fk, target, parents, num_null, num_dangling))
        _release_arrow_memory()
    return fks



def _restore_stypes(writer: _native.DatabaseWriter, plan: TablePlan) -> None:
    table = writer.num_tables() - 1
    for c in json.loads(writer.columns_json()):
        if c["table"] == table and c["slot"] is not None:
            plan.stypes.setdefault(c["name"], c["stype"])
    for c, _ in plan.source.columns:
        plan.stypes.setdefault(c, plan.declared.get(c, "ignored"))
