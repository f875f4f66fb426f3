"""Reading relational sources into one DuckDB connection.

Every source becomes a set of relations queryable by table name in a DuckDB
connection (so SQL tasks run the same way for every source), plus the keys
and temporal columns the source itself declares:

- a RelBench dataset folder (``manifest.yaml`` + ``db/<table>.parquet`` +
  ``tasks/<task>/``), keys and time columns from the manifest;
- a DuckDB database file, keys from its declared constraints;
- a SQLite database file, keys from its declared constraints;
- a directory of ``.parquet`` / ``.csv`` files, one table per file (keys come
  from the schema file).
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from headwater.errors import SchemaError
from headwater.preprocessing.schema import parse_duration


@dataclass
class SourceTable:
    name: str
    columns: list[tuple[str, str]]  # (name, DuckDB type)
    primary_key: str | None = None
    time_column: str | None = None
    foreign_keys: dict[str, str] = field(default_factory=dict)
    # Columns that must not be visible (RelBench `remove_columns`).
    hidden: set[str] = field(default_factory=set)
    identity: str = ""  # what changes when the table's source changes


@dataclass
class SourceTask:
    """A task imported from the source itself (RelBench label tables)."""

    name: str
    anchor_table: str
    entity_col: str
    time_col: str | None
    target_col: str
    target_stype: str
    label_files: list[Path]
    description: str | None
    # The label window in µs (RelBench's `timedelta`); None: not given.
    window_us: int | None = None


@dataclass
class SourceLink:
    """A recommendation task of a RelBench folder (``task_type: recommendation``):
    each label row is a source entity, a time and the list of destination
    entities it links to in (time, time + timedelta]."""

    name: str
    source_table: str
    source_col: str
    destination_table: str
    destination_col: str
    time_col: str
    window_us: int
    eval_k: int
    label_files: list[Path]
    description: str | None


@dataclass
class Source:
    path: Path
    kind: str
    con: duckdb.DuckDBPyConnection
    tables: dict[str, SourceTable]
    tasks: list[SourceTask] = field(default_factory=list)
    links: list[SourceLink] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The validation cutoff (µs since the epoch; RelBench `val_timestamp`):
    # rows dated after it feed no normalisation statistic. None: no time split.
    stats_cutoff_us: int | None = None
    stats_cutoff_from: str = ""  # where the cutoff came from, for the log


def quote(name: str) -> str:
    """A DuckDB quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def _file_identity(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _columns(con: duckdb.DuckDBPyConnection, relation: str) -> list[tuple[str, str]]:
    rel = con.sql(f"SELECT * FROM {relation} LIMIT 0")
    return [(n, str(t)) for n, t in zip(rel.columns, rel.types, strict=False)]


def _new_connection() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions=false; SET autoload_known_extensions=false;")
    return con


def open_source(path: str | os.PathLike[str]) -> Source:
    """Open ``path`` as whichever kind of source it is."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"source not found: {p}")
    if p.is_dir():
        if (p / "manifest.yaml").is_file():
            return _open_relbench(p)
        return _open_file_dir(p)
    try:
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise FileNotFoundError(f"source {p} is not readable: {e}") from e
    if not head:
        raise SchemaError(
            f"source {p}: the file is empty (0 bytes), not a DuckDB or SQLite database"
        )
    if head.startswith(b"SQLite format 3\x00"):
        return _open_sqlite(p)
    if head[8:12] == b"DUCK":
        return _open_duckdb(p)
    raise SchemaError(
        f"source {p}: not a RelBench folder (no manifest.yaml), a directory of Parquet/CSV "
        "files, a DuckDB file or a SQLite file"
    )


def _open_relbench(p: Path) -> Source:
    import yaml

    try:
        manifest = yaml.safe_load((p / "manifest.yaml").read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SchemaError(f"{p / 'manifest.yaml'}: not valid YAML: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tables"), dict):
        raise SchemaError(f"{p / 'manifest.yaml'}: expected a `tables` mapping")
    con = _new_connection()
    tables: dict[str, SourceTable] = {}
    for name, spec in manifest["tables"].items():
        spec = spec or {}
        f = p / "db" / f"{name}.parquet"
        if not f.is_file():
            raise FileNotFoundError(f"{p / 'manifest.yaml'}: table `{name}`: missing {f}")
        con.execute(
            f"CREATE VIEW {quote(name)} AS SELECT * FROM read_parquet('{_sql_str(str(f))}')"
        )
        tables[name] = SourceTable(
            name=name,
            columns=_columns(con, quote(name)),
            primary_key=spec.get("pkey"),
            time_column=spec.get("time_col"),
            foreign_keys=dict(spec.get("fkeys") or {}),
            identity=_file_identity(f),
        )
    src = Source(path=p, kind="relbench", con=con, tables=tables)
    if manifest.get("val_timestamp") is not None:
        where = f"{p / 'manifest.yaml'}: val_timestamp"
        src.stats_cutoff_us = _micros(manifest["val_timestamp"], where)
        src.stats_cutoff_from = f"val_timestamp {manifest['val_timestamp']}"
    tasks_dir = p / "tasks"
    if tasks_dir.is_dir():
        for tdir in sorted(d for d in tasks_dir.iterdir() if d.is_dir()):
            _relbench_task(src, tdir)
    return src


def _micros(value: Any, where: str) -> int:
    """``value`` (a date, datetime or ISO 8601 string, as YAML gives it) in
    µs since the epoch; a naive time is UTC, as naive timestamp columns are."""
    if isinstance(value, dt.datetime):
        d = value
    elif isinstance(value, dt.date):
        d = dt.datetime(value.year, value.month, value.day)
    else:
        try:
            d = dt.datetime.fromisoformat(str(value))
        except ValueError as e:
            raise SchemaError(f"{where}: {value!r} is not an ISO 8601 date or time: {e}") from e
    if d.tzinfo is not None:
        d = d.astimezone(dt.UTC).replace(tzinfo=None)
    return (d - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


#: RelBench label file → the split its rows keep (0 train, 1 val, 2 test).
RELBENCH_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}

_RELBENCH_STYPES = {
    "regression": "numerical",
    "binary_classification": "boolean",
    "multiclass_classification": "categorical",
}


def _relbench_task(src: Source, tdir: Path) -> None:
    import yaml

    mpath = tdir / "manifest.yaml"
    if not mpath.is_file():
        src.warnings.append(f"task folder {tdir} has no manifest.yaml; skipped")
        return
    m: dict[str, Any] = yaml.safe_load(mpath.read_text(encoding="utf-8")) or {}
    name = m.get("name", tdir.name)
    for table, col in m.get("remove_columns") or []:
        if table in src.tables:
            src.tables[table].hidden.add(col)
    files = [tdir / f"{s}.parquet" for s in ("train", "val", "test") if (tdir / f"{s}.parquet").is_file()]
    if m.get("task_type") in ("recommendation", "link_prediction"):
        _relbench_link(src, name, m, files, mpath)
        return
    stype = _RELBENCH_STYPES.get(m.get("task_type", ""))
    if stype is None or not m.get("entity_table") or not m.get("target_col"):
        src.warnings.append(
            f"task `{name}`: task_type {m.get('task_type')!r} is not a task headwater can "
            "predict (regression, binary or multiclass classification, recommendation); skipped"
        )
        return
    if not files:
        src.warnings.append(f"task `{name}`: no label files in {tdir}; skipped")
        return
    entity_col = m.get("entity_col") or src.tables[m["entity_table"]].primary_key
    src.tasks.append(
        SourceTask(
            name=name,
            anchor_table=m["entity_table"],
            entity_col=entity_col or "",
            time_col=m.get("time_col"),
            target_col=m["target_col"],
            target_stype=stype,
            label_files=files,
            description=m.get("description"),
            window_us=(
                parse_duration(m["timedelta"], f"task `{name}`.timedelta")
                if m.get("timedelta") is not None else None
            ),
        )
    )


_LINK_KEYS = ("src_entity_table", "src_entity_col", "dst_entity_table", "dst_entity_col", "time_col")


def _relbench_link(src: Source, name: str, m: dict[str, Any], files: list[Path], mpath: Path) -> None:
    """A ``recommendation`` task's manifest into :attr:`Source.links`."""
    missing = [k for k in (*_LINK_KEYS, "timedelta") if not m.get(k)]
    if missing:
        raise SchemaError(f"{mpath}: link task `{name}` lacks {', '.join(missing)}")
    if not files:
        src.warnings.append(f"task `{name}`: no label files in {mpath.parent}; skipped")
        return
    eval_k = m.get("eval_k", 10)
    if isinstance(eval_k, bool) or not isinstance(eval_k, int) or eval_k < 1:
        raise SchemaError(f"{mpath}: eval_k: expected a whole number >= 1, got {eval_k!r}")
    src.links.append(
        SourceLink(
            name=name,
            source_table=m["src_entity_table"],
            source_col=m["src_entity_col"],
            destination_table=m["dst_entity_table"],
            destination_col=m["dst_entity_col"],
            time_col=m["time_col"],
            window_us=parse_duration(m["timedelta"], f"{mpath}: timedelta"),
            eval_k=eval_k,
            label_files=files,
            description=m.get("description"),
        )
    )


def _sql_str(s: str) -> str:
    return s.replace("'", "''")


def _open_file_dir(p: Path) -> Source:
    con = _new_connection()
    tables: dict[str, SourceTable] = {}
    files = sorted(
        f for f in p.iterdir() if f.is_file() and f.suffix.lower() in (".parquet", ".csv")
    )
    if not files:
        raise SchemaError(f"source {p}: directory holds no .parquet or .csv files")
    for f in files:
        name = f.stem
        if name in tables:
            raise SchemaError(f"source {p}: two files define table `{name}`")
        is_csv = f.suffix.lower() == ".csv"
        path_sql = _sql_str(str(f))
        reader = (
            f"read_csv('{path_sql}', {_CSV_OPTIONS})" if is_csv else f"read_parquet('{path_sql}')"
        )
        # The strict scan first: a malformed record is reported with its line.
        scanned = _scan_csv(f) if is_csv else None
        try:
            con.execute(f"CREATE VIEW {quote(name)} AS SELECT * FROM {reader}")
            cols = _columns(con, quote(name))
            if scanned is not None:
                _reconcile_csv(con, f, name, cols, scanned)
        except duckdb.Error as e:
            raise SchemaError(f"{f}: cannot read as {f.suffix[1:]}: {e}") from e
        tables[name] = SourceTable(name=name, columns=cols, identity=_file_identity(f))
    return Source(path=p, kind="files", con=con, tables=tables)


# Explicit dialect: a header line, commas, double quotes; a malformed record
# is an error (never skipped, never padded with nulls).
_CSV_OPTIONS = (
    "header = true, delim = ',', quote = '\"', escape = '\"', strict_mode = true, "
    "ignore_errors = false, null_padding = false"
)


def _scan_csv(f: Path) -> tuple[list[str], int]:
    """The header and the number of records of ``f``, read independently of
    DuckDB (streaming, strict): the first malformed record is a SchemaError
    naming the file and its line."""
    with open(f, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh, strict=True)
        start, header, n = 1, None, 0
        try:
            for record in reader:
                if header is None:
                    header = record
                elif record and len(record) != len(header):
                    raise SchemaError(
                        f"{f}, line {start}: {len(record)} fields, the header has "
                        f"{len(header)} ({', '.join(header)})"
                    )
                else:
                    n += bool(record)
                start = reader.line_num + 1
        except csv.Error as e:
            raise SchemaError(
                f"{f}, line {start}: malformed record ({e}; an unterminated quote?)"
            ) from e
        except UnicodeDecodeError as e:
            raise SchemaError(f"{f}, line {start}: not UTF-8 ({e})") from e
    if header is None:
        raise SchemaError(f"{f}: the file is empty (expected a header line)")
    return header, n


def _reconcile_csv(
    con: duckdb.DuckDBPyConnection,
    f: Path,
    name: str,
    cols: list[tuple[str, str]],
    scanned: tuple[list[str], int],
) -> None:
    """What DuckDB read must be what the file holds: same columns, same rows."""
    header, n = scanned
    names = [c for c, _ in cols]
    if names != header:
        raise SchemaError(f"{f}: DuckDB read columns {names}, the header is {header}")
    row = con.execute(f"SELECT count(*) FROM {quote(name)}").fetchone()
    got = row[0] if row else 0
    if got != n:
        raise SchemaError(f"{f}: DuckDB read {got} rows, the file holds {n} records")


def _open_duckdb(p: Path) -> Source:
    try:
        con = duckdb.connect(str(p), read_only=True)
    except duckdb.Error as e:
        raise SchemaError(f"{p}: cannot open as a DuckDB database: {e}") from e
    con.execute("SET autoinstall_known_extensions=false; SET autoload_known_extensions=false;")
    identity = _file_identity(p)
    names = [
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = 'main' ORDER BY table_name"
        ).fetchall()
    ]
    tables = {n: SourceTable(name=n, columns=_columns(con, quote(n)), identity=identity) for n in names}
    for table, ctype, cols, ref_table, _ref_cols in con.execute(
        "SELECT table_name, constraint_type, constraint_column_names, referenced_table, "
        "referenced_column_names FROM duckdb_constraints() WHERE database_name = current_database() "
        "AND schema_name = 'main'"
    ).fetchall():
        if table not in tables:
            continue
        if ctype == "PRIMARY KEY" and len(cols) == 1:
            tables[table].primary_key = cols[0]
        elif ctype == "FOREIGN KEY" and len(cols) == 1:
            tables[table].foreign_keys[cols[0]] = ref_table
    return Source(path=p, kind="duckdb", con=con, tables=tables)


_SQLITE_TIME = ("DATE", "TIME", "TIMESTAMP", "DATETIME")


def _open_sqlite(p: Path) -> Source:
    try:
        sq = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        names = [
            r[0]
            for r in sq.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
    except sqlite3.Error as e:
        raise SchemaError(f"{p}: cannot open as a SQLite database: {e}") from e
    con = _new_connection()
    identity = _file_identity(p)
    tables: dict[str, SourceTable] = {}
    for name in names:
        q = quote(name)
        info = sq.execute(f"PRAGMA table_info({q})").fetchall()  # cid, name, type, notnull, dflt, pk
        pks = [r[1] for r in info if r[5]]
        cur = sq.execute(f"SELECT * FROM {q}")
        rows = cur.fetchall()
        arrays = []
        for i, (_cid, cname, ctype, *_rest) in enumerate(info):
            values = [r[i] for r in rows]
            arrays.append(_sqlite_column(p, name, cname, (ctype or "").upper(), values))
        arrow = pa.table(arrays, names=[r[1] for r in info])
        con.register(f"__sqlite_{len(tables)}", arrow)
        con.execute(f"CREATE TABLE {q} AS SELECT * FROM __sqlite_{len(tables)}")
        con.unregister(f"__sqlite_{len(tables)}")
        st = SourceTable(name=name, columns=_columns(con, q), identity=identity)
        if len(pks) == 1:
            st.primary_key = pks[0]
        # id, seq, table, from, to, on_update, on_delete, match. SQLite lists
        # foreign keys in reverse declaration order: keep the table's column
        # order (as the other sources do); composite keys are not supported.
        fk_rows = sq.execute(f"PRAGMA foreign_key_list({q})").fetchall()
        width = {fid: sum(1 for r in fk_rows if r[0] == fid) for fid, *_ in fk_rows}
        position = {r[1]: r[0] for r in info}
        for fk in sorted(fk_rows, key=lambda r: position.get(r[3], len(position))):
            if width[fk[0]] == 1:
                st.foreign_keys[fk[3]] = fk[2]
        tables[name] = st
    sq.close()
    return Source(path=p, kind="sqlite", con=con, tables=tables)


def _sqlite_column(p: Path, table: str, col: str, decl: str, values: list[Any]) -> pa.Array:
    try:
        if any(t in decl for t in _SQLITE_TIME):
            import datetime as dt

            parsed = [
                None if v is None else (
                    dt.datetime.fromtimestamp(v, dt.UTC).replace(tzinfo=None)
                    if isinstance(v, (int, float))
                    else dt.datetime.fromisoformat(str(v))
                )
                for v in values
            ]
            return pa.array(parsed, type=pa.timestamp("us"))
        if "INT" in decl:
            return pa.array(values, type=pa.int64())
        if any(t in decl for t in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
            return pa.array(values, type=pa.float64())
        if "BOOL" in decl:
            return pa.array([None if v is None else bool(v) for v in values], type=pa.bool_())
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())
    except (ValueError, TypeError, pa.ArrowInvalid) as e:
        raise SchemaError(f"{p}: table `{table}` column `{col}` (declared {decl or 'untyped'}): {e}") from e


def describe(src: Source) -> str:
    return json.dumps({"kind": src.kind, "path": str(src.path.resolve())})
