"""How long does opening a database take, with the page cache cold and warm?

Each measurement is a fresh process that times ``Database(DB)`` (headers and
metadata), ``Sampler(DB)`` (plus the seed pools) and its first batch
(B = 32, S = 1024, one thread). Cold runs write back dirty pages and drop the
page cache first, which needs root (``/proc/sys/vm/drop_caches``).

    python benches/open_time.py DB [DB ...] [--rounds 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = """
import sys, time
import headwater
t0 = time.perf_counter()
headwater.Database(sys.argv[1])
t1 = time.perf_counter()
s = headwater.Sampler(sys.argv[1], num_threads=1, default_batch_size=32, default_sequence_length=1024)
t2 = time.perf_counter()
s.next_train_batch()
t3 = time.perf_counter()
s.shutdown()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError as e:
        raise SystemExit(f"open_time: cannot drop the page cache (root needed): {e}") from e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dbs", nargs="+")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    for db in a.dbs:
        for _ in range(a.rounds):
            for cache in ("cold", "warm"):
                if cache == "cold":
                    drop_page_cache()
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, db], capture_output=True, text=True, check=True
                ).stdout.split()
                database, sampler, first = (float(x) for x in out)
                print(
                    f"{db} {cache}: Database() {database * 1e3:.1f} ms, Sampler() {sampler:.2f} s, "
                    f"first batch {first * 1e3:.0f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
