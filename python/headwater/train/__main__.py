"""``python -m headwater.train --worker RANK SPEC``: one rank of a
multi-process run, started by :func:`headwater.train.launcher.launch`."""

from __future__ import annotations

import sys

from headwater.train.launcher import worker_main

if len(sys.argv) == 4 and sys.argv[1] == "--worker":
    sys.exit(worker_main(int(sys.argv[2]), sys.argv[3]))
print("usage: headwater train [CONFIG.toml] [--steps N] [--num-processes N]", file=sys.stderr)
sys.exit(2)
