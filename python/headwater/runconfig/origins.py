"""Where each value of a ``headwater train`` config came from.

Owns: :class:`Origins` (dotted key → ``file:line``, the command-line flag or
``--set`` that set it, or ``default``), :func:`parse_overrides` (``--set
SECTION.KEY=VALUE``) and :data:`FLAGS` (the ``headwater train`` flags that
override a config key). Every config error is prefixed with the origin of
the value it rejects, so a user knows which line or flag to change.

Line numbers come from a light scan of the TOML text (table headers and
``key =`` lines), after ``tomllib`` has parsed it: the scan never decides a
value, it only points at it.

Must never: make a value up; when a key cannot be located, it names the
file (or ``default``) without a line.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from typing import Any

from headwater.errors import ConfigError

#: ``headwater train`` flags and the config key each one overrides.
FLAGS: dict[str, str] = {
    "train.steps": "--steps",
    "train.profile": "--profile",
    "database.path": "--db",
    "logging.run_name": "--run-name",
    "logging.dir": "--dir",
    "logging.wandb_mode": "--wandb-mode",
    "logging.prometheus_port": "--prometheus-port",
}

_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*([A-Za-z0-9_.\s"'-]+?)\s*=""")


def _dotted(raw: str) -> str:
    # A quoted key with a dot inside is split at that dot too: good enough to
    # point at a line (the value itself was parsed by tomllib).
    return ".".join(p.strip().strip("\"'") for p in raw.split("."))


def locate_keys(text: str) -> dict[str, int]:
    """``{"section.key": line number}`` of every ``key = value`` line of a TOML text."""
    out: dict[str, int] = {}
    table = ""
    for n, line in enumerate(text.splitlines(), start=1):
        h = _HEADER.match(line)
        if h:
            table = _dotted(h.group(1))
            continue
        k = _KEY.match(line)
        if k:
            key = _dotted(k.group(1))
            out.setdefault(f"{table}.{key}" if table else key, n)
    return out


class Origins:
    """Dotted key → where its value was set."""

    def __init__(self, source: str, lines: Mapping[str, int] | None = None) -> None:
        self.source = source
        self.at: dict[str, str] = {k: f"{source}:{n}" for k, n in (lines or {}).items()}

    def override(self, dotted: str, value: Any) -> None:
        flag = FLAGS.get(dotted)
        how = f"--set {dotted}={value!r}" + (f" or {flag}" if flag else "")
        self.at[dotted] = f"the command line ({how})"

    def default(self, dotted: str) -> None:
        self.at.setdefault(dotted, "default")

    def of(self, dotted: str) -> str:
        """Where ``dotted`` was set; for a key no layer set: ``default`` (from
        a file: ``<file> (default)``)."""
        if dotted in self.at:
            return self.at[dotted]
        inside = [v for k, v in self.at.items() if k.startswith(f"{dotted}.")]
        if inside:  # a table: where its first key is
            return inside[0]
        parent = dotted.rpartition(".")[0]
        while parent:
            if parent in self.at:
                return self.at[parent]
            parent = parent.rpartition(".")[0]
        return "default" if self.source == "<defaults>" else f"{self.source} (default)"


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["train.steps=5", "logging.wandb_mode=offline"]`` as load_config
    overrides; values are read as TOML (``5``, ``0.5``, ``true``, ``[1, 2]``,
    ``"x"``) and fall back to a plain string."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE")
        parsed = toml_value(value)
        nested = [k for k, v in parsed.items() if isinstance(v, dict)] if isinstance(parsed, dict) else []
        if nested:
            inner = next(iter(parsed[nested[0]]))
            raise ConfigError(
                f"--set {item!r}: TOML reads the unquoted name `{nested[0]}.{inner}` as a "
                f"nested table; quote a name that holds a dot: "
                f"{key.strip()}={{\"{nested[0]}.{inner}\"=...}} (in a shell, wrap the whole "
                "argument in single quotes)"
            )
        out[key.strip()] = parsed
    return out


def toml_value(text: str) -> Any:
    """``text`` read as a TOML value (``5``, ``0.5``, ``true``, ``[1, 2]``,
    ``"x"``), else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
