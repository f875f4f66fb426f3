"""The ``headwater train`` launcher: one process, or N local processes that
join one ``jax.distributed`` job on loopback.

Owns: :func:`launch` (check the config, resolve the database once, pick the
run directory, then run rank 0 here or start ``--num-processes`` workers and
watch them by PID), :func:`resolve_database`, :func:`run_directory` and the
worker entry point (``python -m headwater.train --worker RANK SPEC``).

``launch(resume=RUN_DIR)`` continues a run from its last checkpoint: the
config and overrides of the first start (``launch.json``) with the new ones
on top, checked against the checkpoint first
(:func:`headwater.train.checkpoint.check_resume`). SIGTERM/SIGINT: the
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

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from headwater.errors import ConfigError
from headwater.train import checkpoint as C
from headwater.train.config import TrainConfig, load_config

Config = str | Path | Mapping[str, Any] | None


def resolve_database(cfg: TrainConfig) -> Path:
    """``database.path``, or the embedded default database (built once, cached)."""
    if cfg.database.path:
        p = Path(cfg.database.path).expanduser()
        if not (p / "metadata.json").is_file():
            raise ConfigError(
                f"{cfg.where('database', 'path')}: `database.path` = {cfg.database.path!r} is "
                "not a headwater database (no metadata.json); build one with "
                "`headwater preprocess`"
            )
        return p
    from headwater.data.default_db import default_database

    return Path(default_database(cfg.database.scale_factor, embedder=cfg.database.embedder))


def run_directory(cfg: TrainConfig, name: str) -> Path:
    """Where the run ``name`` of ``cfg`` writes: ``<logging.dir>/<name>``."""
    return Path(cfg.logging.dir).expanduser().resolve() / name


def default_run_name() -> str:
    return time.strftime("train-%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def launch(
    config: Config = None,
    *,
    num_processes: int = 1,
    run_name: str | None = None,
    timeout_s: float | None = None,
    resume: str | Path | None = None,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Run ``headwater train``: returns every rank's summary (rank order).

    ``num_processes > 1`` starts that many local processes (``python -m
    headwater.train --worker``) on one loopback ``jax.distributed`` job; the
    first failure stops the others. ``resume``: a run directory to continue
    (``config`` and ``overrides`` then default to its first start's). A run
    stopped by SIGTERM/SIGINT returns summaries with ``interrupted`` set.
    """
    from headwater.train.loop import train_rank

    if resume is not None:
        resume = Path(resume).expanduser().resolve()
        config, overrides = _resume_arguments(resume, config, overrides)
        run_name = resume.name
    cfg = load_config(config, **overrides)
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    bad = sorted(r for r in cfg.ranks if r >= num_processes)
    if bad:
        raise ConfigError(
            f"{cfg.where('ranks', str(bad[0]))}: [ranks.{bad[0]}] names a rank outside "
            f"0..{num_processes - 1} (--num-processes {num_processes})"
        )
    db = resolve_database(cfg)
    cfg.check_tasks(db)
    name = run_name or cfg.logging.run_name or default_run_name()
    run_dir = run_directory(cfg, name)
    _check_run_dir(cfg, db, run_dir, resume is not None, num_processes)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume is None:
        C.write_launch_record(run_dir, config, overrides)
    try:
        if num_processes == 1:
            summaries = [train_rank(cfg, db, run_dir, resume=resume is not None)]
        else:
            summaries = _launch_many(
                config, overrides, db, run_dir, num_processes, timeout_s, resume is not None
            )
    except BaseException:
        if created:
            _remove_if_empty(run_dir)
        raise
    s = summaries[0]
    if s.get("interrupted"):
        print(
            f"interrupted by {s['interrupted']} after step {s['start_step'] + s['steps']}; "
            f"checkpoint saved. Resume with:\n  {C.resume_command(run_dir, num_processes)}",
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


def _remove_if_empty(run_dir: Path) -> None:
    """Remove ``run_dir`` if nothing but the launch record was written under
    it (a failed start)."""
    written = [p for p in run_dir.rglob("*") if p.is_file() and p.name != C.LAUNCH_RECORD]
    if run_dir.is_dir() and not written:
        shutil.rmtree(run_dir, ignore_errors=True)


def _start_workers(spec: Mapping[str, Any], run_dir: Path) -> tuple[list[Any], list[IO[bytes]]]:
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    for r in range(spec["world"]):
        log = None
        if r > 0:
            log = (run_dir / f"rank-{r}.log").open("wb")
            logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "headwater.train", "--worker", str(r), json.dumps(spec)],
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                env=env,
            )
        )
    return procs, logs


def _forward_signals(procs: list[Any]) -> C.StopFlag:
    """SIGTERM/SIGINT here → SIGTERM to every worker (they checkpoint and
    stop); a second signal ends the launcher (and ``launch`` kills them)."""

    class Forward(C.StopFlag):
        def _handle(self, signum: int, frame: Any) -> None:
            super()._handle(signum, frame)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)

    return Forward(hard_on_second=True).install()


def _watch(procs: list[Any], run_dir: Path, timeout_s: float | None) -> None:
    """Wait for every worker; the first non-zero exit (or the timeout) raises."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs) or any(p.returncode for p in procs):
        failed = [(r, p) for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed:
            r, p = failed[0]
            tail = ""
            if r > 0:
                tail = (run_dir / f"rank-{r}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(
                f"rank {r} (pid {p.pid}) exited with status {p.returncode}; "
                "the other ranks were stopped" + (f"\n--- rank {r} log ---\n{tail}" if tail else "")
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"training did not finish in {timeout_s} s")
        time.sleep(0.05)


def _launch_many(
    config: Config,
    overrides: Mapping[str, Any],
    db: Path,
    run_dir: Path,
    world: int,
    timeout_s: float | None,
    resume: bool,
) -> list[dict[str, Any]]:
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
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    forward = _forward_signals(procs)
    try:
        procs[:], logs = _start_workers(spec, run_dir)
        _watch(procs, run_dir, timeout_s)
    finally:
        forward.restore()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    return [
        json.loads((run_dir / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(world)
    ]


def worker_main(rank: int, spec_json: str) -> int:
    """One rank of a multi-process run (``python -m headwater.train --worker``)."""
    from headwater.train.loop import train_rank

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
            stop=C.StopFlag(),  # installed once the rank has joined the job
        )
    except BaseException:
        # Exit now: the distributed shutdown barrier would wait for the
        # ranks still training, so the launcher would see nothing for minutes.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 0
