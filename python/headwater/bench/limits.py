"""``headwater bench --memory-limit``: the sampler on a smaller host and on
slower storage, reproduced on this one.

Each run is a child process placed in a fresh control group whose memory
limit counts the page cache (cgroup v1's ``memory.limit_in_bytes``, v2's
``memory.max``), optionally with a block-I/O throttle on the device that
holds the database (v1 ``blkio.throttle.read_{bps,iops}_device``, v2
``io.max``). The page cache is dropped before every run: pages read earlier
stay charged to whoever read them first, so a limited run over a warm cache
would measure nothing. Runs of several limits are interleaved round by
round, so a ratio is read from one invocation on one machine.

What a run reports besides its rate: the time to its first batch (opening
included), the bytes it made the kernel read from storage (``/proc/self/io``,
read-ahead included) and the peak memory the cgroup charged. Errors name
what is missing (root, a controller, a block device) before any run starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class LimitError(RuntimeError):
    """The host cannot enforce a requested limit (the message says why)."""


def parse_size(text: str, flag: str = "--memory-limit") -> int | None:
    """Bytes in ``text`` (``600MiB``, ``600M``, ``1.5G``, ``629145600``);
    ``none`` (no limit) is ``None``. Binary units: 1 M = 2**20."""
    t = text.strip().lower()
    if t in ("none", "unlimited"):
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?", t)
    if not m:
        raise ValueError(
            f"{flag} {text!r}: expected a size such as 600MiB, 1.5G or 629145600 (bytes), or none"
        )
    n = int(float(m.group(1)) * _UNITS[m.group(2)])
    if n < 1 << 20:
        raise ValueError(f"{flag} {text!r}: {n} bytes is below 1 MiB")
    return n


@dataclass(frozen=True)
class Limits:
    """One run's conditions: memory (bytes, page cache included) and reads."""

    memory: int | None
    read_bps: int | None = None
    read_iops: int | None = None

    def label(self) -> str:
        """``600 MiB, 200 MiB/s, 2000 IOPS`` or ``no limit``."""
        parts = [f"{self.memory / 2**20:.0f} MiB" if self.memory else "no memory limit"]
        if self.read_bps:
            parts.append(f"{self.read_bps / 2**20:.0f} MiB/s")
        if self.read_iops:
            parts.append(f"{self.read_iops} IOPS")
        return ", ".join(parts)


def block_device(path: str | os.PathLike[str]) -> str:
    """``MAJ:MIN`` of the whole disk holding ``path`` (a throttle applies to
    a disk, not to a partition)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sysdev = Path("/sys/dev/block") / dev
    if os.major(st.st_dev) == 0 or not sysdev.exists():
        raise LimitError(
            f"{path} is on a file system without a block device ({dev}: overlay, tmpfs or a "
            "network mount); --read-bps/--read-iops throttle a block device: put the database "
            "on a local disk, or run without them"
        )
    if (sysdev / "partition").exists():
        return (sysdev.resolve().parent / "dev").read_text().strip()
    return dev


def cgroup_version() -> int:
    """1 when the v1 memory controller is mounted, 2 for a unified
    hierarchy with the memory controller; :class:`LimitError` otherwise."""
    if (CGROUP_ROOT / "memory" / "memory.limit_in_bytes").exists():
        return 1
    ctl = CGROUP_ROOT / "cgroup.controllers"
    if ctl.exists() and "memory" in ctl.read_text().split():
        return 2
    raise LimitError(
        f"no memory cgroup controller under {CGROUP_ROOT} (neither v1's memory/ nor a v2 "
        "hierarchy with 'memory'): this host cannot limit a run's memory"
    )


def drop_page_cache() -> None:
    """Write back dirty pages and drop the clean ones (root only)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise LimitError(
            f"cannot drop the page cache ({e}): a limited run needs root (pages read earlier "
            "stay charged to their first reader, so a run over a warm cache measures nothing)"
        ) from e


class Cgroup:
    """A fresh control group with ``limits``, removed on exit; a child joins
    it with :meth:`join` (between fork and exec)."""

    def __init__(self, limits: Limits, device: str | None) -> None:
        self.version = cgroup_version()
        name = f"headwater-bench-{os.getpid()}-{time.monotonic_ns()}"
        if self.version == 1:
            self.mem = CGROUP_ROOT / "memory" / name
            self.io = CGROUP_ROOT / "blkio" / name if device else None
        else:
            self.mem = CGROUP_ROOT / name
            self.io = self.mem if device else None
        try:
            self.mem.mkdir()
            if self.io and self.io != self.mem:
                self.io.mkdir()
            self._write_limits(limits, device)
        except OSError as e:
            self.remove()
            raise LimitError(f"cannot set up the control group {self.mem}: {e} (needs root)") from e

    def _write_limits(self, limits: Limits, device: str | None) -> None:
        if self.version == 1:
            if limits.memory:
                (self.mem / "memory.limit_in_bytes").write_text(str(limits.memory))
            if self.io and device:
                if limits.read_bps:
                    (self.io / "blkio.throttle.read_bps_device").write_text(
                        f"{device} {limits.read_bps}"
                    )
                if limits.read_iops:
                    (self.io / "blkio.throttle.read_iops_device").write_text(
                        f"{device} {limits.read_iops}"
                    )
            return
        if limits.memory:
            (self.mem / "memory.max").write_text(str(limits.memory))
        if device and (limits.read_bps or limits.read_iops):
            rules = [f"rbps={limits.read_bps}"] if limits.read_bps else []
            rules += [f"riops={limits.read_iops}"] if limits.read_iops else []
            (self.mem / "io.max").write_text(f"{device} {' '.join(rules)}")

    def join(self) -> None:
        """Move the calling process into the group (run in the child)."""
        pid = str(os.getpid())
        for d in {self.mem, self.io} - {None}:
            assert d is not None
            (d / "cgroup.procs").write_text(pid)

    def peak_bytes(self) -> int | None:
        """The most memory (page cache included) the group was charged."""
        f = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.mem / f).read_text())
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        """Remove the group (its processes have exited)."""
        for d in (self.io, self.mem):
            if d is not None and d.exists():
                for _ in range(50):
                    try:
                        d.rmdir()
                        break
                    except OSError:
                        time.sleep(0.1)


# The child reports the bytes it made the kernel fetch from storage
# (/proc/self/io read_bytes: page-cache misses and their read-ahead).
_CHILD = (
    "import json, sys\n"
    "from headwater import _native\n"
    "r = _native.bench_sampler(**json.loads(sys.argv[1]))\n"
    "io = dict(l.split(': ') for l in open('/proc/self/io').read().splitlines())\n"
    "r['read_bytes'] = int(io['read_bytes'])\n"
    "print(json.dumps(r))\n"
)


def limited_run(
    args: dict[str, Any], limits: Limits, device: str | None, timeout: float
) -> dict[str, Any]:
    """``bench_sampler(**args)`` in a child inside a fresh cgroup with
    ``limits``, after dropping the page cache; its figures plus the
    cgroup's peak memory and bytes read."""
    if (limits.read_bps or limits.read_iops) and device is None:
        raise LimitError("a read throttle needs the database's block device")
    io_device = device if (limits.read_bps or limits.read_iops) else None
    group = Cgroup(limits, io_device)
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    try:
        drop_page_cache()
        p = subprocess.Popen(
            [sys.executable, "-c", _CHILD, json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=group.join,
        )
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        if p.returncode != 0:
            peak = group.peak_bytes()
            last = (err.strip().splitlines() or ["(no output)"])[-1]
            if p.returncode == -9 and limits.memory:
                raise LimitError(
                    f"the run was killed at --memory-limit {limits.memory} bytes (peak "
                    f"{peak} bytes charged): the sampler's own memory does not fit; raise the "
                    "limit"
                )
            raise RuntimeError(f"bench process {p.pid} exited with {p.returncode}: {last}")
        run: dict[str, Any] = json.loads(out)
        run["cgroup_peak_bytes"] = group.peak_bytes()
        return run
    finally:
        group.remove()


def run_limited_bench(
    path: str | list[str],
    limits: list[Limits],
    threads: int,
    seconds: float,
    warmup: int,
    rounds: int,
    bench_args: dict[str, Any],
) -> dict[str, Any]:
    """Every limit in ``limits`` run ``rounds`` times, interleaved (limit
    by limit within a round), each for ``seconds`` after ``warmup``
    batches; the best rate of each, with its ratio to the first limit's."""
    if os.geteuid() != 0:
        raise LimitError("--memory-limit runs need root (a cgroup and dropping the page cache)")
    cgroup_version()
    first = path if isinstance(path, str) else path[0]
    throttled = any(lim.read_bps or lim.read_iops for lim in limits)
    device = block_device(first) if throttled else None
    args = dict(bench_args, db_path=path, threads=threads, steps=0, warmup=warmup, seconds=seconds)
    timeout = seconds + 600
    # A run without a memory limit is the in-memory rate: its database is
    # read in before timing (a cold start would time the disk instead).
    warm = dict(args, page_cache="populate") if args.get("page_cache", "lazy") == "lazy" else args
    runs: list[list[dict[str, Any]]] = [[] for _ in limits]
    for _ in range(rounds):
        for i, lim in enumerate(limits):
            runs[i].append(limited_run(warm if lim.memory is None else args, lim, device, timeout))
    base = max(r["batches_per_s"] for r in runs[0])
    rows = []
    for lim, rs in zip(limits, runs, strict=True):
        best = max(rs, key=lambda r: r["batches_per_s"])
        rows.append({
            "limits": lim.label(), "memory_limit_bytes": lim.memory, "read_bps": lim.read_bps,
            "read_iops": lim.read_iops, "batches_per_s": [r["batches_per_s"] for r in rs],
            "best_batches_per_s": best["batches_per_s"],
            "ratio_to_first": best["batches_per_s"] / base if base else None,
            "first_batch_seconds": min(r["first_batch_seconds"] for r in rs),
            "read_bytes": best["read_bytes"],
            "read_bytes_per_batch": _per_batch(best, warmup),
            "working_set_resident": best["working_set_resident"],
            "read_amplification": best["read_amplification"],
            "cgroup_peak_bytes": best["cgroup_peak_bytes"], "rss_bytes": best["rss_bytes"],
        })
    return {"runs": rows, "threads": threads, "seconds": seconds, "warmup": warmup,
            "rounds": rounds, "device": device, "load_average": os.getloadavg()}


def _per_batch(run: dict[str, Any], warmup: int) -> float | None:
    """Bytes read per batch made (opening and warm-up included)."""
    v = run.get("read_bytes")
    made = run["batches"] + warmup
    return v / made if v is not None and made else None


def format_limited(r: dict[str, Any]) -> str:
    """The limited runs as a table, a line per limit."""
    lines = [
        f"{r['threads']} thread(s), {r['seconds']:.0f} s per run after {r['warmup']} warm-up "
        f"batches, best of {r['rounds']} interleaved; page cache dropped before each run",
        f"{'limits':<40} {'batches/s':>10} {'ratio':>7} {'1st batch s':>11} {'MiB read/batch':>14}"
        f" {'peak MiB':>9} {'resident':>8} {'read/used':>9}",
    ]
    for row in r["runs"]:
        rb = row["read_bytes_per_batch"]
        pk = row["cgroup_peak_bytes"]
        lines.append(
            f"{row['limits']:<40} {row['best_batches_per_s']:>10.2f} "
            f"{row['ratio_to_first'] or 0:>7.3f} {row['first_batch_seconds']:>11.2f} "
            f"{(rb / 2**20 if rb is not None else float('nan')):>14.2f} "
            f"{(pk / 2**20 if pk else float('nan')):>9.0f} "
            f"{row['working_set_resident']:>8.2f} {row['read_amplification']:>9.1f}"
        )
    return "\n".join(lines)
