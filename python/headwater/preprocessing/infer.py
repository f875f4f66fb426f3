"""Semantic-type inference for columns the schema does not declare.

Rules, in order (the reason is reported so a user can override it):
key columns → identifier; boolean → boolean; date/time → timestamp; integer
named like an id (``id``, ``*_id``, ``*key``) → identifier; other numbers →
numerical; strings: few distinct values (and not all distinct: a category
seen once cannot be learned) → categorical, almost all distinct and without
spaces → identifier, otherwise → text; anything else → ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa

# A string column with at most this many distinct values is categorical ...
MAX_CATEGORIES = 256
# ... or with at most this share of distinct values and this many in all.
CATEGORICAL_RATIO = 0.05
MAX_RATIO_CATEGORIES = 2048

_ID_NAME = re.compile(r"(^id$|_id$|id$|_key$|key$)", re.IGNORECASE)


def infer_stype(
    name: str,
    t: pa.DataType,
    is_key: bool,
    string_stats: Callable[[], tuple[int, int, bool]],
) -> tuple[str, str]:
    """Return ``(semantic type, reason)`` for one column of Arrow type ``t``.
    ``string_stats()`` (called for string columns only) returns the column's
    non-null count, distinct non-null count and whether any value has a space."""
    if is_key:
        return "identifier", "primary or foreign key"
    if pa.types.is_boolean(t):
        return "boolean", "boolean column"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "timestamp", f"{t} column"
    if pa.types.is_integer(t) and _ID_NAME.search(name):
        return "identifier", "integer named like an id"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "numerical", f"{t} column"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        n, distinct, has_space = string_stats()
        if n == 0:
            return "ignored", "string column with no values"
        if distinct < n and (
            distinct <= MAX_CATEGORIES
            or (distinct <= MAX_RATIO_CATEGORIES and distinct <= CATEGORICAL_RATIO * n)
        ):
            return "categorical", f"{distinct} distinct values"
        if distinct >= 0.95 * n and not has_space:
            return "identifier", f"{distinct} distinct of {n}, no spaces"
        return "text", f"{distinct} distinct values"
    return "ignored", f"unsupported type {t}"

