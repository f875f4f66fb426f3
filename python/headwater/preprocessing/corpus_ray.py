"""Preprocessing a corpus on Ray: one task per source.

:func:`run_on_ray` builds the sources a corpus run has left to build, each
as a Ray task named ``preprocess:<name>`` (so Ray's dashboard lists them)
that calls the same build as the sequential path, so every database is
byte-identical to it. A source with a ``memory_limit`` asks Ray for that
much memory (Ray's ``memory`` resource), so a node runs fewer large sources
side by side; every task asks for one CPU.

Where the cluster is: ``address`` (``host:port`` of a running cluster's
GCS, checked to answer before any work starts) or, with none, a local Ray
instance that this process starts on this host's CPUs and stops at the end
(no dashboard; Ray's own token authentication is on where the installed
Ray has it). Ray's servers listen on every interface and Ray has no switch
to change that: on a shared network, start the cluster yourself behind a
firewall and pass its address. The output root must be a folder every node
of the cluster reads and writes at the same path (a shared file system),
and every node needs headwater installed.

A failing source is reported with its error (the task returns it) and the
others go on; a task lost with its worker (the node died, the kernel's OOM
killer) is reported as failed naming Ray's error. ``fail_fast`` cancels
what has not finished at the first failure.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from headwater.preprocessing.memory import parse_size


class Source(Protocol):
    """What a task needs of a corpus source (``corpus.CorpusSource``)."""

    @property
    def name(self) -> str: ...

    @property
    def options(self) -> dict[str, Any]: ...

    def size(self) -> int: ...


#: Builds a source into the output root: its report row's fields (status,
#: error, seconds), never raising (``corpus.build_row``).
Build = Callable[[Path, Any], dict[str, Any]]


def check_address(address: str, timeout_s: float = 5.0) -> tuple[str, int]:
    """``host:port`` of a Ray cluster that answers: a ``ValueError`` naming
    the address and why otherwise (malformed, or nothing accepts a
    connection there within ``timeout_s``)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray-address {address!r}: expected HOST:PORT of the cluster's head, "
                         "e.g. 10.0.0.5:6379")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise ValueError(f"--ray-address {address}: no Ray cluster answers there ({e}); start one "
                         "with `ray start --head` or leave --ray-address out to start a local one") from e
    return host, int(port)


def _task(build: Build, out: str, source: Source) -> dict[str, Any]:
    """One source, on a Ray worker: its report row's fields (``build``
    reports a failing source's error in them) and the node it ran on."""
    import ray

    return {"node": ray.get_runtime_context().get_node_id()[:12], **build(Path(out), source)}


def _options(s: Source) -> dict[str, Any]:
    # SPREAD: sources go to every node of the cluster, not first to fill
    # the head (its disk and page cache), whatever the order they finish in.
    opts: dict[str, Any] = {
        "name": f"preprocess:{s.name}", "num_cpus": 1, "max_retries": 0,
        "scheduling_strategy": "SPREAD",
    }
    if s.options.get("memory_limit") is not None:
        opts["memory"] = parse_size(s.options["memory_limit"])
    return opts


def run_on_ray(
    out: Path,
    todo: Sequence[tuple[Source, dict[str, Any]]],
    build: Build,
    *,
    address: str | None,
    fail_fast: bool,
    log: Callable[[str], None],
    said: Callable[[int, Any, dict[str, Any]], None],
) -> dict[str, Any]:
    """Build each ``(source, report row)`` of ``todo`` with ``build`` as a
    Ray task, filling its row as it finishes (largest sources submitted first); the
    cluster's resources as Ray saw them."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("--ray needs Ray: pip install 'ray>=2.9'") from e
    started = not ray.is_initialized()
    if started:
        kw: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
        if address is None:
            kw |= {"include_dashboard": False}
        ray.init(address=address, **kw)
    try:
        resources = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "memory")}
        log(f"ray: {len(ray.nodes())} node(s), {resources.get('CPU', 0):g} CPUs; "
            f"{len(todo)} source(s) to build")
        task = ray.remote(_task)
        order = sorted(todo, key=lambda t: (-t[0].size(), t[0].name))
        pending = {task.options(**_options(s)).remote(build, str(out), s): (s, row) for s, row in order}
        t0, done = time.perf_counter(), 0
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            s, row = pending.pop(ref)
            try:
                row.update(ray.get(ref))
            except ray.exceptions.RayError as e:  # the worker or its node was lost
                row.update(status="failed", error=f"{type(e).__name__}: {e}".splitlines()[0],
                           seconds=time.perf_counter() - t0)
            done += 1
            said(done, s, row)
            if fail_fast and row["status"] == "failed":
                for r in pending:
                    ray.cancel(r, force=True)
                break
        return {"engine": "ray", "nodes": len(ray.nodes()), "resources": resources}
    finally:
        if started:
            ray.shutdown()
