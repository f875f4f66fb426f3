"""``headwater inspect``: what a database holds (after the O(metadata) open
checks); ``headwater verify``: every payload checksum and the graph/task
contents, with a progress bar."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from headwater import _native
from headwater.rows import VerifyReport


def require_exists(db: str | os.PathLike[str]) -> None:
    """A ``FileNotFoundError`` saying that ``db`` does not exist (rather
    than that it is not a directory) before anything opens it."""
    if not Path(db).exists():
        raise FileNotFoundError(
            f"{db} does not exist (expected a headwater database directory or a mixture file)"
        )


def inspect(db_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Open ``db_dir`` (headers, sizes, content hash) and summarise it as a
    dict; a mixture file gives ``{"mixture", "databases": [...]}``, each
    database's summary with its name and share of batches."""
    from headwater.mixture import is_mixture_file

    require_exists(db_dir)
    if is_mixture_file(db_dir):
        return _inspect_mixture(db_dir)
    db = _native.Database(Path(db_dir))
    meta = json.loads(db.metadata_json())
    tables = [_table_summary(meta, t) for t in meta["tables"]]
    tasks = [
        {
            "name": k["name"],
            "kind": k["kind"],
            "anchor_table": meta["tables"][k["anchor_table"]]["name"],
            "target_stype": k["target_stype"],
            "seeds": k["num_seeds"],
            "null_targets": k["num_null_targets"],
            "temporal": k["temporal"],
        }
        for k in meta["tasks"]
    ]
    dim = meta["embedder"]["dim"]
    return {
        "path": str(Path(db_dir).resolve()),
        "format_version": meta["format_version"],
        "content_hash": meta["content_hash"],
        "embedder": meta["embedder"],
        "rows": meta["num_rows"],
        "edges": meta["num_edges"],
        "tables": tables,
        "tasks": tasks,
        "statistics": _statistics(meta.get("stats_rule")),
        "embeddings": {
            "column": [len(meta["columns"]), dim],
            "categorical": [meta["num_categorical_embeddings"], dim],
            "text": [meta["num_text_embeddings"], dim],
        },
        "bytes_on_disk": db.bytes_on_disk,
        "files": {k: v["bytes"] for k, v in meta["files"].items()},
    }


def _inspect_mixture(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Each database of the mixture file ``path``: its summary, a name unique
    in the mixture (``name#2`` for a repeat) and its share of batches."""
    from headwater.mixture import read_mixture, sampler_args

    entries = read_mixture(path)
    paths, keys = sampler_args(entries)
    weights = keys["database_weights"]
    total = sum(weights) or 1.0
    dbs = []
    seen: list[str] = []
    for p, w in zip(paths, weights, strict=True):
        name, n = Path(p).name, 1
        while name in seen:
            n += 1
            name = f"{Path(p).name}#{n}"
        seen.append(name)
        dbs.append({"name": name, "share": w / total, **inspect(p)})
    embedders = {(d["embedder"]["name"], d["embedder"]["dim"]) for d in dbs}
    return {
        "mixture": str(Path(path).resolve()),
        "databases": dbs,
        "one_embedder": len(embedders) == 1,
    }


def _table_summary(meta: dict[str, Any], t: dict[str, Any]) -> dict[str, Any]:
    """One table of ``metadata_json()``: rows, keys, columns by semantic type
    (stored and unstored), foreign keys with their edge counts, bytes."""
    stypes = Counter(meta["columns"][c]["stype"] for c in t["columns"])
    stypes.update(u["stype"] for u in t["unstored_columns"])
    return {
        "name": t["name"],
        "rows": t["num_rows"],
        "primary_key": t["primary_key"],
        "time_column": t["time_column"],
        "columns_by_type": dict(sorted(stypes.items())),
        "foreign_keys": [
            {
                "column": fk["column"],
                "references": meta["tables"][fk["references"]]["name"],
                "edges": fk["num_edges"],
                "null": fk["num_null"],
                "dangling": fk["num_dangling"],
            }
            for fk in t["foreign_keys"]
        ],
        "bytes": meta["files"][t["file"]]["bytes"],
    }


def _statistics(rule: dict[str, Any] | None) -> dict[str, Any]:
    """Which rows the normalisation statistics come from (``stats_rule`` of
    the metadata; a database written before the rule has none: every row)."""
    if rule is None:
        return {"rule": "every row (written before the statistics rule)", "cutoff": None}
    cutoff = rule.get("cutoff_us")
    when = None
    if cutoff is not None:
        t = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=cutoff)
        when = t.isoformat().replace("+00:00", "Z")
    seed, ratios = rule["split_seed"], rule["split_ratios"]
    rows = f"rows dated up to {when} (the validation cutoff)" if when else "every row (no time split)"
    targets = (
        "task targets from their train seeds (the stored split, else split_seed "
        f"{seed}, ratios {'/'.join(f'{r:g}' for r in ratios)})"
    )
    return {"rule": f"{rows}; {targets}", "cutoff": when, "split_seed": seed, "split_ratios": ratios}


def _bytes(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def format_report(r: dict[str, Any]) -> str:
    """A human-readable report of :func:`inspect`'s result."""
    if "mixture" in r:
        head = [
            f"mixture       {r['mixture']}  ({len(r['databases'])} databases, "
            + ("one embedder)" if r["one_embedder"] else "EMBEDDERS DIFFER: cannot be sampled together)"),
        ]
        head += [
            f"  {d['name']:<24} share {d['share']:.3f}  {d['rows']:>12,} rows  {len(d['tasks'])} tasks"
            for d in r["databases"]
        ]
        return "\n\n".join(["\n".join(head), *(format_report(d) for d in r["databases"])])
    lines = [
        f"database      {r['path']}",
        f"format        v{r['format_version']}   content hash {r['content_hash']}",
        f"embedder      {r['embedder']['name']} (dim {r['embedder']['dim']})",
        f"rows          {r['rows']:,}   edges {r['edges']:,} (each way)",
        f"size on disk  {_bytes(r['bytes_on_disk'])}",
        f"statistics    {r['statistics']['rule']}",
        "",
        f"{'table':<16} {'rows':>12} {'bytes':>10}  columns by type",
    ]
    for t in r["tables"]:
        types = ", ".join(f"{k} {v}" for k, v in t["columns_by_type"].items())
        lines.append(f"{t['name']:<16} {t['rows']:>12,} {_bytes(t['bytes']):>10}  {types}")
        for fk in t["foreign_keys"]:
            extra = f", {fk['dangling']:,} dangling" if fk["dangling"] else ""
            lines.append(f"  └ {fk['column']} → {fk['references']}: {fk['edges']:,} edges{extra}")
    lines += ["", f"{'task':<28} {'kind':<9} {'anchor':<12} {'target':<12} {'seeds':>10}  temporal"]
    for k in r["tasks"]:
        lines.append(
            f"{k['name']:<28} {k['kind']:<9} {k['anchor_table']:<12} {k['target_stype']:<12} "
            f"{k['seeds']:>10,}  {'yes' if k['temporal'] else 'no'}"
        )
    lines += ["", "embeddings (f16):"]
    for kind, (n, d) in r["embeddings"].items():
        lines.append(f"  {kind:<12} [{n:,}, {d}]  {_bytes(n * d * 2)}")
    return "\n".join(lines)


def verify(db_dir: str | os.PathLike[str], progress: bool = True) -> VerifyReport:
    """Fully check ``db_dir``: every payload checksum (reads every byte) and
    the graph/task contents. Returns ``{"files", "bytes", "errors"}``, one
    message per problem naming its file; a damaged header raises. The
    progress bar appears with the first bytes checked (none before an
    error at open)."""
    require_exists(db_dir)
    if not progress:
        return _native.verify_database(Path(db_dir))
    from tqdm.auto import tqdm

    bars: list[Any] = []

    def step(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(desc="verify", unit="B", unit_scale=True, file=sys.stderr))
        bar = bars[0]
        bar.total = total
        bar.update(done - bar.n)

    try:
        return _native.verify_database(Path(db_dir), step)
    finally:
        for bar in bars:
            bar.close()
