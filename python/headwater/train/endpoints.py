"""Where a run's Prometheus exporters listen, and how a Prometheus finds them.

Owns: :func:`exporter_port` (this rank's port: ``logging.prometheus_port +
rank``, or a free port with ``"auto"``, or 0 = off), :func:`rank_endpoints`
(every rank's ``host:port``, gathered over the job: with ``"auto"`` no rank
can guess another's) and :func:`write_file_sd` (``prometheus_targets.json``
in the run directory: a Prometheus ``file_sd`` targets file listing every
rank's endpoint with its labels, so a Prometheus discovers a run's ranks
from ``runs/<name>/prometheus_targets.json``; Prometheus globs only the
file name).

Target labels are ``headwater_run`` and ``headwater_process``: the series
keep their own ``rank`` / ``split`` / ``task`` labels, so the dashboards'
queries read the same series as with a hand-written scrape config.

Must never: bind anything itself (the sampler's exporter binds), or list an
endpoint nobody serves.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from headwater.cluster.job import gather_strings

#: The file ``headwater train`` writes into the run directory.
FILE_SD = "prometheus_targets.json"


def exporter_port(port: int | str, rank: int) -> int:
    """This rank's exporter port (0 = no exporter)."""
    if port == "auto":
        from headwater.telemetry import free_port

        return free_port()
    return int(port) + rank if int(port) else 0


def rank_endpoints(host: str, port: int) -> list[str]:
    """Every rank's ``host:port`` (rank order); one host collective when
    there are several processes. A wildcard ``host`` is replaced by this
    machine's name, so the others can reach it."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return gather_strings(f"{host}:{port}")


def write_file_sd(run_dir: Path, endpoints: list[str], run_name: str) -> Path:
    """The ``file_sd`` targets file: one group per rank, with its labels."""
    groups: list[dict[str, Any]] = [
        {"targets": [ep], "labels": {"headwater_run": run_name, "headwater_process": str(r)}}
        for r, ep in enumerate(endpoints)
    ]
    path = run_dir / FILE_SD
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(groups, indent=1), encoding="utf-8")
    tmp.replace(path)  # a Prometheus watching the file never reads half of it
    return path
