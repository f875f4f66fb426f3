"""Local worker processes: start one process per rank of a command, forward
SIGTERM/SIGINT to them, watch them by PID, and stop the others the moment
one fails.

Owns: :func:`run_workers` (all of it, and every worker killed on the way
out), :func:`start_workers`, :func:`forward_signals` and :func:`watch`.
Rank 0 writes to this process's stdout and stderr, rank ``r > 0`` to
``<log_dir>/rank-<r>.log``, whose tail the error of a failed rank carries.
What a worker runs is the caller's (``headwater train``'s ranks:
:func:`headwater.train.launcher.launch`).

Must never: hide a failed rank, leave a worker running after
:func:`run_workers` returns or raises, or force a platform (the workers
inherit the environment: GPUs are used when present).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from headwater.cluster.stopping import StartupInterrupted, StopFlag

#: The command line of rank ``r``'s process.
Command = Callable[[int], list[str]]


def run_workers(command: Command, world: int, log_dir: Path, timeout_s: float | None) -> None:
    """Run ``world`` processes of ``command`` until all exit 0; the first
    failure (or the timeout) raises after the others are killed. A signal
    here is forwarded to every worker (:func:`forward_signals`)."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    forward = forward_signals(procs)
    try:
        procs[:], logs = start_workers(command, world, log_dir)
        watch(procs, log_dir, timeout_s, forward)
    finally:
        forward.restore()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def start_workers(
    command: Command, world: int, log_dir: Path
) -> tuple[list[subprocess.Popen[bytes]], list[IO[bytes]]]:
    """Start rank ``0 .. world-1``; returns the processes and the open logs."""
    env = dict(os.environ)  # no platform forced: GPUs are used when present
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    for r in range(world):
        log = None
        if r > 0:
            log = (log_dir / f"rank-{r}.log").open("wb")
            logs.append(log)
        procs.append(
            subprocess.Popen(
                command(r),
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                env=env,
            )
        )
    return procs, logs


def forward_signals(procs: list[Any]) -> StopFlag:
    """SIGTERM/SIGINT here → SIGTERM to every worker (they checkpoint and
    stop); a second signal ends the launcher (and ``run_workers`` kills them)."""

    class Forward(StopFlag):
        def _handle(self, signum: int, frame: Any) -> None:
            super()._handle(signum, frame)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)

    return Forward(hard_on_second=True, announce=True).install()


def watch(
    procs: list[Any], log_dir: Path, timeout_s: float | None, stop: StopFlag | None = None
) -> None:
    """Wait for every worker; the first non-zero exit (or the timeout) raises
    (:class:`~headwater.cluster.stopping.StartupInterrupted` after a
    forwarded signal: the ranks stop at once during their start-up)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs) or any(p.returncode for p in procs):
        failed = [(r, p) for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            r, p = failed[0]
            if stop is not None and stop.signum:
                raise StartupInterrupted(stop.signum)
            tail = ""
            if r > 0:
                tail = (log_dir / f"rank-{r}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"rank {r} (pid {p.pid}) exited with status {p.returncode}; "
                "the other ranks were stopped" + (f"\n--- rank {r} log ---\n{tail}" if tail else "")
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"training did not finish in {timeout_s} s")
        time.sleep(0.05)
