"""The 1-process reference of ``test_cluster``'s "two hosts" job.

``python cluster_reference.py CONFIG OUT.json N [--set K=V ...]``: one
process (all its local devices) trains ``CONFIG`` fed, every step, by the
batches of the N sampler streams of an N-rank job (rank r of N), laid out
over the devices in rank order -- the same global batch as N processes
with one sampler each. Writes the losses and the parameter digest.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from headwater.cluster.mesh import digest, param_norm
from headwater.runconfig.config import load_config
from headwater.runconfig.database import resolve_database
from headwater.runconfig.origins import parse_overrides
from headwater.train.loop import Trainer
from headwater.train.rank import open_sampler


class Streams:
    """N samplers seen as one: ``next_train_batch`` returns one batch per stream."""

    def __init__(self, samplers: list[Any]) -> None:
        self.samplers = samplers

    def next_train_batch(self) -> list[Any]:
        return [s.next_train_batch() for s in self.samplers]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.samplers[0], name)


def main(argv: list[str]) -> int:
    import jax

    path, out, n = argv[0], Path(argv[1]), int(argv[2])
    sets = [v for k, v in itertools.pairwise(argv) if k == "--set"]
    overrides = {**parse_overrides(sets), "logging.wandb_mode": "disabled"}
    cfg = load_config(path, **overrides)
    db = resolve_database(cfg)
    samplers = [open_sampler(cfg, db, r, n) for r in range(n)]
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Streams(samplers), Path(run_dir), 0, 1, None, streams=n)
        trainer.run_steps()
    for s in samplers:
        s.shutdown()
    out.write_text(
        json.dumps(
            {
                "devices": jax.device_count(),
                "losses": trainer.log.losses,
                "param_digest": digest(trainer.params),
                "param_norm": param_norm(trainer.params),
            }
        ),
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
