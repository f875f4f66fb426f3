"""Preprocessing a corpus: many sources into one output root.

A **corpus manifest** is TOML::

    [defaults]                        # optional: options of every source
    embedder = "hash"                 # preprocess()'s keywords
    memory_limit = "1GiB"
    time_columns = "propose"
    row_order = "locality"            # for a corpus read from less memory than it takes

    [[source]]
    path = "sources/shop.duckdb"      # relative to the manifest
    name = "shop"                     # output folder (default: the file stem)
    schema = "schemas/shop.toml"      # optional schema file
    weight = 2.0                      # optional: its weight in the mixture
    embedder = "minilm"               # optional: overrides [defaults]

or a directory of sources (each entry a source; ``<name>.schema.toml``
beside one is its schema). :func:`preprocess_corpus` builds each source
into ``OUT/<name>`` with :func:`~headwater.preprocessing.preprocess` and
writes ``OUT/corpus.toml``, a mixture file of the databases that are done
(paths relative to it, so the root can be moved or staged), which
``Sampler`` (through :func:`headwater.mixture.open_sampler`) and
``headwater train --db`` open as a mixture.

- **Idempotent**: a source whose database is done and whose identity (the
  source files' sizes and modification times, its schema file, its
  options) matches the record in ``OUT/.corpus/<name>.json`` is skipped.
- **Resumable**: each database is written atomically (``preprocess``'s
  ``.partial`` folder, finished tables kept), so a killed run re-run
  finishes the rest without redoing what was done.
- **Isolated failures**: a failing source is reported with its error and
  the others go on; ``fail_fast`` stops at the first.
- **On Ray** (``ray=True``, ``ray_address``): one Ray task per source,
  on a local Ray instance or a running cluster
  (:mod:`headwater.preprocessing.corpus_ray`); the same databases, byte
  for byte.
- **Shards** (``shard=(i, n)``, SLURM job arrays): the sources are dealt to
  ``n`` shards by size (largest first, each to the lightest shard; ties by
  name), so shard ``i`` (``0 <= i < n``) builds its share; the union of the
  shards is the corpus, no source twice. Run once more without a shard
  afterwards to write the complete ``corpus.toml`` (it skips what is done).

Bad input is refused before any work starts, naming the entry: a missing
source or schema, two sources with one output name, a name that would
escape the output root, an unknown key, a bad shard, a Ray address that
does not answer.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headwater.hints import first_unknown_hint
from headwater.preprocessing.row_order import check_row_order

_SOURCE_KEYS = {"path", "name", "schema", "weight", "embedder", "memory_limit", "time_columns", "row_order"}
_OPTION_KEYS = {"embedder", "memory_limit", "time_columns", "row_order"}
MANIFEST_NAME = "corpus.toml"
RECORDS = ".corpus"


@dataclass(frozen=True)
class CorpusSource:
    """One source of a corpus."""

    path: Path
    name: str
    schema: Path | None = None
    weight: float = 1.0
    options: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """What a finished database was built from: the source files'
        relative paths, sizes and modification times, the schema file's
        bytes and the options (a change of any rebuilds it)."""
        files = [self.path] if self.path.is_file() else sorted(
            p for p in self.path.rglob("*") if p.is_file()
        )
        stat = [
            [str(p.relative_to(self.path.parent)), p.stat().st_size, p.stat().st_mtime_ns]
            for p in files
        ]
        schema = self.schema.read_text(encoding="utf-8") if self.schema else None
        return {"source": str(self.path), "files": stat, "schema": schema,
                "options": self.options}

    def size(self) -> int:
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` (``0 <= I < N``) as ``(I, N)``; a clear error otherwise."""
    parts = text.split("/")
    try:
        i, n = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/N, e.g. 0/4 (shard I of N, 0 <= I < N)") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: shard I of N needs N >= 1 and 0 <= I < N")
    return i, n


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name or name in {".", ".."} or "/" in name or "\\" in name:
        raise ValueError(
            f"{where}: output name {name!r} must be one folder name inside the output root "
            "(no '/', not '.' or '..', not empty)"
        )
    if name.startswith(".") or name == MANIFEST_NAME:
        raise ValueError(f"{where}: output name {name!r} is reserved (starts with '.' or is "
                         f"{MANIFEST_NAME})")
    return name


def _options(table: dict[str, Any], where: str) -> dict[str, Any]:
    opts = {k: table[k] for k in _OPTION_KEYS if k in table}
    if "time_columns" in opts and opts["time_columns"] not in ("propose", "none"):
        raise ValueError(f"{where}: time_columns {opts['time_columns']!r}: expected 'propose' or 'none'")
    if "row_order" in opts:
        check_row_order(opts["row_order"], f"{where}: row_order")
    return opts


def _entry(t: Any, i: int, base: Path, defaults: dict[str, Any], where: str) -> CorpusSource:
    at = f"{where}: [[source]] #{i + 1}"
    if not isinstance(t, dict) or "path" not in t:
        raise ValueError(f"{at}: needs `path` (a source)")
    unknown = sorted(set(t) - _SOURCE_KEYS)
    if unknown:
        raise ValueError(
            f"{at}: unknown key(s) {unknown}{first_unknown_hint(unknown, _SOURCE_KEYS)}; "
            f"allowed: {sorted(_SOURCE_KEYS)}"
        )
    path = (base / t["path"]).resolve()
    if not path.exists():
        raise FileNotFoundError(f"{at}: source {t['path']!r} not found ({path})")
    name = _check_name(t.get("name", path.stem), at)
    schema = (base / t["schema"]).resolve() if "schema" in t else None
    if schema is not None and not schema.is_file():
        raise FileNotFoundError(f"{at}: schema {t['schema']!r} not found ({schema})")
    weight = t.get("weight", 1.0)
    if not isinstance(weight, int | float) or isinstance(weight, bool) or not weight >= 0:
        raise ValueError(f"{at}: weight {weight!r}: expected a number >= 0")
    return CorpusSource(path, name, schema, float(weight), {**defaults, **_options(t, at)})


def read_corpus(manifest: str | os.PathLike[str]) -> list[CorpusSource]:
    """The sources of a corpus manifest (TOML) or directory of sources,
    checked (see the module docs) before any work."""
    m = Path(manifest)
    if m.is_dir():
        sources = _directory_sources(m)
    else:
        where = str(m)
        try:
            doc = tomllib.loads(m.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"corpus manifest not found: {m}") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{where}: not valid TOML: {e}") from None
        unknown = sorted(set(doc) - {"defaults", "source"})
        if unknown:
            raise ValueError(
                f"{where}: unknown table(s) {unknown}"
                f"{first_unknown_hint(unknown, ('defaults', 'source'))}; "
                "expected [defaults] and [[source]]"
            )
        defaults = doc.get("defaults", {})
        bad = sorted(set(defaults) - _OPTION_KEYS)
        if bad:
            raise ValueError(
                f"{where}: [defaults]: unknown key(s) {bad}{first_unknown_hint(bad, _OPTION_KEYS)}; "
                f"allowed: {sorted(_OPTION_KEYS)}"
            )
        defaults = _options(defaults, f"{where}: [defaults]")
        tables = doc.get("source")
        if not isinstance(tables, list) or not tables:
            raise ValueError(f"{where}: expected at least one [[source]] table")
        sources = [_entry(t, i, m.parent, defaults, where) for i, t in enumerate(tables)]
    seen: dict[str, Path] = {}
    for s in sources:
        if s.name in seen:
            raise ValueError(
                f"{manifest}: two sources have the output name {s.name!r} ({seen[s.name]} and "
                f"{s.path}); give one a `name`"
            )
        seen[s.name] = s.path
    return sources


def _directory_sources(d: Path) -> list[CorpusSource]:
    out = []
    for p in sorted(d.iterdir()):
        if p.name.startswith(".") or p.name.endswith(".schema.toml"):
            continue
        name = _check_name(p.stem, f"{d}: {p.name}")
        schema = d / f"{p.stem}.schema.toml"
        out.append(CorpusSource(p.resolve(), name, schema.resolve() if schema.is_file() else None))
    if not out:
        raise ValueError(f"{d}: a corpus directory with no sources")
    return out


def shard_of(sources: list[CorpusSource], shard: tuple[int, int]) -> list[CorpusSource]:
    """The sources of shard ``i`` of ``n``: dealt largest first to the
    lightest shard (ties: the lower shard; equal sizes by name), so the
    shards are balanced by bytes and the split is the same on every node."""
    i, n = shard
    load = [0] * n
    mine = []
    for s in sorted(sources, key=lambda s: (-s.size(), s.name)):
        k = min(range(n), key=lambda j: (load[j], j))
        load[k] += s.size()
        if k == i:
            mine.append(s)
    return sorted(mine, key=lambda s: sources.index(s))


def _record_path(out: Path, name: str) -> Path:
    return out / RECORDS / f"{name}.json"


def _is_done(out: Path, s: CorpusSource) -> bool:
    rec, meta = _record_path(out, s.name), out / s.name / "metadata.json"
    if not rec.is_file() or not meta.is_file():
        return False
    r = json.loads(rec.read_text(encoding="utf-8"))
    content = json.loads(meta.read_text(encoding="utf-8")).get("content_hash")
    return bool(r.get("identity") == s.identity() and r.get("content_hash") == content)


def build_source(out: Path, s: CorpusSource) -> dict[str, Any]:
    """Build ``s`` into ``out/<name>`` and record it done: its report
    row's fields (rows, bytes, peak resident memory, phases)."""
    from headwater.preprocessing import preprocess

    t0 = time.perf_counter()
    phases: list[dict[str, Any]] = []
    db = preprocess(s.path, out / s.name, schema=s.schema, overwrite=True, progress=False,
                    phase_report=phases, **s.options)
    meta = json.loads((db / "metadata.json").read_text(encoding="utf-8"))
    rec = {"identity": s.identity(), "content_hash": meta["content_hash"],
           "seconds": time.perf_counter() - t0}
    path = _record_path(out, s.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rec, indent=1), encoding="utf-8")
    tmp.replace(path)
    rows = sum(int(t.get("num_rows", 0)) for t in meta.get("tables", []))
    return {"rows": rows, "bytes": sum(p.stat().st_size for p in db.rglob("*") if p.is_file()),
            "peak_rss_bytes": max(int(p["peak_rss_bytes"]) for p in phases), "phases": phases}


def write_corpus_manifest(out: Path, sources: list[CorpusSource]) -> Path:
    """``OUT/corpus.toml``: a mixture file of the sources whose databases
    are done, in manifest order, paths relative to it (written atomically)."""
    lines = []
    for s in sources:
        if _is_done(out, s):
            lines += ["[[database]]", f"path = {json.dumps(s.name)}", f"weight = {s.weight!r}", ""]
    path = out / MANIFEST_NAME
    tmp = out / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(path)
    return path


def preprocess_corpus(
    manifest: str | os.PathLike[str],
    out_root: str | os.PathLike[str],
    shard: tuple[int, int] | None = None,
    fail_fast: bool = False,
    progress: bool = True,
    ray: bool = False,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Build every source of ``manifest`` (or of shard ``(i, n)``) into
    ``out_root``, one after another or, with ``ray`` (or a ``ray_address``),
    as Ray tasks (:mod:`headwater.preprocessing.corpus_ray`); the report:
    per source its status (``done``, ``skipped`` (up to date), ``failed``
    with the error, ``not_run`` after a fail-fast stop), seconds, rows,
    bytes, and for a source built its peak resident memory (the process's,
    sampled while it was built) and its phases (name, count, seconds, peak
    memory); the corpus manifest written; totals."""
    log: Callable[[str], None] = (lambda m: print(m, file=sys.stderr)) if progress else (lambda m: None)
    sources = read_corpus(manifest)
    mine = shard_of(sources, shard) if shard else sources
    if ray_address is not None:
        from headwater.preprocessing.corpus_ray import check_address

        check_address(ray_address)
    out = Path(out_root)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    rows: list[dict[str, Any]] = []
    todo: list[tuple[CorpusSource, dict[str, Any]]] = []
    for j, s in enumerate(mine):
        row: dict[str, Any] = {"name": s.name, "source": str(s.path), "status": "not_run",
                               "seconds": 0.0}
        rows.append(row)
        if _is_done(out, s):
            row["status"] = "skipped"
            log(f"[{j + 1}/{len(mine)}] {s.name}: up to date, skipped")
        else:
            todo.append((s, row))
    def said(k: int, s: CorpusSource, row: dict[str, Any]) -> None:
        log(f"[{k}/{len(todo)}] {s.name}: {row['status']} in {row['seconds']:.1f} s"
            + (f" ({row['error']})" if "error" in row else ""))

    engine: dict[str, Any] = {"engine": "sequential"}
    if ray or ray_address is not None:
        from headwater.preprocessing.corpus_ray import run_on_ray

        engine = run_on_ray(out, todo, build_row, address=ray_address, fail_fast=fail_fast,
                            log=log, said=said)
    else:
        _run_here(out, todo, fail_fast, said)
    manifest_path = write_corpus_manifest(out, sources)
    counts = {k: sum(r["status"] == k for r in rows) for k in ("done", "skipped", "failed", "not_run")}
    report = {"sources": rows, "counts": counts, "shard": list(shard) if shard else None,
              "seconds": time.perf_counter() - t_all, "manifest": str(manifest_path), **engine}
    name = f"report-{shard[0]}-of-{shard[1]}.json" if shard else "report.json"
    (out / RECORDS).mkdir(exist_ok=True)
    (out / RECORDS / name).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def build_row(out: Path, s: CorpusSource) -> dict[str, Any]:
    """:func:`build_source` as a report row's fields, never raising: status
    ``done`` or ``failed`` with the error (a failing source is reported and
    the rest go on), and the seconds it took."""
    t0 = time.perf_counter()
    try:
        row = {**build_source(out, s), "status": "done"}
    except Exception as e:  # reported in the row
        row = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    return row | {"seconds": time.perf_counter() - t0}


def _run_here(
    out: Path,
    todo: list[tuple[CorpusSource, dict[str, Any]]],
    fail_fast: bool,
    said: Callable[[int, CorpusSource, dict[str, Any]], None],
) -> None:
    """Build each ``(source, report row)`` of ``todo`` in this process, in
    manifest order, filling its row."""
    for j, (s, row) in enumerate(todo):
        row.update(build_row(out, s))
        said(j + 1, s, row)
        if fail_fast and row["status"] == "failed":
            return


def format_corpus_report(r: dict[str, Any]) -> str:
    """The report as a table, a line per source, then the counts."""
    lines = [f"{'source':<28} {'status':<8} {'seconds':>8} {'rows':>10} {'MiB':>8} "
             f"{'peak MiB':>9}  error"]
    for s in r["sources"]:
        mib = s.get("bytes", 0) / 2**20
        peak = f"{s['peak_rss_bytes'] / 2**20:>9.0f}" if "peak_rss_bytes" in s else f"{'':>9}"
        lines.append(f"{s['name']:<28} {s['status']:<8} {s['seconds']:>8.1f} "
                     f"{s.get('rows', 0):>10} {mib:>8.2f} {peak}  {s.get('error', '')}")
    c = r["counts"]
    lines.append(f"{c['done']} done, {c['skipped']} skipped (up to date), {c['failed']} failed, "
                 f"{c['not_run']} not run, in {r['seconds']:.1f} s; manifest {r['manifest']}")
    return "\n".join(lines)
