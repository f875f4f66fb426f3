"""The database's tasks: the schema's (SQL queries over the source, or a
column's cells), else the source's (RelBench label files, each row keeping
its file's split), else one cell-masking task per eligible column. A query's
result streams record batch by record batch (:class:`_TaskResult`): anchors
resolved to rows through the anchor table's primary key index, observation
times, targets encoded per chunk, all spooled; never the whole result in
memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headwater import _native
from headwater.errors import SchemaError
from headwater.hints import did_you_mean
from headwater.preprocessing import memory
from headwater.preprocessing.columns import (
    FIXED_DTYPES,
    I64_MAX,
    _dictionary,
    _fill,
    _to_micros,
    _valid,
    encode_column,
)
from headwater.preprocessing.links import LinkSpec, labels_query, pairs_table
from headwater.preprocessing.memory import _release_arrow_memory, _Spool
from headwater.preprocessing.plan import TablePlan
from headwater.preprocessing.primary_keys import _KeyIndex
from headwater.preprocessing.row_order import SEEDS_BY_ROW
from headwater.preprocessing.schema import Schema, TaskSchema
from headwater.preprocessing.sources import RELBENCH_SPLIT_CODES, Source, quote


def _task_batches(reader: Any, name: str, what: str) -> Iterator[pa.RecordBatch]:
    """``reader``'s record batches; DuckDB errors raised while the result
    streams name the task."""
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (duckdb.Error, pa.ArrowException) as e:
            raise SchemaError(f"task `{name}`: {what}: {e}") from e
        yield batch



class _TaskResult:
    """A value task's (anchor key, observation time, target[, split code])
    result, taken in record batch by record batch: the anchors' rows,
    observation times, targets (encoded per chunk) and split codes go to
    spools. A categorical target's codes are numbered by first appearance
    while it streams, then renumbered in place to the sorted dictionary
    :func:`encode_column` makes of the whole column."""

    def __init__(self, index: _KeyIndex, name: str, target_stype: str, with_splits: bool) -> None:
        self.index, self.name, self.stype, self.with_splits = index, name, target_stype, with_splits
        self.rows, self.obs, self.splits = _Spool(np.uint32), _Spool(np.int64), _Spool(np.uint8)
        self.values = _Spool(FIXED_DTYPES.get(target_stype, np.uint32))
        self.valid = _Spool(np.uint8)
        # Categorical targets: each category's code in order of appearance.
        self.categories: dict[str, int] = {}
        self.total = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.total += batch.num_rows
        idx = self.index.rows(batch.column(0), f"task `{self.name}`: anchor values")[0]
        kept = idx >= 0
        mask = None if kept.all() else pa.array(kept)
        self.rows.append(idx if mask is None else idx[kept])
        del idx
        cols = [c if mask is None else c.filter(mask) for c in batch.columns[1:]]
        o = cols[0]
        # A bare `NULL` comes back typed (DuckDB: INTEGER): null = non-temporal.
        if pa.types.is_null(o.type) or o.null_count == len(o):
            self.obs.append(np.full(len(o), I64_MAX, dtype=np.int64))
        else:
            self.obs.append(_fill(_to_micros(o, f"task `{self.name}` observation time"), I64_MAX, np.int64))
        if self.stype == "categorical":
            self.values.append(self._category_codes(cols[1]))
            self.valid.append(_valid(cols[1]))
        else:
            v, ok, _ = encode_column(self.stype, cols[1], f"task `{self.name}` target")
            self.values.append(v)
            self.valid.append(ok)
        if self.with_splits:
            self.splits.append(cols[2].to_numpy(zero_copy_only=False))

    def _category_codes(self, col: pa.Array) -> np.ndarray:
        """A chunk's codes in order of first appearance across the task."""
        try:
            codes, dictionary = _dictionary(col.cast(pa.string()), sort=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise SchemaError(f"task `{self.name}` target: cannot encode {col.type} as categorical: {e}") from e
        known = self.categories
        local = np.array([known.setdefault(v, len(known)) for v in dictionary.to_pylist()], dtype=np.uint32)
        return local[codes] if len(local) else np.zeros(len(codes), np.uint32)

    def target(self) -> tuple[Any, Any, Any]:
        values, valid = self.values.array(), self.valid.array()
        if self.stype != "categorical":
            return values, valid, None
        # Renumber to the sorted dictionary, a chunk at a time in place.
        names = pa.array(list(self.categories), pa.string())
        order = pc.array_sort_indices(names).to_numpy()
        rank = np.empty(len(order), np.uint32)
        rank[order] = np.arange(len(order), dtype=np.uint32)
        for a in range(0, len(values) if len(rank) else 0, memory.CHUNK_ROWS):
            values[a : a + memory.CHUNK_ROWS] = rank[values[a : a + memory.CHUNK_ROWS]]
        return values, valid, [str(v) for v in names.take(pa.array(order)).to_pylist()]



def _add_value_task(
    writer: _native.DatabaseWriter,
    keys: dict[str, _KeyIndex],
    *,
    name: str,
    kind: str,
    anchor_table: str,
    reader: Any,
    target_stype: str,
    query: str | None,
    description: str | None,
    log: Callable[[str], None],
    what: str,
    with_splits: bool = False,
) -> None:
    """Add a task from a streamed (anchor key, observation time, target)
    result (:class:`_TaskResult`), never the whole result in memory;
    ``with_splits``: a fourth column holds each seed's stored split
    (0 train, 1 val, 2 test) instead of the hash rule's."""
    names = reader.schema.names
    if len(names) != 3 + with_splits:
        raise SchemaError(
            f"task `{name}`: the query returns {len(names)} columns "
            f"({', '.join(names)}); expected 3: anchor key, observation time, target"
        )
    if anchor_table not in keys:
        raise SchemaError(f"task `{name}`: anchor table `{anchor_table}` has no primary key to match anchors against")
    res = _TaskResult(keys[anchor_table], name, target_stype, with_splits)
    for batch in _task_batches(reader, name, what):
        res.add(batch)
    if res.total == 0:
        raise SchemaError(f"task `{name}` has zero rows (no seeds)")
    dropped = res.total - res.rows.n
    if dropped:
        log(f"  warning: task `{name}`: {dropped} row(s) whose anchor matches no row of `{anchor_table}` dropped")
    if dropped == res.total:
        raise SchemaError(f"task `{name}`: no anchor value matches a primary key of `{anchor_table}` (zero seeds)")
    values, valid, extra = res.target()
    rows, obs = res.rows.array(), res.obs.array()
    splits = res.splits.array() if with_splits else None
    if SEEDS_BY_ROW.get():
        # A locality database: seeds in the order of their rows, so a window
        # of consecutive seeds is a stretch of the database.
        by_row = np.lexsort((obs, rows))
        rows, obs, values, valid = rows[by_row], obs[by_row], values[by_row], valid[by_row]
        splits = None if splits is None else splits[by_row]
    writer.add_task(
        name, kind, anchor_table, rows, obs, target_stype, values, valid, extra,
        query, description, splits=splits,
    )
    _release_arrow_memory()



def _add_declared_tasks(
    writer: _native.DatabaseWriter,
    src: Source,
    schema: Schema,
    by_name: dict[str, TablePlan],
    keys: dict[str, _KeyIndex],
    log: Callable[[str], None],
) -> None:
    for t in schema.tasks:
        if t.destination_table is not None:
            continue  # a link task: :func:`add_link_tasks`
        if t.anchor_table not in by_name:
            raise SchemaError(
                f"task `{t.name}`: unknown anchor table `{t.anchor_table}`"
                f"{did_you_mean(t.anchor_table, by_name)} (tables: {', '.join(sorted(by_name))})"
            )
        if t.column is not None:
            plan = by_name[t.anchor_table]
            st = plan.stypes.get(t.column)
            if st is None:
                raise SchemaError(
                    f"task `{t.name}`: table `{t.anchor_table}` has no column `{t.column}`"
                    f"{did_you_mean(t.column, plan.stypes)} (columns: {', '.join(plan.stypes)})"
                )
            if st != t.target_stype:
                raise SchemaError(
                    f"task `{t.name}`: column `{t.anchor_table}.{t.column}` is {st}, "
                    f"but the task declares target_stype = {t.target_stype!r}"
                )
            writer.add_cell_task(t.name, t.anchor_table, t.column, t.description)
            if t.label_time_column is not None or t.label_columns:
                _label_rule(writer, t, plan.stypes)
            continue
        assert t.query is not None
        what = "SQL error from DuckDB"
        try:
            reader = src.con.execute(t.query).to_arrow_reader(memory.CHUNK_ROWS)
        except duckdb.Error as e:
            raise SchemaError(f"task `{t.name}`: {what}: {e}") from e
        _add_value_task(
            writer, keys, name=t.name, kind="sql", anchor_table=t.anchor_table, reader=reader,
            target_stype=t.target_stype, query=t.query, description=t.description, log=log, what=what,
        )
        if t.window_us is not None:
            writer.set_window(t.name, t.window_us)






def _label_rule(writer: Any, t: TaskSchema, stypes: dict[str, str]) -> None:
    """Record when cell task ``t``'s labels become known (its
    ``label_time_column``, a timestamp column of the anchor table) and the
    anchor-row columns known only with them (``label_columns``)."""
    where = f"task `{t.name}`"
    col = t.label_time_column
    if col is not None and stypes.get(col) != "timestamp":
        what = "has no such column" if col not in stypes else f"holds {stypes[col]} values"
        raise SchemaError(
            f"{where}.label_time_column: `{t.anchor_table}.{col}` {what}; expected a timestamp "
            f"column of `{t.anchor_table}` ({', '.join(c for c, s in stypes.items() if s == 'timestamp') or 'none'})"
        )
    for c in t.label_columns:
        if c not in stypes:
            raise SchemaError(
                f"{where}.label_columns: table `{t.anchor_table}` has no column `{c}`"
                f"{did_you_mean(c, stypes)} (columns: {', '.join(stypes)})"
            )
    writer.set_label_rule(t.name, col, t.label_columns)


def _add_relbench_tasks(
    writer: _native.DatabaseWriter,
    src: Source,
    by_name: dict[str, TablePlan],
    keys: dict[str, _KeyIndex],
    log: Callable[[str], None],
) -> None:
    for k in src.tasks:
        if k.anchor_table not in by_name:
            raise SchemaError(f"task `{k.name}`: unknown entity table `{k.anchor_table}`")
        time_expr = quote(k.time_col) if k.time_col else "NULL"
        # Each row keeps the split of the file it came from (train.parquet →
        # 0, val → 1, test → 2): the task is trained and scored on RelBench's
        # own row sets, not re-split by headwater's hash rule.
        parts = []
        for f in k.label_files:
            code = RELBENCH_SPLIT_CODES.get(f.stem)
            if code is None:
                raise SchemaError(f"task `{k.name}`: label file {f} is not train/val/test.parquet")
            parts.append(
                f"SELECT {quote(k.entity_col)}, {time_expr}, {quote(k.target_col)}, "
                f"{code}::UTINYINT AS __headwater_split "
                f"FROM read_parquet('{str(f).replace(chr(39), chr(39) * 2)}')"
            )
        q = " UNION ALL ".join(parts)
        what = "cannot read its label files"
        try:
            reader = src.con.execute(q).to_arrow_reader(memory.CHUNK_ROWS)
        except duckdb.Error as e:
            raise SchemaError(f"task `{k.name}`: {what}: {e}") from e
        _add_value_task(
            writer, keys, name=k.name, kind="relbench", anchor_table=k.anchor_table, reader=reader,
            target_stype=k.target_stype, query=None, description=k.description, log=log, what=what,
            with_splits=True,
        )
        if k.window_us is not None:
            writer.set_window(k.name, k.window_us)



def _add_cell_tasks(
    writer: _native.DatabaseWriter, plans: list[TablePlan], log: Callable[[str], None]
) -> None:
    """No task declared: one cell-masking task per eligible column with values."""
    created = 0
    # Non-null count per stored column: a column without values has no seeds.
    counts = {
        (c["table"], c["name"]): c["stats"]["count"]
        for c in json.loads(writer.columns_json())
        if c["slot"] is not None
    }
    eligible = ("numerical", "boolean", "timestamp", "categorical")
    for ti, p in enumerate(plans):
        key_cols = {c for c in [p.primary_key, p.time_column, *p.foreign_keys] if c}
        for c, _ in p.source.columns:
            if p.stypes.get(c) not in eligible or c in key_cols:
                continue
            if not counts.get((ti, c)):
                log(f"  {p.name}.{c}: no non-null values, no cell task")
                continue
            writer.add_cell_task(f"{p.name}.{c}", p.name, c, f"mask {p.name}.{c}")
            created += 1
    log(f"no tasks declared: created {created} cell-masking task(s), one per eligible column")



def _add_tasks(
    writer: _native.DatabaseWriter,
    src: Source,
    schema: Schema,
    plans: list[TablePlan],
    keys: dict[str, _KeyIndex],
    log: Callable[[str], None],
) -> None:
    """The schema's tasks, else the source's (RelBench), else cell-masking tasks."""
    by_name = {p.name: p for p in plans}
    if schema.tasks:
        _add_declared_tasks(writer, src, schema, by_name, keys, log)
    elif src.tasks or src.links:
        _add_relbench_tasks(writer, src, by_name, keys, log)
    else:
        _add_cell_tasks(writer, plans, log)


def add_link_tasks(
    writer: _native.DatabaseWriter,
    src: Source,
    specs: list[LinkSpec],
    keys: dict[str, _KeyIndex],
    log: Callable[[str], None],
) -> None:
    """Each link task: one boolean seed per candidate pair of its pairs
    table (:mod:`headwater.preprocessing.links`), its group's split stored."""
    for spec in specs:
        what = "cannot read its candidate pairs"
        reader = src.con.execute(labels_query(spec)).to_arrow_reader(memory.CHUNK_ROWS)
        _add_value_task(
            writer, keys, name=spec.name, kind="link", anchor_table=pairs_table(spec.name),
            reader=reader, target_stype="boolean", query=None, description=spec.description,
            log=log, what=what, with_splits=True,
        )
        writer.set_window(spec.name, spec.window_us)
        if spec.train_recall is not None:
            writer.set_candidate_recall(spec.name, spec.train_recall)
