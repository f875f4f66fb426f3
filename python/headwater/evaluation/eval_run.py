"""``headwater eval RUN_DIR [--split val|test|both] [--step N]``: score a
training checkpoint without training.

Picks checkpoint ``--step`` (default: the latest committed one) of the run's
orbax checkpoints (``RUN_DIR/checkpoints/<step>/``,
:mod:`headwater.rundir.checkpoint`), rebuilds the run's config from its
launch record (``launch.json``: the config and overrides it was started
with), and refuses, naming what, a run directory with no committed
checkpoint, a step that is not a committed one, a checkpoint written under
another ``[database]`` or ``[model]`` config than the launch record gives
now, and a checkpoint of another database (its sampler state's content
hash, checked by the sampler). The parameters are restored read-only (the
run's checkpoint manager is never opened, so a save in flight is not
touched); full passes over the requested splits run on one process with
rank 0's sampler keys and world size 1 (the eval shard rule makes that the
union of any world size's passes); the per-task table is printed and each
split's results are written to ``RUN_DIR/eval-<split>.json``.

Must never: train, write anything but ``eval-<split>.json``, or score
parameters against a database or model they were not trained with.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from headwater.errors import ConfigError
from headwater.evaluation.scoring import format_table

#: Config sections a checkpoint must share with the run's config to be scored.
SECTIONS_CHECKED = ("database", "model")


def pick_checkpoint(run_dir: Path, step: int | None) -> int:
    """``step`` if it is a committed checkpoint of ``run_dir`` (the latest when
    ``None``); a :class:`ConfigError` naming the committed steps otherwise."""
    from headwater.rundir import checkpoint as C

    steps = C.committed_steps(run_dir)
    if not steps:
        raise ConfigError(
            f"headwater eval {run_dir}: no committed checkpoint under {run_dir / C.CHECKPOINTS}/ "
            "(a run writes one every train.checkpoint_every steps and at its end)"
        )
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ConfigError(
            f"headwater eval {run_dir} --step {step}: no committed checkpoint {step}; "
            f"committed: {', '.join(map(str, steps))}"
        )
    return step


def checked_config(run_dir: Path, step: int, meta: dict[str, Any]) -> Any:
    """The run's :class:`TrainConfig` from its launch record, refused when
    checkpoint ``step`` was written under another database or model config."""
    from headwater.runconfig.config import load_config
    from headwater.rundir import checkpoint as C

    config, overrides = C.read_launch_record(run_dir, "headwater eval")
    cfg = load_config(config, **overrides)
    now = json.loads(json.dumps(cfg.to_dict()))  # as saved: tuples are lists
    diffs = C.config_differences(
        meta["config"], now, SECTIONS_CHECKED, (), C.section_defaults(cfg, SECTIONS_CHECKED)
    )
    if diffs:
        raise ConfigError(
            f"headwater eval {run_dir}: checkpoint {step} was written under another "
            "[database]/[model] config than the run's launch record gives now: "
            + "; ".join(diffs)
        )
    return cfg


def evaluate_run(
    run_dir: Path,
    splits: tuple[str, ...] = ("test",),
    max_seeds: int | None = None,
    step: int | None = None,
) -> tuple[int, dict[str, Any]]:
    """``(step, {split: {task: {"stype", "count", "metrics", "baseline"}}})``
    of checkpoint ``step`` (the latest when ``None``)."""
    from headwater.cluster.mesh import Mesh
    from headwater.errors import StateError
    from headwater.evaluation.evaluate import Evaluator, pass_progress
    from headwater.evaluation.padder import Padder
    from headwater.mixture import open_sampler
    from headwater.model import transformer as M
    from headwater.model.device import tables_to_device
    from headwater.runconfig.database import resolve_database
    from headwater.rundir import checkpoint as C

    run_dir = Path(run_dir)
    C.read_launch_record(run_dir, "headwater eval")  # a run directory at all?
    step = pick_checkpoint(run_dir, step)
    meta = C.read_meta(run_dir, step)
    cfg = checked_config(run_dir, step, meta)
    db = resolve_database(cfg)
    kw = cfg.sampler_kwargs(0)
    kw.update(num_prefetch=1)
    sampler = open_sampler(db, rank=0, world_size=1, **kw)
    try:
        # The passes do not read the training stream: its state is only
        # checked (same database, same stream config), not restored.
        sampler.check_state_dict(meta["sampler"])
    except StateError as e:
        sampler.shutdown()
        raise ConfigError(
            f"headwater eval {run_dir}: checkpoint {step} does not fit the database {db}: {e}"
        ) from None
    out: dict[str, Any] = {}
    with sampler:
        col_np, cat_np = sampler.column_embeddings(), sampler.categorical_embeddings()
        model_cfg = dataclasses.replace(
            cfg.model, max_categories=int(meta["model_max_categories"])
        )
        local = M.init_params(cfg.train.seed, model_cfg, int(col_np.shape[1]))
        params = C.restore_params(run_dir, step, local, M.init_opt_state(local, cfg.optim))
        print(
            f"headwater eval: restored the parameters of checkpoint {step} "
            f"({run_dir / C.CHECKPOINTS / str(step)}: after {step} training steps)",
            flush=True,
        )
        mesh = Mesh()
        tables = mesh.replicate(tables_to_device(col_np, cat_np))
        ev = Evaluator(
            sampler, mesh, Padder(mesh, model_cfg.max_categories), model_cfg, tables, db_dir=db
        )
        params = mesh.replicate(params)
        tty = sys.stdout.isatty()
        for split in splits:
            out[split] = ev.evaluate(
                params, split, max_seeds, progress=pass_progress(f"eval {split}", tty)
            )
            (run_dir / f"eval-{split}.json").write_text(
                json.dumps(out[split], indent=1), encoding="utf-8"
            )
    return step, out


def main(run_dir: str, split: str, max_seeds: int | None, step: int | None = None) -> int:
    splits = ("val", "test") if split == "both" else (split,)
    done, results = evaluate_run(Path(run_dir), splits, max_seeds, step)
    print(f"headwater eval: checkpoint {done} of {run_dir}", flush=True)
    print(format_table(results), flush=True)
    return 0
