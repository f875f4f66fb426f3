"""``preprocess()``: source + schema → a headwater database directory.

Steps: open the source; merge its declared keys with the schema file; check
every name the schema uses; read each referenced table's primary key and
check it is unique; then, table by table (restartable: a table staged by an
interrupted run with the same fingerprint is reused), read the columns, infer
undeclared semantic types, resolve foreign keys to parent rows (dangling
values are counted, reported and dropped) and hand typed arrays to the Rust
writer; add tasks; embed column names, categories and text values; publish.

This module is the orchestrator; each step is a module of this package,
arrows pointing down: :mod:`.plan` (the tables, keys and fingerprints),
:mod:`.primary_keys` (read, checked unique, indexed), :mod:`.tables` (one
table into the writer), :mod:`.tasks` (declared, RelBench or cell tasks),
:mod:`.columns` (reading and encoding a column in chunks), :mod:`.memory`
(the budget, chunk size and spilled arrays) and :mod:`.phases` (per-phase
time and peak RSS). Names with a leading underscore are private to the
package: its modules (and its tests) import them from each other, nothing
else does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from headwater import _native
from headwater.embedders import get_embedder
from headwater.errors import SchemaError
from headwater.preprocessing.columns import _read_count
from headwater.preprocessing.links import pairs_table, prepare_links, write_sidecars
from headwater.preprocessing.memory import (
    _SORT_BUDGET,
    _SPILL_DIR,
    DEFAULT_MEMORY_LIMIT,
    _configure_duckdb,
    _release_arrow_memory,
    parse_size,
)
from headwater.preprocessing.phases import _Phases, _row_bar, log_line
from headwater.preprocessing.plan import _fingerprint, _plan
from headwater.preprocessing.primary_keys import _primary_keys
from headwater.preprocessing.row_order import SEEDS_BY_ROW, check_row_order, order_rows
from headwater.preprocessing.schema import Schema, load_schema
from headwater.preprocessing.sources import Source, open_source
from headwater.preprocessing.tables import _add_table, _restore_stypes
from headwater.preprocessing.tasks import _add_tasks, add_link_tasks
from headwater.preprocessing.timecols import propose_time_columns


def _embed(
    embedder: Any,
    n: int,
    fetch: Callable[[int, int], list[str]],
    what: str,
    enabled: bool,
    spill_to: Path | None = None,
) -> np.ndarray:
    """Embed ``n`` strings, ``fetch(start, stop)`` a chunk at a time (the
    writer's text values are never all in Python), so a long run shows
    progress (and the cache fills as it goes, so an interrupted run resumes
    where it stopped). With ``spill_to`` the matrix is a file-backed map
    there (``2·dim`` bytes per text: 2.8 GB for TPC-H SF10's 3.6 M texts at
    dim 384), held by the page cache rather than the process."""
    if not n:
        return np.zeros((0, embedder.dim), dtype=np.float16)
    chunk = 4096
    shape = (n, embedder.dim)
    if spill_to is not None:
        spill_to.parent.mkdir(parents=True, exist_ok=True)
        out: np.ndarray = np.memmap(spill_to, dtype=np.float16, mode="w+", shape=shape)
    else:
        out = np.empty(shape, dtype=np.float16)
    if enabled:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"embedding {what} ({embedder.name})", unit="str", file=sys.stderr)
    for a in range(0, n, chunk):
        part = np.asarray(embedder.embed(fetch(a, a + chunk)), dtype=np.float16)
        if part.shape != (min(chunk, n - a), embedder.dim):
            raise RuntimeError(
                f"embedder {embedder.name} returned shape {part.shape}, expected "
                f"{(min(chunk, n - a), embedder.dim)}"
            )
        out[a : a + len(part)] = part
        if enabled:
            bar.update(len(part))
    if enabled:
        bar.close()
    return out


def preprocess(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    schema: str | os.PathLike[str] | Schema | None = None,
    embedder: str = "auto",
    overwrite: bool = False,
    progress: bool = True,
    time_columns: str = "propose",
    memory_limit: str | int = DEFAULT_MEMORY_LIMIT,
    row_order: str = "source",
    phase_report: list[dict[str, Any]] | None = None,
) -> Path:
    """Build a headwater database in ``out_dir`` from ``source``.

    ``source`` is a RelBench dataset folder, a DuckDB or SQLite file, or a
    directory of Parquet/CSV files; ``schema`` a schema file (see
    :mod:`headwater.preprocessing.schema`) declaring or overriding keys, time
    columns, semantic types and tasks. ``embedder`` is ``minilm``, ``hash`` or
    ``auto``. ``time_columns="propose"`` proposes a time column for tables of
    a source that declares none (:mod:`headwater.preprocessing.timecols`);
    ``"none"`` keeps the source's declarations only. ``memory_limit`` (e.g.
    ``"512MiB"``) is the preprocessing budget beside the interpreter: DuckDB
    gets a third and spills past it to ``<out_dir>.duckdb_tmp``, and columns
    are streamed in chunks (the README's "How big can my database be" lists
    what still grows with the data). ``row_order="locality"`` writes each
    table's rows grouped under their parent's and the task seeds in row
    order (:mod:`headwater.preprocessing.row_order`), for a database read
    with ``seed_windows`` from a page cache smaller than it; ``"source"``
    keeps the source's order. ``phase_report``, a list, receives one entry
    per phase (its name, count, seconds and peak resident and private
    memory), as the log prints them. The result is staged in
    ``<out_dir>.partial`` (kept on failure so a re-run resumes finished
    tables) and renamed into place when complete.
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise ValueError(f"out_dir {out} already exists (pass overwrite=True to replace it)")
    budget = parse_size(memory_limit)
    check_row_order(row_order)
    # Through tqdm: the inference lines come while the row bar is live.
    log: Callable[[str], None] = log_line if progress else (lambda m: None)
    if isinstance(schema, Schema):
        sch = schema
    else:
        sch = load_schema(Path(schema)) if schema is not None else Schema()
    emb = get_embedder(embedder)
    src = open_source(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    spill = out.with_name(out.name + ".duckdb_tmp")
    _configure_duckdb(src.con, budget, spill)
    token = _SPILL_DIR.set(spill)
    # DuckDB has a third of the budget; a key sort may take a quarter.
    sort_token = _SORT_BUDGET.set(budget // 4)
    order_token = SEEDS_BY_ROW.set(row_order == "locality")
    try:
        phases = _preprocess(
            src, source, out, sch, emb, overwrite, progress, time_columns, log, spill, row_order
        )
        if phase_report is not None:
            phase_report.extend(phases)
    finally:
        SEEDS_BY_ROW.reset(order_token)
        _SORT_BUDGET.reset(sort_token)
        _SPILL_DIR.reset(token)
        src.con.close()
        shutil.rmtree(spill, ignore_errors=True)
    log(f"wrote {out}")
    return out


def _warn_unlinked(plans: list[Any], source: Any, log: Callable[[str], None]) -> None:
    """Several tables and no foreign key: the database would have no edges
    (a CSV/Parquet folder declares none), so say so before building it."""
    if len(plans) > 1 and not any(p.foreign_keys for p in plans):
        log(
            f"warning: source {source}: {len(plans)} tables and no foreign keys, so 0 "
            "foreign-key edges: no sequence links a row to another table's rows. Declare "
            "the keys in a schema file (--schema: `[tables.<name>] foreign_keys = {column = "
            '"table"}`; see docs/schema.md)'
        )


def _preprocess(
    src: Source, source: str | os.PathLike[str], out: Path, sch: Schema, emb: Any,
    overwrite: bool, progress: bool, time_columns: str, log: Callable[[str], None], spill: Path,
    row_order: str,
) -> list[dict[str, Any]]:
    for w in src.warnings:
        log(f"warning: {w}")
    links = prepare_links(src, sch, row_order, log)
    plans = _plan(src, sch)
    propose_time_columns(src, plans, sch, time_columns, log)
    if not plans:
        raise SchemaError(f"source {source}: no tables to import")
    _warn_unlinked(plans, source, log)
    phases = _Phases(log)
    counts = {p.name: _read_count(src.con, p.name) for p in plans}
    total = sum(counts.values())
    order = ""
    if row_order == "locality":
        with phases.phase("row order", total):
            order = order_rows(src, plans, counts, log)
    with phases.phase("keys", sum(counts[p.name] for p in plans if p.primary_key)):
        keys = _primary_keys(src, plans, counts)
    origin: dict[str, Any] = {"kind": src.kind, "path": str(Path(source).resolve())}
    if order:
        origin["row_order"] = order
    writer = _native.DatabaseWriter(out, json.dumps(origin), emb.name, emb.dim)
    if src.stats_cutoff_us is not None:
        writer.set_stats_cutoff(src.stats_cutoff_us)
        log(f"statistics from the rows up to {src.stats_cutoff_from} (the validation cutoff)")
    resuming = True
    by_name = {p.name: p for p in plans}
    with phases.phase("tables", total):
        bar = _row_bar("tables", total, progress)
        for i, plan in enumerate(plans):
            fp = _fingerprint(plan, i, by_name, src.stats_cutoff_us, order)
            if resuming and writer.resume_table(fp):
                # Re-derive stypes for task planning from the staged metadata.
                _restore_stypes(writer, plan)
                log(f"  {plan.name}: reused from the interrupted run")
            else:
                resuming = False
                _add_table(writer, src, plan, keys, log, fp)
                _release_arrow_memory()
            bar.update(counts[plan.name])
        bar.close()
    with phases.phase("tasks", total):
        _add_tasks(writer, src, sch, plans, keys, log)
        add_link_tasks(writer, src, links, keys, log)
    for spec in links:
        writer.set_seed_only(pairs_table(spec.name))
    del keys
    _release_arrow_memory()
    names, categories, num_texts = writer.column_texts(), writer.category_texts(), writer.num_text_values()
    with phases.phase("embeddings", len(names) + len(categories) + num_texts, "strings"):
        col_emb = _embed(emb, len(names), lambda a, b: names[a:b], "column names", progress)
        cat_emb = _embed(emb, len(categories), lambda a, b: categories[a:b], "categories", progress)
        text_emb = _embed(
            emb, num_texts, writer.text_values, "text values", progress, spill / "text_embeddings.f16"
        )
    log("building the graph and writing the database ...")
    with phases.phase("graph and write", total):
        writer.finish(col_emb, cat_emb, text_emb, overwrite)
    del text_emb  # unmaps the spill file (removed with `spill`)
    write_sidecars(src.con, links, out)
    phases.summary()
    return phases.report


