"""The schema file: declared keys, temporal columns, semantic types and tasks.

Format (TOML; JSON with the same structure is accepted too)::

    [tables.<table>]
    primary_key = "col"              # optional, single column
    time_column = "col"              # optional
    foreign_keys = { fk_col = "referenced_table" }
    ignore = false                   # optional: leave the table out
    [tables.<table>.columns]
    col = "categorical"              # a semantic type (see SEMANTIC_TYPES)

    [[tasks]]
    name = "late_orders"             # unique, any non-empty string
    anchor_table = "orders"
    target_stype = "boolean"         # numerical | boolean | timestamp | categorical
    description = "..."              # optional
    column = "o_orderpriority"       # cell task: mask this column of the anchor row
    label_time_column = "col"        # optional, cell task: when a row's label is known
    label_columns = ["col", ...]     # optional, cell task: columns known only with it
    query = "SELECT ..."             # or SQL task: (anchor key, observation time, target)
    window = "90d"                   # optional, SQL task: each label covers (t, t + window]

    [[tasks]]                        # a link task (recommendation): which rows of
    name = "parts_bought_90d"        # `destination_table` will the anchor link to?
    anchor_table = "customer"        # the source table
    destination_table = "part"       # its rows are the candidates (a primary key)
    query = "SELECT ..."             # (source key, observation time, destination key
                                     # or list of keys): the links of (t, t + window]
    window = "90d"                   # required
    target_stype = "boolean"         # optional: a link task's target is "linked"
    candidates = 100                 # optional: candidates ranked per (source, time)
    eval_k = 10                      # optional: the k of MAP@k, recall@k, NDCG@k

Unknown keys and bad values raise ``SchemaError`` naming the key path.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headwater.errors import SchemaError
from headwater.hints import did_you_mean, first_unknown_hint

SEMANTIC_TYPES = (
    "identifier",
    "numerical",
    "timestamp",
    "boolean",
    "categorical",
    "text",
    "ignored",
)
TARGET_STYPES = ("numerical", "boolean", "timestamp", "categorical")


@dataclass
class TableSchema:
    primary_key: str | None = None
    time_column: str | None = None
    foreign_keys: dict[str, str] | None = None
    ignore: bool = False
    columns: dict[str, str] = field(default_factory=dict)
    # Which of the optional keys were given (an override may clear a key).
    given: set[str] = field(default_factory=set)


@dataclass
class TaskSchema:
    name: str
    anchor_table: str
    target_stype: str
    column: str | None = None
    query: str | None = None
    description: str | None = None
    # Cell tasks: when a row's label becomes known (default: the row's own
    # time) and the anchor-row columns known only with it.
    label_time_column: str | None = None
    label_columns: list[str] = field(default_factory=list)
    # SQL tasks: the label window in µs (each label covers (t, t + window],
    # known at its end); None: not declared.
    window_us: int | None = None
    # Link tasks: the table whose rows are linked to, the candidates ranked
    # per (source, time) and the k of the ranking metrics.
    destination_table: str | None = None
    candidates: int = 100
    eval_k: int = 10


@dataclass
class Schema:
    tables: dict[str, TableSchema] = field(default_factory=dict)
    tasks: list[TaskSchema] = field(default_factory=list)
    path: str | None = None


def _check_keys(where: str, d: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise SchemaError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}"
            f"{first_unknown_hint(unknown, allowed)} (allowed: {', '.join(sorted(allowed))})"
        )


def _str(where: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise SchemaError(f"{where}: expected a non-empty string, got {v!r}")
    return v


def _parse_table(where: str, t: Any) -> TableSchema:
    """One ``[tables.<name>]`` entry."""
    if not isinstance(t, dict):
        raise SchemaError(f"{where}: expected a table")
    _check_keys(where, t, {"primary_key", "time_column", "foreign_keys", "ignore", "columns"})
    ts = TableSchema(given=set(t))
    if "primary_key" in t:
        ts.primary_key = _str(f"{where}.primary_key", t["primary_key"])
    if "time_column" in t:
        ts.time_column = _str(f"{where}.time_column", t["time_column"])
    if "foreign_keys" in t:
        fks = t["foreign_keys"]
        if not isinstance(fks, dict):
            raise SchemaError(f"{where}.foreign_keys: expected {{ column = \"table\" }}")
        ts.foreign_keys = {
            _str(f"{where}.foreign_keys", k): _str(f"{where}.foreign_keys.{k}", v)
            for k, v in fks.items()
        }
    if "ignore" in t:
        if not isinstance(t["ignore"], bool):
            raise SchemaError(f"{where}.ignore: expected true or false, got {t['ignore']!r}")
        ts.ignore = t["ignore"]
    ts.columns = _parse_columns(where, t.get("columns", {}))
    return ts


def _parse_columns(where: str, cols: Any) -> dict[str, str]:
    if not isinstance(cols, dict):
        raise SchemaError(f"{where}.columns: expected {{ column = \"semantic type\" }}")
    for c, st in cols.items():
        if st not in SEMANTIC_TYPES:
            raise SchemaError(
                f"{where}.columns.{c}: unknown semantic type {st!r}"
                f"{did_you_mean(str(st), SEMANTIC_TYPES)} "
                f"(expected one of {', '.join(SEMANTIC_TYPES)})"
            )
    return dict(cols)


_US = {"us": 1, "s": 10**6, "min": 60 * 10**6, "h": 3600 * 10**6, "d": 86400 * 10**6}
_US["w"] = 7 * _US["d"]
_WORDS = {"second": "s", "minute": "min", "hour": "h", "day": "d", "week": "w"}
DURATION_FORM = (
    'a positive whole number and a unit: "90d", "12h", "30min", "45s", "2w" (d days, h hours, '
    'min minutes, s seconds, w weeks), or ISO 8601 without years or months: "P90D", "PT12H", '
    '"P1DT6H", "P2W"'
)
_ISO = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<min>\d+)M)?(?:(?P<s>\d+)S)?)?"
)


def parse_duration(value: Any, where: str) -> int:
    """A duration in µs: ``"90d"``-style (:data:`DURATION_FORM`), ISO 8601
    (``"P90D"``), or RelBench's pandas form (``"30 days"``). Months and years
    have no fixed length and are refused; so is zero. Raises
    ``SchemaError`` naming ``where`` and the allowed forms."""
    text = value.strip() if isinstance(value, str) else None
    us = None
    if text:
        m = re.fullmatch(r"(\d+)\s*([a-z]+)", text.lower())
        iso = _ISO.fullmatch(text.upper())
        if m:
            unit = m.group(2)
            unit = _WORDS.get(unit.removesuffix("s"), _WORDS.get(unit, unit))
            if unit in _US:
                us = int(m.group(1)) * _US[unit]
        elif iso and text.upper() not in ("P", "PT") and not text.upper().endswith("T"):
            us = sum(int(v) * _US[u] for u, v in iso.groupdict().items() if v)
    if not us:
        raise SchemaError(f"{where}: {value!r} is not a positive duration; expected {DURATION_FORM}")
    return us


def _check_kind_keys(where: str, k: dict[str, Any], cell: bool) -> None:
    """The keys of one kind of task only: a cell task's label rule, a SQL
    task's window."""
    for key in ("label_time_column", "label_columns"):
        if key in k and not cell:
            raise SchemaError(
                f"{where}.{key}: only a cell task (`column`) has one; a SQL task's labels "
                "are its query's rows"
            )
    for key in LINK_KEYS[1:]:
        if key in k:
            raise SchemaError(f"{where}.{key}: only a link task (`destination_table`) has one")
    if "window" in k and cell:
        raise SchemaError(
            f"{where}.window: only a SQL task (`query`) has one; a cell task's label is "
            "known at its row's time (or its `label_time_column`)"
        )


#: The keys only a link task (``destination_table``) has.
LINK_KEYS = ("destination_table", "candidates", "eval_k")


def _positive_int(where: str, v: Any, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise SchemaError(f"{where}: expected a whole number >= {low}, got {v!r}")
    return v


def _parse_link(where: str, k: dict[str, Any], name: str) -> TaskSchema:
    """A link task: ``destination_table``, a ``query`` of (source key,
    observation time, destination key or list of keys), a ``window``."""
    for key in ("column", "label_time_column", "label_columns"):
        if key in k:
            raise SchemaError(f"{where}.{key}: a link task has none; its links are its query's rows")
    for req in ("query", "window"):
        if req not in k:
            raise SchemaError(
                f"{where}: a link task (`destination_table`) needs `{req}` "
                "(query: source key, observation time, destination key(s); window: a duration)"
            )
    if k.get("target_stype", "boolean") != "boolean":
        raise SchemaError(
            f"{where}.target_stype: a link task predicts whether a link forms: \"boolean\", "
            f"got {k['target_stype']!r}"
        )
    cand = _positive_int(f"{where}.candidates", k.get("candidates", 100), 1)
    eval_k = _positive_int(f"{where}.eval_k", k.get("eval_k", 10), 1)
    if eval_k > cand:
        raise SchemaError(f"{where}.eval_k: {eval_k} is above `candidates` ({cand}); expected 1..{cand}")
    return TaskSchema(
        name=name,
        anchor_table=_str(f"{where}.anchor_table", k["anchor_table"]),
        target_stype="boolean",
        query=_str(f"{where}.query", k["query"]),
        description=k.get("description"),
        window_us=parse_duration(k["window"], f"{where}.window"),
        destination_table=_str(f"{where}.destination_table", k["destination_table"]),
        candidates=cand,
        eval_k=eval_k,
    )


def _parse_task(src: str, i: int, k: Any, names: set[str]) -> TaskSchema:
    """One ``[[tasks]]`` entry (``names``: the names seen so far, updated)."""
    where = f"{src}: tasks[{i}]"
    if not isinstance(k, dict):
        raise SchemaError(f"{where}: expected a table")
    _check_keys(where, k, {"name", "anchor_table", "target_stype", "column", "query", "description",
                           "label_time_column", "label_columns", "window", *LINK_KEYS})
    link = "destination_table" in k
    for req in ("name", "anchor_table") if link else ("name", "anchor_table", "target_stype"):
        if req not in k:
            raise SchemaError(f"{where}: missing required key `{req}`")
    name = _str(f"{where}.name", k["name"])
    where = f"{src}: task `{name}`"
    if name in names:
        raise SchemaError(f"{where}: declared twice")
    names.add(name)
    if link:
        return _parse_link(where, k, name)
    st = k["target_stype"]
    if st not in TARGET_STYPES:
        raise SchemaError(
            f"{where}.target_stype: {st!r} has no decoder head{did_you_mean(str(st), TARGET_STYPES)} "
            f"(expected one of {', '.join(TARGET_STYPES)})"
        )
    has_col, has_q = "column" in k, "query" in k
    if has_col == has_q:
        raise SchemaError(f"{where}: give exactly one of `column` (cell task) or `query` (SQL)")
    _check_kind_keys(where, k, cell=has_col)
    cols = k.get("label_columns", [])
    if not isinstance(cols, list) or not all(isinstance(c, str) and c for c in cols):
        raise SchemaError(f"{where}.label_columns: expected a list of column names, got {cols!r}")
    return TaskSchema(
        name=name,
        anchor_table=_str(f"{where}.anchor_table", k["anchor_table"]),
        target_stype=st,
        column=_str(f"{where}.column", k["column"]) if has_col else None,
        query=_str(f"{where}.query", k["query"]) if has_q else None,
        description=k.get("description"),
        label_time_column=(
            _str(f"{where}.label_time_column", k["label_time_column"])
            if "label_time_column" in k else None
        ),
        label_columns=list(cols),
        window_us=parse_duration(k["window"], f"{where}.window") if "window" in k else None,
    )


def parse_schema(data: dict[str, Any], path: str | None = None) -> Schema:
    """Validate a parsed schema document."""
    src = path or "schema"
    _check_keys(src, data, {"tables", "tasks"})
    schema = Schema(path=path)
    tables = data.get("tables", {})
    if not isinstance(tables, dict):
        raise SchemaError(f"{src}: `tables` must be a table of tables")
    for tname, t in tables.items():
        schema.tables[tname] = _parse_table(f"{src}: tables.{tname}", t)
    tasks = data.get("tasks", [])
    if not isinstance(tasks, list):
        raise SchemaError(f"{src}: `tasks` must be an array of tables ([[tasks]])")
    names: set[str] = set()
    for i, k in enumerate(tasks):
        schema.tasks.append(_parse_task(src, i, k, names))
    return schema


def load_schema(path: str | Path) -> Schema:
    """Read a TOML (or ``.json``) schema file."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"schema file not found: {p}")
    text = p.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise SchemaError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {e}") from e
    return parse_schema(data, str(p))
