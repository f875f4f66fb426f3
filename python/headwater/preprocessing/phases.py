"""What a preprocessing run reports as it goes: per-phase wall time,
throughput and peak resident memory (:class:`_Phases`, logged as each phase
ends), and the row progress bar. Measures only; never changes what is
written.
"""

from __future__ import annotations

import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _rss() -> tuple[int, int]:
    """(VmRSS, RssAnon) of this process now, in bytes ((0, 0) where unknown).
    RssAnon is private memory; VmRSS adds mapped file pages (the output
    files the writer maps to verify them), which the kernel can drop."""
    got = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "RssAnon:")):
                    got[line.split(":")[0]] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return got.get("VmRSS", 0), got.get("RssAnon", 0)



def _peak_rss() -> int:
    """Peak resident memory of this process over its life, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024



class _Phases:
    """Per-phase wall time, throughput and peak RSS, logged as each phase
    ends. The phase peak is sampled every 20 ms by a thread (the process
    peak, ``ru_maxrss``, cannot be reset without touching the caller's
    counters), so a spike shorter than that can be missed."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.report: list[dict[str, float | str]] = []

    @contextmanager
    def phase(self, name: str, count: int, unit: str = "rows") -> Iterator[None]:
        peak = list(_rss())
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.02):
                rss, anon = _rss()
                peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)

        watcher = threading.Thread(target=sample, name=f"rss {name}", daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
        dt = max(time.perf_counter() - t0, 1e-9)
        rss, anon = _rss()
        peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
        self.report.append(
            {"phase": name, unit: count, "seconds": dt, "peak_rss_bytes": peak[0], "peak_anon_bytes": peak[1]}
        )
        self.log(
            f"phase {name}: {count:,} {unit} in {dt:.1f} s ({count / dt:,.0f} {unit}/s), "
            f"peak RSS {peak[0] / 2**20:,.0f} MiB (private {peak[1] / 2**20:,.0f} MiB)"
        )

    def summary(self) -> None:
        self.log(f"peak RSS of the whole run (ru_maxrss): {_peak_rss() / 2**20:,.0f} MiB")



class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass



def log_line(message: str) -> None:
    """One line of the preprocessing log on stderr, through tqdm: a live
    progress bar is cleared first and drawn again below the line, so the
    two never share a line."""
    from tqdm.auto import tqdm

    tqdm.write(message, file=sys.stderr)


def _row_bar(desc: str, total: int, enabled: bool) -> Any:
    """A progress bar counting rows (tqdm shows rows/s)."""
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(desc=desc, total=total, unit="row", unit_scale=True, file=sys.stderr)
