"""``row_order = "locality"``: the rows of every table written in an order
that puts a context's rows on few pages.

A context grows from its seed row through foreign keys, to the parent and
to the parent's other children. Written in the source's order (often key or
insertion order) those rows lie all over the database's files, so a batch
reads thousands of random pages and a database larger than the page cache
is read at the storage's speed. Here every table is grouped under one
parent: the table its foreign keys reference with the most rows (the most
specific grouping; ties by column name), its rows ordered by their parent's
position, then by their own key (or, with none, by every column, so the
order is the same on every run). Parents come first, so a customer's orders
sit together in customer order and each order's line items sit together in
order order: an order's context (its customer, the customer's other orders
and their line items) lies in one short stretch of each file. Tables with no
parent are ordered by their primary key; one with neither is left as it is.
A cycle of chosen parents is cut at its first table by name.

The reordered tables are DuckDB temporary tables that shadow the source's
by name, so everything after (keys, columns, foreign keys, SQL tasks) reads
them unchanged; the task seeds are then written in the order of their
anchor rows (:data:`SEEDS_BY_ROW`), so that a window of consecutive seeds
(the sampler's ``seed_windows``) is a stretch of the database. What it buys
and what it costs is measured in the sampling guide's "Memory" section.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

import duckdb

from headwater.preprocessing.plan import TablePlan
from headwater.preprocessing.sources import Source, quote

ROW_ORDERS = ("source", "locality")

#: Write each task's seeds sorted by (anchor row, observation time): set by
#: ``preprocess`` while it writes a ``locality`` database.
SEEDS_BY_ROW: ContextVar[bool] = ContextVar("SEEDS_BY_ROW", default=False)


def check_row_order(value: object, where: str = "row_order") -> str:
    if value not in ROW_ORDERS:
        raise ValueError(f"{where} {value!r}: expected one of {', '.join(map(repr, ROW_ORDERS))}")
    return str(value)


def cluster_parents(plans: list[TablePlan], counts: dict[str, int]) -> dict[str, tuple[str, str]]:
    """Each table's chosen parent, ``{table: (foreign key column, parent)}``:
    the referenced table (not itself, with a primary key) with the most rows,
    ties by column name; a cycle of choices loses its first table's by name."""
    by_name = {p.name: p for p in plans}
    parent: dict[str, tuple[str, str]] = {}
    for p in plans:
        candidates = sorted(
            (-counts[t], fk, t)
            for fk, t in p.foreign_keys.items()
            if t != p.name and t in by_name and by_name[t].primary_key
        )
        if candidates:
            _, fk, t = candidates[0]
            parent[p.name] = (fk, t)
    for start in sorted(parent):
        path = [start]
        while path[-1] in parent:
            nxt = parent[path[-1]][1]
            if nxt in path:
                cut = min(path[path.index(nxt):])
                del parent[cut]
                break
            path.append(nxt)
    return parent


def _parents_first(plans: list[TablePlan], parent: dict[str, tuple[str, str]]) -> list[TablePlan]:
    done: set[str] = set()
    out: list[TablePlan] = []
    by_name = {p.name: p for p in plans}

    def visit(name: str) -> None:
        if name in done:
            return
        if name in parent:
            visit(parent[name][1])
        done.add(name)
        out.append(by_name[name])

    for p in plans:
        visit(p.name)
    return out


def describe(plans: list[TablePlan], parent: dict[str, tuple[str, str]]) -> str:
    """The whole order in one string (part of every table's fingerprint: a
    table's foreign keys point at rows whose positions this decides)."""
    parts = []
    for p in plans:
        if p.name in parent:
            fk, t = parent[p.name]
            parts.append(f"{p.name} by {fk} -> {t}")
        elif p.primary_key:
            parts.append(f"{p.name} by {p.primary_key}")
        else:
            parts.append(f"{p.name} as is")
    return "locality: " + "; ".join(parts)


def order_rows(
    src: Source, plans: list[TablePlan], counts: dict[str, int], log: Callable[[str], None]
) -> str:
    """Shadow each table of ``src`` with a temporary copy in locality order;
    returns :func:`describe`'s string."""
    parent = cluster_parents(plans, counts)
    catalog = src.con.execute("SELECT current_database()").fetchone()
    assert catalog is not None
    origin = f"{quote(catalog[0])}.main."
    for p in _parents_first(plans, parent):
        if p.name not in parent and not p.primary_key:
            continue
        t = quote(p.name)
        own = [f"t.{quote(p.primary_key)}"] if p.primary_key else [f"t.{quote(c)}" for c, _ in p.source.columns]
        if p.name in parent:
            fk, target = parent[p.name]
            by = ", ".join(["__hw_parent.__hw_pos NULLS LAST", *own])
            join = (
                f"LEFT JOIN {quote('__hw_pos_' + target)} AS __hw_parent "
                f"ON t.{quote(fk)} = __hw_parent.__hw_key"
            )
            log(f"  row order: {p.name} grouped by {fk} → {target}")
        else:
            by, join = ", ".join(own), ""
        try:
            if p.primary_key:
                src.con.execute(
                    f"CREATE TEMP TABLE {quote('__hw_pos_' + p.name)} AS SELECT t.{quote(p.primary_key)} "
                    f"AS __hw_key, row_number() OVER (ORDER BY {by}) AS __hw_pos FROM {origin}{t} AS t {join}"
                )
            src.con.execute(f"CREATE TEMP TABLE {t} AS SELECT t.* FROM {origin}{t} AS t {join} ORDER BY {by}")
        except duckdb.Error as e:
            raise RuntimeError(f"row_order = 'locality': cannot reorder table `{p.name}`: {e}") from e
    return describe(plans, parent)
