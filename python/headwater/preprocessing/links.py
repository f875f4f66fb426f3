"""Link tasks (recommendation): which rows of a destination table will a
source row link to in (t, t + window]?

A link task's labels are (source key, observation time t, the destination
keys linked in (t, t + window]): a schema task with ``destination_table``
(its query's rows; one destination per row or a list) or a RelBench
``recommendation`` task (its label files). Each (source, t) is a **group**;
headwater ranks candidate destinations per group:

* **candidates**, in this order, up to ``candidates`` per group: the
  destinations the source itself linked to in windows closed by t (most
  often first, at most a quarter), the destinations most linked by anyone
  in windows closed by t (at most half), then random destination rows;
  a training group keeps the positives among them and a random fifth of
  the rest (its negatives), so the model trains on pairs drawn as the
  evaluation's are: a positive the candidates miss is in no group's pairs;
* each candidate is one row of a **pairs table** ``<task>_pairs`` written
  into the database: a key, a foreign key to the source row, one to the
  destination row, and its time ``t + window`` (when its label is known).
  The table is *seed-only*: no reverse edge leads into it, so no other
  context reaches a pair row; a pair's context is its source's and its
  destination's neighbourhoods;
* the task (kind ``link``) has one boolean seed per pair (observed at t,
  label "linked in (t, t + window]"), with the group's split stored: a
  schema task's groups split by time (the last tenth of its observation
  times is test, the tenth before it val), a RelBench task's keep their
  label file's;
* a sidecar ``links/<task>.parquet`` beside the database holds, per seed,
  what the ranking metrics need and the model does not see: the group, the
  group's number of positives (also those the candidates missed), the
  candidate's popularity and the source's own past links to it
  (:func:`read_link_table`).

Must never: date a pair before its label is known; add a positive the
candidates missed to any group (a training group that got them would teach
the model that a destination outside the candidates' kind is a positive).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq

from headwater.errors import SchemaError
from headwater.hints import did_you_mean
from headwater.preprocessing.schema import Schema
from headwater.preprocessing.sources import (
    RELBENCH_SPLIT_CODES,
    Source,
    SourceTable,
    _columns,
    quote,
)

#: The folder of the database that holds each link task's sidecar.
LINKS_DIR = "links"
#: Candidate origins (bits of the sidecar's ``origin``).
PAST, POPULAR, RANDOM = 1, 2, 4


@dataclass
class LinkSpec:
    """One link task, from the schema or a RelBench folder."""

    name: str
    source_table: str
    destination_table: str
    #: SQL of the labels: ``s`` (source key), ``t`` (TIMESTAMP), ``dsts``
    #: (list of destination keys) and ``split`` (0 train, 1 val, 2 test).
    labels: str
    window_us: int
    candidates: int
    eval_k: int
    description: str | None
    kind: str  # "sql" (split by time) or "relbench" (the files' splits)
    #: The primary keys of the source and destination tables (checked).
    keys: tuple[str, str] = ("", "")
    #: The share of the training groups' positives the candidates found
    #: (set when the pairs are built; ``None`` without training positives).
    train_recall: float | None = None


def pairs_table(task: str) -> str:
    """The name of link task ``task``'s pairs table."""
    return f"{task}_pairs"


def sidecar_path(db_dir: str | Path, task: str) -> Path:
    return Path(db_dir) / LINKS_DIR / f"{task}.parquet"


def _primary_key(src: Source, schema: Schema, table: str) -> str | None:
    ts = schema.tables.get(table)
    if ts is not None and "primary_key" in ts.given:
        return ts.primary_key
    return src.tables[table].primary_key


def _check_tables(src: Source, schema: Schema, name: str, source: str, dest: str) -> tuple[str, str]:
    keys = []
    for role, table in (("anchor_table", source), ("destination_table", dest)):
        if table not in src.tables:
            raise SchemaError(
                f"task `{name}`.{role}: unknown table `{table}`{did_you_mean(table, src.tables)} "
                f"(tables: {', '.join(sorted(src.tables))})"
            )
        pk = _primary_key(src, schema, table)
        if pk is None:
            raise SchemaError(
                f"task `{name}`.{role}: table `{table}` has no primary key; a link task's "
                f"{'source' if role == 'anchor_table' else 'destination'} rows are named by "
                f"theirs (declare `[tables.{table}] primary_key`)"
            )
        keys.append(pk)
    if pairs_table(name) in src.tables:
        raise SchemaError(f"task `{name}`: the source already has a table `{pairs_table(name)}`")
    return keys[0], keys[1]


def _sql_labels(con: duckdb.DuckDBPyConnection, name: str, query: str) -> str:
    """A schema link task's query as (s, t, dsts, split): one destination per
    row or a list, grouped per (source, time); split by time."""
    try:
        rel = con.sql(f"SELECT * FROM ({query}) LIMIT 0")
    except duckdb.Error as e:
        raise SchemaError(f"task `{name}`: SQL error from DuckDB: {e}") from e
    if len(rel.columns) != 3:
        raise SchemaError(
            f"task `{name}`: the query returns {len(rel.columns)} columns ({', '.join(rel.columns)}); "
            "expected 3: source key, observation time, destination key (or a list of keys)"
        )
    s, t, d = (quote(c) for c in rel.columns)
    dsts = f"flatten(list({d}))" if str(rel.types[2]).endswith("[]") else f"list({d})"
    grouped = f"SELECT {s} AS s, CAST({t} AS TIMESTAMP) AS t, {dsts} AS dsts FROM ({query}) GROUP BY ALL"
    # The latest tenth of the distinct observation times is test, the tenth
    # before it val (as RelBench splits its tasks by time).
    return f"""
        WITH g AS ({grouped}),
        times AS (SELECT t, row_number() OVER (ORDER BY t) AS i, count(*) OVER () AS n
                  FROM (SELECT DISTINCT t FROM g))
        SELECT g.s, g.t, g.dsts,
               (CASE WHEN times.i > 0.9 * times.n THEN 2
                     WHEN times.i > 0.8 * times.n THEN 1 ELSE 0 END)::UTINYINT AS split
        FROM g JOIN times USING (t)"""


def link_specs(src: Source, schema: Schema) -> list[LinkSpec]:
    """The link tasks preprocessing builds: the schema's when it declares
    tasks (as for every task kind), else the RelBench folder's."""
    specs = []
    if schema.tasks:
        for t in schema.tasks:
            if t.destination_table is None:
                continue
            assert t.query is not None and t.window_us is not None
            keys = _check_tables(src, schema, t.name, t.anchor_table, t.destination_table)
            specs.append(LinkSpec(
                t.name, t.anchor_table, t.destination_table, _sql_labels(src.con, t.name, t.query),
                t.window_us, t.candidates, t.eval_k, t.description, "sql", keys,
            ))
        return specs
    for k in src.links:
        keys = _check_tables(src, schema, k.name, k.source_table, k.destination_table)
        parts = [
            f"SELECT {quote(k.source_col)} AS s, CAST({quote(k.time_col)} AS TIMESTAMP) AS t, "
            f"{quote(k.destination_col)} AS dsts, {code}::UTINYINT AS split "
            f"FROM read_parquet('{str(f).replace(chr(39), chr(39) * 2)}')"
            for f in k.label_files
            for code in [RELBENCH_SPLIT_CODES.get(f.stem)]
            if code is not None
        ]
        specs.append(LinkSpec(
            k.name, k.source_table, k.destination_table, " UNION ALL ".join(parts),
            k.window_us, max(100, k.eval_k), k.eval_k, k.description, "relbench", keys,
        ))
    return specs


def _generated_sql(spec: LinkSpec, num_destinations: int) -> str:
    """Per group: every generated candidate (``grp``, ``d``, ``pri``,
    ``score``, ``origin``) ranked (``rk``, from 1) in the order of
    :data:`PAST`, :data:`POPULAR`, :data:`RANDOM`, most linked first."""
    c = spec.candidates
    return f"""
        WITH past_top AS (
            SELECT grp, d, 0 AS pri, n AS score FROM hw_past
            QUALIFY row_number() OVER (PARTITION BY grp ORDER BY n DESC, d) <= {max(1, c // 4)}),
        pop_rank AS (
            SELECT * FROM hw_pop
            QUALIFY row_number() OVER (PARTITION BY t ORDER BY n DESC, d) <= {max(1, c // 2)}),
        pop_top AS (SELECT g.grp, p.d, 1 AS pri, p.n AS score FROM hw_g g JOIN pop_rank p USING (t)),
        draws AS (
            SELECT g.grp, (hash(g.grp, r.i) % {num_destinations})::BIGINT AS rn
            FROM hw_g g CROSS JOIN range({c}) r(i)),
        rnd AS (SELECT draws.grp, hw_d.d, 2 AS pri, 0 AS score FROM draws JOIN hw_d USING (rn)),
        gen AS (
            SELECT grp, d, min(pri) AS pri, max(score) AS score, bit_or(1 << pri) AS origin
            FROM (SELECT * FROM past_top UNION ALL SELECT * FROM pop_top UNION ALL SELECT * FROM rnd)
            GROUP BY grp, d)
        SELECT gen.*, g.split,
               row_number() OVER (PARTITION BY grp ORDER BY pri, score DESC, hash(d)) AS rk
        FROM gen JOIN hw_g g USING (grp)"""


def _candidates_sql(spec: LinkSpec) -> str:
    """Per group: its candidates (``grp``, ``d``, ``pri``, ``score``,
    ``origin``, ``split``): the first ``candidates`` generated; of a
    training group's, its positives and a fifth of the rest (by a hash of
    the group and the destination, so they are spread over the list as the
    evaluation's candidates are)."""
    return f"""
        SELECT g.grp, g.d, g.pri, g.score, g.origin, g.split FROM hw_gen g
        WHERE g.rk <= {spec.candidates}
          AND (g.split > 0 OR hash(g.grp, g.d, 5) % 5 = 0
               OR EXISTS (SELECT 1 FROM hw_l l WHERE l.grp = g.grp AND l.d = g.d))"""


def materialise(src: Source, spec: LinkSpec, log: Callable[[str], None]) -> None:
    """Build ``spec``'s pairs table in the source's DuckDB (a temporary
    table) and register it as a table of the source, seed-only."""
    con = src.con
    s_pk, d_pk = spec.keys
    w = f"to_microseconds({spec.window_us})"
    S, D = quote(spec.source_table), quote(spec.destination_table)
    steps = [
        f"CREATE OR REPLACE TEMP TABLE hw_raw0 AS SELECT s, t, split, unnest(dsts) AS d FROM ({spec.labels}) "
        f"WHERE s IN (SELECT {quote(s_pk)} FROM {S}) AND t IS NOT NULL",
        f"CREATE OR REPLACE TEMP TABLE hw_raw AS SELECT DISTINCT * FROM hw_raw0 "
        f"WHERE d IN (SELECT {quote(d_pk)} FROM {D})",
        "CREATE OR REPLACE TEMP TABLE hw_g AS SELECT row_number() OVER (ORDER BY s, t) - 1 AS grp, "
        "s, t, max(split) AS split, count(*) AS n_pos FROM hw_raw GROUP BY s, t",
        "CREATE OR REPLACE TEMP TABLE hw_l AS SELECT g.grp, g.split, r.s, r.t, r.d FROM hw_raw r JOIN hw_g g USING (s, t)",
        f"CREATE OR REPLACE TEMP TABLE hw_d AS SELECT {quote(d_pk)} AS d, "
        f"row_number() OVER (ORDER BY {quote(d_pk)}) - 1 AS rn FROM {D}",
        f"CREATE OR REPLACE TEMP TABLE hw_past AS SELECT g.grp, l.d, count(*) AS n FROM hw_g g "
        f"JOIN hw_l l ON l.s = g.s AND l.t + {w} <= g.t GROUP BY ALL",
        f"CREATE OR REPLACE TEMP TABLE hw_pop AS SELECT tt.t, l.d, count(*) AS n "
        f"FROM (SELECT DISTINCT t FROM hw_g) tt JOIN hw_l l ON l.t + {w} <= tt.t GROUP BY ALL",
    ]
    try:
        for q in steps:
            con.execute(q)
        row = con.execute("SELECT count(*) FROM hw_d").fetchone()
        num_d = max(1, int(row[0])) if row else 1
        con.execute(f"CREATE OR REPLACE TEMP TABLE hw_gen AS {_generated_sql(spec, num_d)}")
        con.execute(f"CREATE OR REPLACE TEMP TABLE hw_c AS {_candidates_sql(spec)}")
        con.execute(_pairs_sql(spec, w))
    except duckdb.Error as e:
        raise SchemaError(f"task `{spec.name}`: cannot build its candidate pairs: {e}") from e
    spec.train_recall = _log_counts(con, spec, log)
    name = pairs_table(spec.name)
    identity = hashlib.sha256(json.dumps([
        spec.labels, spec.window_us, spec.candidates, spec.eval_k,
        src.tables[spec.source_table].identity, src.tables[spec.destination_table].identity,
    ]).encode()).hexdigest()
    src_col, dst_col = _pair_columns(spec)
    src.tables[name] = SourceTable(
        name=name,
        columns=_columns(con, quote(name)),
        primary_key="pair",
        time_column="known_at",
        foreign_keys={src_col: spec.source_table, dst_col: spec.destination_table},
        hidden={"observed", "linked", "split", "grp", "n_pos", "popularity", "past", "origin"},
        identity=identity,
    )


def _pair_columns(spec: LinkSpec) -> tuple[str, str]:
    """The pairs table's two foreign keys, named after their tables."""
    dst = spec.destination_table
    return spec.source_table, (dst if dst != spec.source_table else f"{dst}_linked")


def _pairs_sql(spec: LinkSpec, w: str) -> str:
    src_col, dst_col = _pair_columns(spec)
    return f"""
        CREATE OR REPLACE TEMP TABLE {quote(pairs_table(spec.name))} AS
        SELECT (row_number() OVER (ORDER BY c.grp, c.pri, c.score DESC, hash(c.d), c.d) - 1)::BIGINT AS pair,
               g.s AS {quote(src_col)}, c.d AS {quote(dst_col)},
               g.t + {w} AS known_at, g.t AS observed,
               l.d IS NOT NULL AS linked,
               g.split, c.grp, g.n_pos,
               coalesce(pop.n, 0) AS popularity, coalesce(past.n, 0) AS past, c.origin
        FROM hw_c c JOIN hw_g g USING (grp)
        LEFT JOIN hw_pop pop ON pop.t = g.t AND pop.d = c.d
        LEFT JOIN hw_past past ON past.grp = c.grp AND past.d = c.d
        LEFT JOIN hw_l l ON l.grp = c.grp AND l.d = c.d
        ORDER BY pair"""


def _log_counts(
    con: duckdb.DuckDBPyConnection, spec: LinkSpec, log: Callable[[str], None]
) -> float | None:
    """Per split: groups, pairs, and the candidate recall: the share of the
    positives among the first ``candidates`` generated (what a val or test
    group keeps; a training group keeps its positives among them and a
    fifth of the rest): the share of the positives the model trains on, or
    that a ranking can find. Returns the training split's (``None`` without
    training positives)."""
    rows = con.execute(f"""
        WITH found AS (
            SELECT l.split, count(g.d) AS f, count(*) AS pos FROM hw_l l
            LEFT JOIN hw_gen g ON g.grp = l.grp AND g.d = l.d AND g.rk <= {spec.candidates}
            GROUP BY l.split)
        SELECT p.split, count(DISTINCT p.grp), count(*), any_value(found.f), any_value(found.pos)
        FROM {quote(pairs_table(spec.name))} p LEFT JOIN found USING (split)
        GROUP BY p.split ORDER BY p.split""").fetchall()
    names = ("train", "val", "test")
    parts = [
        f"{names[s]} {g} groups, {n} pairs, candidates found {100 * (f or 0) / max(pos or 0, 1):.1f}% "
        f"of {pos or 0} positives"
        for s, g, n, f, pos in rows
    ]
    log(f"  link task `{spec.name}`: " + "; ".join(parts))
    train = [f / pos for s, _, _, f, pos in rows if s == 0 and pos]
    return float(train[0]) if train else None


def labels_query(spec: LinkSpec) -> str:
    """The task's (anchor key, observation time, target, split) rows."""
    return f"SELECT pair, observed, linked, split FROM {quote(pairs_table(spec.name))} ORDER BY pair"


def write_sidecar(con: duckdb.DuckDBPyConnection, spec: LinkSpec, db_dir: Path) -> None:
    """``links/<task>.parquet``: per seed (in seed order), the group, its
    positives, the candidate's popularity, the source's past links to it,
    its origin bits, the label and the task's ``eval_k``."""
    table = con.execute(
        f"SELECT grp, n_pos, popularity, past, origin, linked, split "
        f"FROM {quote(pairs_table(spec.name))} ORDER BY pair"
    ).to_arrow_table()
    table = table.replace_schema_metadata({"eval_k": str(spec.eval_k), "kind": spec.kind})
    out = sidecar_path(db_dir, spec.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    pq.write_table(table, tmp)
    tmp.replace(out)


def prepare_links(src: Source, schema: Schema, row_order: str, log: Callable[[str], None]) -> list[LinkSpec]:
    """The link tasks' specs, each pairs table built and registered."""
    specs = link_specs(src, schema)
    if specs and row_order == "locality":
        raise SchemaError(
            f"task `{specs[0].name}`: a link task's seeds follow its pairs table's order; "
            'row_order = "locality" would reorder them (use row_order = "source")'
        )
    for spec in specs:
        materialise(src, spec, log)
    return specs


def write_sidecars(con: duckdb.DuckDBPyConnection, specs: list[LinkSpec], db_dir: Path) -> None:
    """Every link task's sidecar, checked against the written seeds."""
    for spec in specs:
        write_sidecar(con, spec, db_dir)
        check_seeds(db_dir, spec)


def check_seeds(db_dir: Path, spec: LinkSpec) -> None:
    """The written task's seed ``i`` is pair ``i`` (its sidecar's row ``i``):
    its anchor is the pairs table's ``i``-th row. Raises naming the task
    otherwise (the sidecar would score the wrong candidates)."""
    from headwater import _native

    db = _native.Database(db_dir)
    meta = json.loads(db.metadata_json())
    task = next(t for t in meta["tasks"] if t["name"] == spec.name)
    table = next(t for t in meta["tables"] if t["name"] == pairs_table(spec.name))
    rows = db.task_arrays(int(task["idx"]))["anchor_row"].astype(np.int64)
    want = int(table["row_offset"]) + np.arange(int(table["num_rows"]), dtype=np.int64)
    if rows.shape != want.shape or not np.array_equal(rows, want):
        raise SchemaError(
            f"task `{spec.name}`: its seeds are not the rows of `{pairs_table(spec.name)}` in "
            "order; its sidecar would not match them"
        )


@dataclass
class LinkTable:
    """A link task's sidecar, one entry per seed of the task."""

    group: np.ndarray
    positives: np.ndarray
    popularity: np.ndarray
    past: np.ndarray
    origin: np.ndarray
    linked: np.ndarray
    split: np.ndarray
    eval_k: int


def read_link_table(db_dir: str | Path, task: str, num_seeds: int) -> LinkTable:
    """Link task ``task``'s sidecar; a ``FileNotFoundError`` or ``ValueError``
    naming the file when it is missing or does not fit the task's seeds."""
    p = sidecar_path(db_dir, task)
    if not p.is_file():
        raise FileNotFoundError(
            f"link task `{task}`: {p} is missing (it is written by `headwater preprocess`; rerun it)"
        )
    t: Any = pq.read_table(p)
    if t.num_rows != num_seeds:
        raise ValueError(f"{p}: {t.num_rows} rows, but task `{task}` has {num_seeds} seeds; rerun preprocess")
    col = {n: t.column(n).to_numpy() for n in t.column_names}
    meta = {k.decode(): v.decode() for k, v in (t.schema.metadata or {}).items()}
    return LinkTable(
        group=col["grp"].astype(np.int64), positives=col["n_pos"].astype(np.int64),
        popularity=col["popularity"].astype(np.float64), past=col["past"].astype(np.float64),
        origin=col["origin"].astype(np.int64), linked=col["linked"].astype(bool),
        split=col["split"].astype(np.int64), eval_k=int(meta.get("eval_k", "10")),
    )



