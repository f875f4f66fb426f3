"""Do N sampler processes on one database share its pages?

Starts N processes that each open a Sampler on DB, touch the data (validation
reads every file; then a few batches), and report RSS and PSS (proportional
set size: shared pages divided among the processes mapping them) from
/proc/<pid>/smaps_rollup. If the maps are shared, the summed PSS stays near
one copy of the data plus each process's private memory, while the summed RSS
grows with N.

    python benches/shared_pages.py DB [--processes 8] [--batches 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

CHILD = """
import sys, time
import headwater._native as n
s = n.Sampler(sys.argv[1], default_batch_size=32, default_sequence_length=1024, num_threads=1)
for _ in range(int(sys.argv[2])):
    s.next_train_batch()
print("ready", flush=True)
sys.stdin.read()
s.shutdown()
"""


def rollup(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def measure(db: str, processes: int, batches: int) -> dict[str, Any]:
    import headwater._native as n

    data = n.Database(db).bytes_on_disk
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, db, str(batches)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a sampler process failed to start")
        time.sleep(0.5)
        stats = [rollup(p.pid) for p in procs]
    finally:
        for p in procs:
            if p.stdin:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    rss = [s["Rss"] for s in stats]
    pss = [s["Pss"] for s in stats]
    file_pss = [s.get("Pss_File", 0) for s in stats]
    anon = [s.get("Anonymous", 0) for s in stats]
    return {
        "db_bytes": data,
        "processes": processes,
        "rss_per_process": rss,
        "pss_per_process": pss,
        "pss_file_per_process": file_pss,
        "anonymous_per_process": anon,
        "sum_rss": sum(rss),
        "sum_pss": sum(pss),
        "sum_pss_file": sum(file_pss),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure(a.db, a.processes, a.batches)
    if a.json:
        print(json.dumps(r))
        return
    mib = 2**20
    print(f"database {r['db_bytes'] / mib:.0f} MiB mapped by {r['processes']} processes")
    print(f"RSS per process  {[round(x / mib) for x in r['rss_per_process']]} MiB (sum {r['sum_rss'] / mib:.0f})")
    print(f"PSS per process  {[round(x / mib) for x in r['pss_per_process']]} MiB (sum {r['sum_pss'] / mib:.0f})")
    print(f"file-backed PSS  sum {r['sum_pss_file'] / mib:.0f} MiB (one copy of the mapped data would be {r['db_bytes'] / mib:.0f})")
    print(f"private (Anonymous) per process  {[round(x / mib) for x in r['anonymous_per_process']]} MiB")


if __name__ == "__main__":
    main()
