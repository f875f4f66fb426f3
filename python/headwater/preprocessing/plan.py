"""What will be imported: one :class:`TablePlan` per kept table of the
source, its keys and time column merged from the source's declarations and
the schema file, every name the schema uses checked against the source, and
each table's fingerprint (what a staged table of an interrupted run must
match to be reused). Reads only the source's catalogue, never its rows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from headwater import _native
from headwater.errors import SchemaError
from headwater.hints import did_you_mean
from headwater.preprocessing.schema import Schema, TableSchema
from headwater.preprocessing.sources import Source, SourceTable


@dataclass
class TablePlan:
    name: str
    source: SourceTable
    primary_key: str | None
    time_column: str | None
    foreign_keys: dict[str, str]
    declared: dict[str, str]
    stypes: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)



def _check_declared_columns(src: Source, schema: Schema) -> None:
    """Every table and column the schema names exists in the source."""
    for tname, ts in schema.tables.items():
        if tname not in src.tables:
            raise SchemaError(
                f"{schema.path or 'schema'}: table `{tname}` is not in the source"
                f"{did_you_mean(tname, src.tables)} "
                f"(tables: {', '.join(sorted(src.tables)) or 'none'})"
            )
        cols = {c for c, _ in src.tables[tname].columns}
        named = list(ts.columns)
        named += [c for c in (ts.primary_key, ts.time_column) if c]
        named += list((ts.foreign_keys or {}).keys())
        for c in named:
            if c not in cols:
                raise SchemaError(
                    f"{schema.path or 'schema'}: table `{tname}` has no column `{c}`"
                    f"{did_you_mean(c, cols)} (columns: {', '.join(sorted(cols))})"
                )



def _check_keys(plans: list[TablePlan]) -> None:
    """Key and time columns exist; every foreign key targets a kept table with a primary key."""
    by_name = {p.name: p for p in plans}
    for p in plans:
        cols = {c for c, _ in p.source.columns}
        for cname in [p.primary_key, p.time_column, *p.foreign_keys]:
            if cname and cname not in cols:
                raise SchemaError(f"table `{p.name}`: declared key/time column `{cname}` does not exist")
        for fk, target in p.foreign_keys.items():
            if target not in by_name:
                raise SchemaError(
                    f"table `{p.name}` foreign key `{fk}` references table `{target}`, "
                    f"which is not in the source (or is ignored){did_you_mean(target, by_name)}"
                )
            if by_name[target].primary_key is None:
                raise SchemaError(
                    f"table `{p.name}` foreign key `{fk}` references table `{target}`, "
                    "which has no primary key (declare `primary_key` for it in the schema)"
                )



def _plan(src: Source, schema: Schema) -> list[TablePlan]:
    _check_declared_columns(src, schema)
    plans = []
    for name in sorted(src.tables):
        st = src.tables[name]
        ts = schema.tables.get(name, TableSchema())
        if ts.ignore:
            continue
        plans.append(
            TablePlan(
                name=name,
                source=st,
                primary_key=ts.primary_key if "primary_key" in ts.given else st.primary_key,
                time_column=ts.time_column if "time_column" in ts.given else st.time_column,
                foreign_keys=dict(ts.foreign_keys if ts.foreign_keys is not None else st.foreign_keys),
                declared={**{c: "ignored" for c in st.hidden}, **ts.columns},
            )
        )
    _check_keys(plans)
    return plans



def _fingerprint(
    plan: TablePlan,
    index: int,
    by_name: dict[str, TablePlan] | None = None,
    stats_cutoff_us: int | None = None,
    row_order: str = "",
) -> str:
    # Foreign keys are stored as row indices into the referenced tables, so a
    # staged table is only reusable while those tables (and their keys) are too.
    by_name = by_name or {}
    parents = {
        fk: [t, by_name[t].source.identity, by_name[t].primary_key] if t in by_name else t
        for fk, t in plan.foreign_keys.items()
    }
    doc = {
        "format": _native.FORMAT_VERSION,
        "headwater": _native.__version__,
        "index": index,
        "name": plan.name,
        "identity": plan.source.identity,
        "pk": plan.primary_key,
        "time": plan.time_column,
        "fks": parents,
        "declared": plan.declared,
    }
    if stats_cutoff_us is not None:
        # The column statistics come from the rows up to the cutoff.
        doc["stats_cutoff_us"] = stats_cutoff_us
    if row_order:
        # Rows (and the row indices foreign keys hold) follow this order.
        doc["row_order"] = row_order
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
