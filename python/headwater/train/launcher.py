"""The ``headwater train`` launcher: one process, N local processes that
join one ``jax.distributed`` job on loopback, or one process of a job a
cluster launcher started (:mod:`headwater.cluster.job`).

Owns: :func:`launch` (check the config, join the cluster job if there is
one, resolve the database once with
:func:`headwater.runconfig.database.resolve_database`, pick the run
directory, then run this process's rank here or start ``--num-processes``
workers, which :mod:`headwater.cluster.workers` watches by PID),
:func:`run_directory` and the worker entry point (``python -m
headwater.train --worker RANK SPEC``).

``launch(resume=RUN_DIR)`` continues a run from its last checkpoint: the
config and overrides of the first start (``launch.json``) with the new ones
on top, checked against the checkpoint first
(:func:`headwater.rundir.checkpoint.check_resume`). SIGTERM/SIGINT: the
launcher forwards SIGTERM to its workers, which stop after the same step,
checkpoint and write their summaries; :func:`launch` then prints the command
that resumes the run.

A worker that fails exits at once with its traceback on stderr, without the
``jax.distributed`` shutdown barrier (which would wait for the ranks still
training); the launcher sees the exit, stops the other ranks and reports the
failed rank with the tail of its log.

Must never: hide a failed rank, leave a worker running after ``launch``
returns or raises, or leave an empty run directory behind after a failed
start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from headwater.cluster import watchdog as W
from headwater.cluster.stopping import StopFlag
from headwater.errors import ConfigError
from headwater.runconfig.config import TrainConfig, load_config
from headwater.runconfig.database import resolve_database
from headwater.rundir import checkpoint as C

Config = str | Path | Mapping[str, Any] | None


def run_directory(cfg: TrainConfig, name: str) -> Path:
    """Where the run ``name`` of ``cfg`` writes: ``<logging.dir>/<name>``."""
    return Path(cfg.logging.dir).expanduser().resolve() / name


def default_run_name() -> str:
    return time.strftime("train-%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def launch(
    config: Config = None,
    *,
    num_processes: int | None = None,
    run_name: str | None = None,
    timeout_s: float | None = None,
    resume: str | Path | None = None,
    coordinator: str | None = None,
    process_id: int | None = None,
    coordinator_timeout_s: float | None = None,
    reshard: bool = False,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Run ``headwater train``: returns the summaries of the ranks run here
    (every rank, in order, for a local job; this process's for a cluster job).

    Without a coordinator, ``num_processes > 1`` starts that many local
    processes (``python -m headwater.train --worker``) on one loopback
    ``jax.distributed`` job; the first failure stops the others. With one
    (or a cluster launcher's environment), this process joins that job.
    ``resume``: a run directory to continue (``config`` and ``overrides``
    then default to its first start's); under a cluster launcher every
    process is given the same ``resume``. A resume keeps the run's process
    count (``num_processes`` defaults to the checkpoint's); another one is
    refused unless ``reshard`` (which prints what changes). A run stopped
    by SIGTERM/SIGINT returns summaries with ``interrupted`` set.
    """
    from headwater.cluster.job import join_job, resolve_job

    if resume is not None:
        resume = Path(resume).expanduser().resolve()
        config, overrides = _resume_arguments(resume, config, overrides)
        run_name = resume.name
        if num_processes is None and coordinator is None and not _job_from_env():
            num_processes = C.recorded_world(resume)
    cfg = load_config(config, **overrides)
    job = resolve_job(
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        timeout_s=coordinator_timeout_s,
    )
    start = _Start(config, dict(overrides), resume is not None, reshard)
    if job.mode in ("explicit", "auto"):
        join_job(job)
        return [_run_joined(cfg, run_name, start)]
    world = job.num_processes
    _check_ranks(cfg, world)
    db = resolve_database(cfg)
    cfg.check_tasks(db)
    name = run_name or cfg.logging.run_name or default_run_name()
    return _in_run_dir(
        cfg,
        db,
        name,
        start,
        world,
        lambda run_dir: (
            [_train_here(cfg, db, run_dir, resume=start.resume)]
            if world == 1
            else _launch_many(config, overrides, db, run_dir, world, timeout_s, start.resume)
        ),
    )


@dataclasses.dataclass(frozen=True)
class _Start:
    """How this run was started: what the launch record keeps (a new run)
    or what ``--resume`` read back from it."""

    config: Config
    overrides: dict[str, Any]
    resume: bool
    #: ``--reshard``: a resume may change the process count.
    reshard: bool = False


def _job_from_env() -> bool:
    """Whether the environment sets the job's size (``HEADWATER_NUM_PROCESSES``
    or a cluster launcher's variables): a resume then leaves it to them."""
    from headwater.cluster.job import ENV_NUM_PROCESSES, detect_launcher

    return ENV_NUM_PROCESSES in os.environ or detect_launcher(os.environ) is not None


def _train_here(cfg: TrainConfig, db: Path, run_dir: Path, **kw: Any) -> dict[str, Any]:
    from headwater.train.rank import train_rank

    return train_rank(cfg, db, run_dir, **kw)


def _check_ranks(cfg: TrainConfig, world: int) -> None:
    bad = sorted(r for r in cfg.ranks if r >= world)
    if bad:
        raise ConfigError(
            f"{cfg.where('ranks', str(bad[0]))}: [ranks.{bad[0]}] names a rank outside "
            f"0..{world - 1} ({world} processes in the job)"
        )


def _in_run_dir(
    cfg: TrainConfig,
    db: Path,
    name: str,
    start: _Start,
    world: int,
    body: Callable[[Path], list[dict[str, Any]]],
    lead: bool = True,
) -> list[dict[str, Any]]:
    """``body(run_dir)`` in the run's directory: a resume is checked against
    its checkpoint, a new run refuses a directory holding checkpoints and
    (``lead``: one process of the job) writes the launch record. A run
    directory this call created is removed again if the run fails before
    writing a file. An interrupted run prints the command that resumes it."""
    run_dir = run_directory(cfg, name)
    _check_run_dir(cfg, db, run_dir, start.resume, world)
    if start.resume:
        _check_world(cfg, run_dir, world, start.reshard, lead)
    elif start.reshard:
        raise ConfigError("--reshard: only with --resume (a new run has no world size to change)")
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    if lead and not start.resume:
        C.write_launch_record(run_dir, start.config, start.overrides, world)
    # The run directory and its resume command are printed by rank 0 once
    # the run has started (rank.announce): a start that fails here removes
    # the directory, which must not have been announced. resume.sh keeps
    # the command from now on.
    try:
        summaries = body(run_dir)
    except BaseException:
        if created:
            _remove_if_empty(run_dir)
        raise
    s = summaries[0]
    if lead and s.get("interrupted"):
        done = s["start_step"] + s["steps"]
        when = (
            f"after step {done}, before the final evaluation ended"
            if done == int(s["config"]["train"]["steps"])
            else f"after step {done}"
        )
        print(
            f"interrupted by {s['interrupted']} {when}; "
            f"checkpoint saved. Resume with:\n  {C.resume_command(run_dir, world)}",
            file=sys.stderr,
            flush=True,
        )
    return summaries


def _check_run_dir(cfg: TrainConfig, db: Path, run_dir: Path, resume: bool, world: int) -> None:
    """A resume must fit the checkpoint; a new run must not reuse a run
    directory that holds checkpoints."""
    if resume:
        C.check_resume(cfg, db, run_dir)
    elif C.committed_steps(run_dir):
        raise ConfigError(
            f"{run_dir} already holds checkpoints: continue it with "
            f"`{C.resume_command(run_dir, world)}` or pick another --run-name"
        )


def _check_world(cfg: TrainConfig, run_dir: Path, world: int, reshard: bool, lead: bool) -> None:
    """A resume keeps the checkpoint's process count unless ``reshard``: then
    the lead prints what changes, records the new count and moves the
    summaries of ranks that no longer exist aside."""
    saved = C.recorded_world(run_dir)
    if saved is None or saved == world:
        return
    per_process = int(cfg.sampler_kwargs(0).get("default_batch_size", 0))
    change = (
        f"world size {saved} -> {world}: the global batch goes from {saved * per_process} to "
        f"{world * per_process} sequences per step ({per_process} per process), and the steps "
        f"after the checkpoint are no longer bit-identical to a run on {saved} process(es)"
    )
    if not reshard:
        raise ConfigError(
            f"--resume {run_dir}: the run was trained on {saved} process(es), this start has "
            f"{world}. Resume on {saved} (omit --num-processes), or add --reshard to accept "
            f"the change ({change})"
        )
    if lead:
        print(f"reshard: {change}", flush=True)
        C.record_shape(run_dir, world)
        moved = C.set_aside_stale_ranks(run_dir, world)
        if moved:
            print(
                f"reshard: moved {', '.join(moved)} (ranks that no longer exist) to "
                f"{run_dir / C.STALE_RANKS}",
                flush=True,
            )


def _resume_arguments(
    run_dir: Path, config: Config, overrides: Mapping[str, Any]
) -> tuple[Config, dict[str, Any]]:
    """The config and overrides of ``--resume run_dir``: the first start's,
    with the ones given now on top, writing into ``run_dir``."""
    saved_config, saved_overrides = C.read_launch_record(run_dir)
    merged = {
        **saved_overrides,
        **overrides,
        "logging.dir": str(run_dir.parent),
        "logging.run_name": run_dir.name,
    }
    return (saved_config if config is None else config), merged


def _run_joined(cfg: TrainConfig, run_name: str | None, start: _Start) -> dict[str, Any]:
    """This process's rank of a job it has joined (``jax.distributed`` is up).

    Process 0 picks the run name (unless one is configured) and hands it to
    the others through the job's key-value store, so every rank writes into
    one run directory. A failure exits at once (see :func:`worker_main`).
    """
    import jax

    rank, world = jax.process_index(), jax.process_count()
    try:
        W.start(rank, world, cfg.train.peer_timeout_s, joined=True)
        _check_ranks(cfg, world)
        db = resolve_database(cfg)
        cfg.check_tasks(db)
        name = run_name or cfg.logging.run_name or _agreed_run_name(rank)
        return _in_run_dir(
            cfg,
            db,
            name,
            start,
            world,
            lambda run_dir: [
                _train_here(
                    cfg, db, run_dir, rank=rank, world=world, joined=True, resume=start.resume
                )
            ],
            lead=rank == 0,
        )[0]
    except BaseException as e:
        W.on_error(e)  # a lost peer: named, and the process ends there
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _agreed_run_name(rank: int) -> str:
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("_agreed_run_name: jax.distributed is not initialised")
    key = "headwater/run_name"
    if rank == 0:
        name = default_run_name()
        client.key_value_set(key, name)
        return name
    return str(client.blocking_key_value_get(key, 600_000))


def _remove_if_empty(run_dir: Path) -> None:
    """Remove ``run_dir`` if nothing but the launch record was written under
    it (a failed start)."""
    written = [
        p
        for p in run_dir.rglob("*")
        if p.is_file() and p.name not in (C.LAUNCH_RECORD, C.RESUME_SCRIPT)
    ]
    if run_dir.is_dir() and not written:
        shutil.rmtree(run_dir, ignore_errors=True)


def _launch_many(
    config: Config,
    overrides: Mapping[str, Any],
    db: Path,
    run_dir: Path,
    world: int,
    timeout_s: float | None,
    resume: bool,
) -> list[dict[str, Any]]:
    from headwater.cluster.workers import run_workers
    from headwater.telemetry import free_port

    spec = {
        "config": config if isinstance(config, Mapping) or config is None else str(config),
        "overrides": dict(overrides),
        "db": str(db),
        "run_dir": str(run_dir),
        "world": world,
        "port": free_port(),
        "resume": resume,
    }
    run_workers(
        lambda r: [sys.executable, "-m", "headwater.train", "--worker", str(r), json.dumps(spec)],
        world,
        run_dir,
        timeout_s,
    )
    return [
        json.loads((run_dir / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(world)
    ]


def worker_main(rank: int, spec_json: str) -> int:
    """One rank of a multi-process run (``python -m headwater.train --worker``)."""
    from headwater.train.rank import train_rank

    spec = json.loads(spec_json)
    try:
        cfg = load_config(spec["config"], **spec["overrides"])
        train_rank(
            cfg,
            Path(spec["db"]),
            Path(spec["run_dir"]),
            rank=rank,
            world=spec["world"],
            port=spec["port"],
            resume=spec["resume"],
            # Installed once the rank has joined the job; the launcher
            # acknowledges signals, a rank in start-up stops at once.
            stop=StopFlag(abort_startup=True),
        )
    except KeyboardInterrupt as e:
        # A signal during start-up (Ctrl-C reaches every process of the
        # terminal's group, before or after the stop flag is installed).
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"rank {rank}: {e or 'SIGINT during start-up'}", file=sys.stderr, flush=True)
        os._exit(128 + signum)
    except BaseException as e:
        W.on_error(e)  # a lost peer: named, and the process ends there
        # Exit now: the distributed shutdown barrier would wait for the
        # ranks still training, so the launcher would see nothing for minutes.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 0
