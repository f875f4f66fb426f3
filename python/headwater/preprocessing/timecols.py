"""Time columns for sources that declare none (SQL databases, CSV/Parquet).

Without a time column every row is visible to every seed, so a task on such
a table is silently non-temporal and the sampler shows each seed rows from
its future. When the source declares no time column on any table, each table
the schema leaves undecided gets one proposed: its single non-null timestamp
column, else its single timestamp column named like a creation/event time.
The choice is printed as a schema line to copy or override; a table that has
timestamp columns but ends up without a time column is warned about loudly.
``time_columns="none"`` turns all of this off (the source's declarations only).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from headwater.preprocessing.sources import Source, quote

if TYPE_CHECKING:
    from headwater.preprocessing.plan import TablePlan
    from headwater.preprocessing.schema import Schema

MODES = ("propose", "none")

_EVENT_NAME = re.compile(
    r"(creat|event|insert|regist|signup|order|_at$|^at$|_on$|time|date|when)", re.IGNORECASE
)


def _is_timestamp(duck_type: str) -> bool:
    return duck_type.upper().startswith(("TIMESTAMP", "DATE"))


def _choose(src: Source, plan: TablePlan, stamps: list[str]) -> tuple[str | None, str]:
    nulls = {}
    for c in stamps:
        row = src.con.execute(
            f"SELECT count(*) FILTER (WHERE {quote(c)} IS NULL) FROM {quote(plan.name)}"
        ).fetchone()
        nulls[c] = row[0] if row else 0
    non_null = [c for c in stamps if nulls[c] == 0]
    if len(non_null) == 1:
        return non_null[0], "the only timestamp column without nulls"
    named = [c for c in stamps if _EVENT_NAME.search(c)]
    if len(named) == 1:
        return named[0], "the only timestamp column named like a creation/event time"
    return None, f"{len(non_null)} timestamp columns without nulls, {len(named)} named like an event time"


def propose_time_columns(
    src: Source, plans: list[TablePlan], schema: Schema, mode: str, log: Callable[[str], None]
) -> None:
    """Set ``plan.time_column`` where proposed (see the module doc)."""
    if mode not in MODES:
        raise ValueError(f"time_columns must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "none" or any(st.time_column for st in src.tables.values()):
        return
    for plan in plans:
        ts = schema.tables.get(plan.name)
        decided = ts is not None and "time_column" in ts.given
        if plan.time_column or decided:
            continue
        keys = {plan.primary_key, *plan.foreign_keys}
        stamps = [c for c, t in plan.source.columns if _is_timestamp(t) and c not in keys]
        if not stamps:
            continue
        choice, why = _choose(src, plan, stamps)
        if choice is not None:
            plan.time_column = choice
            log(
                f'time column proposed: [tables.{plan.name}] time_column = "{choice}"  # {why}; '
                "put this line in a schema file to keep it or name another "
                "(--time-columns none: no proposals)"
            )
        else:
            log(
                f"WARNING: table `{plan.name}` has timestamp columns {', '.join(stamps)} but no "
                f"time column ({why}): every seed sees all its rows, including rows from the "
                f'seed\'s future. Declare one: [tables.{plan.name}] time_column = "{stamps[0]}"'
            )
