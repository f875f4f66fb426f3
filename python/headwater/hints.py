"""Hints for a name a user typed: the known name it looks like a typo of.

Owns: :func:`did_you_mean`, used wherever a user gives a key or a name
(``--set`` and ``headwater train`` config files, the schema file of
``headwater preprocess``, corpus and mixture files, ``[diag]`` tables, task
names in ``task_weights``), so every "unknown ..." error offers the same
hint. Imports nothing heavy: the preprocessing and the config code load it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(key: str, known: Iterable[str], prefix: str = "") -> str:
    """`` (did you mean `x`?)`` for the known name closest to ``key`` when
    it looks like a typo of it (``prefix`` before it: its section), else
    ``""``."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f" (did you mean `{prefix}{close[0]}`?)" if close else ""


def first_unknown_hint(unknown: Iterable[str], known: Iterable[str], prefix: str = "") -> str:
    """:func:`did_you_mean` for the first of ``unknown`` names that has one."""
    known, names = list(known), list(unknown)
    for name in names:
        hint = did_you_mean(name, known, prefix)
        if hint and len(names) > 1:
            return hint.replace("(did you mean", f"(`{name}`: did you mean", 1)
        if hint:
            return hint
    return ""
