"""The preprocessing run's memory budget and where its large arrays live.

``--memory-limit`` is split here: DuckDB gets :data:`DUCKDB_SHARE` of it and
spills to the run's temp directory past that (:func:`_configure_duckdb`);
columns are streamed :data:`CHUNK_ROWS` rows at a time; whole-column arrays of
at least :data:`SPILL_MIN_ROWS` rows are file-backed maps in the run's spill
directory (:func:`column_array`, :class:`_Spool`), page cache rather than the
process's private memory. The spill directory and the key-sort budget are
context variables set by :func:`headwater.preprocessing.pipeline.preprocess`
for the length of a run (outside a run nothing is spilled).

The other preprocessing modules read ``memory.CHUNK_ROWS`` and call
``memory.column_array`` through this module rather than importing the names,
so one setting governs the whole run (and a test that changes it changes it
everywhere). Names with a leading underscore are private to the
``preprocessing`` package.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from headwater.errors import SchemaError

# Rows per record batch when a column is streamed out of DuckDB.
CHUNK_ROWS = 1 << 20
# `--memory-limit` default: the preprocessing budget, beside the interpreter.
DEFAULT_MEMORY_LIMIT = "2GiB"
# DuckDB gets this share of the budget (it spills to `temp_directory` past
# it); the rest is for the column being encoded and the Rust writer.
DUCKDB_SHARE = 3

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def parse_size(size: str | int) -> int:
    """``512MiB``, ``2GiB``, ``1.5G``, ``300MB`` or a byte count → bytes."""
    if isinstance(size, int):
        value, unit = float(size), ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", size)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"memory_limit {size!r}: expected a size such as 512MiB, 2GiB or 300MB")
        value, unit = float(m.group(1)), m.group(2).lower()
    n = int(value * _UNITS[unit])
    if n < 48 << 20:
        raise ValueError(f"memory_limit {size!r}: at least 48MiB (DuckDB needs a few buffers per thread)")
    return n


def _configure_duckdb(con: duckdb.DuckDBPyConnection, budget: int, temp_dir: Path) -> None:
    """Bound DuckDB to its share of the budget, spilling to ``temp_dir``."""
    temp_dir.mkdir(parents=True, exist_ok=True)
    # DuckDB's thread count is left alone: results of parallel float
    # aggregates in SQL tasks depend on it, and the output must not depend
    # on the budget.
    con.execute(f"SET memory_limit='{budget // DUCKDB_SHARE >> 20}MiB'")
    con.execute(f"SET temp_directory='{str(temp_dir).replace(chr(39), chr(39) * 2)}'")
    # Rows must come back in table order (row ids follow it).
    con.execute("SET preserve_insertion_order=true")


def _release_arrow_memory() -> None:
    """Hand the memory Arrow's pool keeps after freeing back to the system.
    Its allocator retains freed pages for reuse: after the primary keys of
    TPC-H SF10 (141 MiB of arrays) the process held 1.5 GiB of private memory
    that the pool had used and freed, 0.2 GiB after this call."""
    pa.default_memory_pool().release_unused()


Put = Callable[[np.ndarray, "np.ndarray | None"], None]

#: Where whole-column arrays of a run are spilled (the run's
#: ``OUT_DIR.duckdb_tmp``); ``None`` outside :func:`preprocess`.
_SPILL_DIR: ContextVar[Path | None] = ContextVar("headwater_spill_dir", default=None)
# Bytes a primary-key sort may take in private memory during a run (None: no
# bound, outside a run); larger sorts are DuckDB's (see `_sort_keys`).
_SORT_BUDGET: ContextVar[int | None] = ContextVar("headwater_sort_budget", default=None)

#: Columns of at least this many rows are spilled.
SPILL_MIN_ROWS = 1 << 20


def column_array(n: int, dtype: Any) -> np.ndarray:
    """An uninitialised array of ``n`` values. A large one, during a run, is a
    file-backed map in the run's spill directory whose file is unlinked at
    once: its pages are page cache (written back and dropped under memory
    pressure, freed with the array), not the process's private memory, so a
    table's columns, row times and foreign keys cost the process nothing per
    row while they wait for the writer."""
    spill = _SPILL_DIR.get()
    if spill is None or n < SPILL_MIN_ROWS:
        return np.empty(n, dtype=dtype)
    spill.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=spill, suffix=".col") as f:
        return np.memmap(f, dtype=dtype, mode="w+", shape=(n,))


def _into(
    n: int, dtype: Any, where: str, with_valid: bool = True
) -> tuple[np.ndarray, np.ndarray, Put, Callable[[], None]]:
    """Preallocated ``(values, valid)`` of ``n`` rows (``valid`` empty unless
    ``with_valid``; both spilled when large, see :func:`column_array`), a
    chunk appender, and the final row-count check."""
    values = column_array(n, dtype)
    valid = column_array(n if with_valid else 0, np.uint8)
    at = [0]

    def put(v: np.ndarray, ok: np.ndarray | None) -> None:
        a, k = at[0], len(v)
        if a + k > n:
            raise SchemaError(f"{where}: more than the {n} rows counted (did the source change while reading?)")
        values[a : a + k] = v
        if ok is not None:
            valid[a : a + k] = ok
        at[0] = a + k

    def done() -> None:
        if at[0] != n:
            raise SchemaError(f"{where}: read {at[0]} rows, the table has {n}")

    return values, valid, put, done


class _Spool:
    """Values of a count not known in advance, appended chunk by chunk: during
    a run, to an unlinked file in the run's spill directory, mapped whole when
    complete (page cache, not private memory); outside a run, in memory. The
    file is opened by the first non-empty append (a spool that stays empty,
    such as a task's split codes without a split column, opens none)."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.parts: list[np.ndarray] = []
        self.spill = _SPILL_DIR.get()
        self.file: Any = None

    def append(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        if not len(a):
            return
        self.n += len(a)
        if self.spill is None:
            self.parts.append(a)
            return
        if self.file is None:
            self.spill.mkdir(parents=True, exist_ok=True)
            # Closed by array(), whose map then keeps the pages alive.
            self.file = tempfile.TemporaryFile(dir=self.spill, suffix=".spool")  # noqa: SIM115
        a.tofile(self.file)

    def array(self) -> np.ndarray:
        if self.file is None:
            return np.concatenate(self.parts) if self.parts else np.empty(0, self.dtype)
        self.file.flush()
        out = np.memmap(self.file, dtype=self.dtype, mode="r+", shape=(self.n,)) if self.n else np.empty(0, self.dtype)
        self.file.close()  # the map keeps the unlinked file's pages
        return out
