"""One rank of ``headwater train``, start to end: :func:`train_rank` joins
the loopback job, opens the sampler (:func:`open_sampler`), the W&B run and
the exporter's endpoints, checks that every rank packs the same telemetry
and feeds the same shapes, hands them to a :class:`~headwater.train.loop.Trainer`
for the steps, and writes the rank's summary.

Outputs, under ``<logging.dir>/<run name>/``: ``wandb/`` (rank 0, offline by
default), ``metrics.jsonl`` (rank 0), ``rank-<r>.json`` (per-rank summary:
losses, timings, a digest of the final parameters, the evaluation
results), ``rank-<r>.log`` (ranks > 0, multi-process runs),
``checkpoints/<step>/`` (every ``train.checkpoint_every`` steps, at the end
and on SIGTERM/SIGINT; resume with ``--resume``: :mod:`headwater.rundir.checkpoint`;
``headwater eval`` scores one: :mod:`headwater.evaluation.eval_run`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headwater.cluster import watchdog as W
from headwater.cluster.mesh import digest, param_norm
from headwater.cluster.stopping import StopFlag
from headwater.errors import ConfigError
from headwater.runconfig.config import TrainConfig
from headwater.rundir import checkpoint as C
from headwater.train.endpoints import exporter_port, rank_endpoints, write_file_sd
from headwater.train.loop import Trainer
from headwater.train.summary import format_summary, summarise
from headwater.train.throughput import throughput


def announce(trainer: Trainer, db: Path, endpoints: list[str], file_sd: Path | None) -> None:
    """Rank 0's first lines, once the run has started (its sampler, exporter,
    W&B run and model are up, so the directory stays): the run directory
    and the command that resumes it, then what runs where."""
    from headwater.train.summary import describe_layout

    run_dir = trainer.run_dir
    print(
        f"run directory: {run_dir} · resume with: {C.resume_command(run_dir, trainer.world)}",
        flush=True,
    )
    if file_sd is not None:
        print(f"Prometheus file_sd targets: {file_sd}", flush=True)
    from headwater import _native

    kw, m, lg = trainer.cfg.sampler_kwargs(0), trainer.model_cfg, trainer.cfg.logging
    shapes = _native.step_shapes(kw)["train"]
    shape = f"B={shapes[0]['B']} S={shapes[0]['S']}"
    if kw.get("sequence_lengths"):
        lengths = [x["S"] for x in shapes]
        shape = f"S in {lengths} at {kw.get('tokens_per_batch')} tokens"
    print(
        f"headwater train: {db.name} · {trainer.world} process(es) · "
        f"{shape} per rank · "
        f"model d={m.d_model} layers={m.num_layers} heads={m.num_heads} · "
        f"{trainer.cfg.train.steps} steps",
        flush=True,
    )
    print(f"devices: {describe_layout(trainer.batch_layout)}", flush=True)
    if endpoints:
        print(f"metrics: {', '.join(endpoints)}", flush=True)
    if trainer.wb is not None:
        print(f"W&B run ({lg.wandb_mode}): {Path(trainer.wb.dir).parent}", flush=True)


def train_rank(
    cfg: TrainConfig,
    db: Path,
    run_dir: Path,
    *,
    rank: int = 0,
    world: int = 1,
    port: int = 0,
    joined: bool = False,
    resume: bool = False,
    stop: StopFlag | None = None,
) -> dict[str, Any]:
    """Train on this process as ``rank`` of ``world``; return its summary.

    With ``world > 1`` the process joins the loopback ``jax.distributed``
    job on ``port`` first, unless it has ``joined`` a job already (a
    cluster launcher's); it leaves the job only after a successful run: a
    failed rank exits without the shutdown barrier, see the launcher.
    ``resume``: continue from the run directory's last checkpoint. ``stop``:
    the SIGTERM/SIGINT flag (default: each signal acknowledged at once, one
    during start-up stops it, a second one stops at once); it is
    installed here, *after* joining the job: ``jax.distributed`` installs
    its own SIGTERM handler (its preemption notifier), which would swallow
    the signal.
    """
    import jax

    from headwater.telemetry import initialize_loopback

    if world > 1 and not joined:
        initialize_loopback(rank, world, port)
    W.start(rank, world, cfg.train.peer_timeout_s, joined=joined)
    stop = (
        stop or StopFlag(hard_on_second=True, announce=True, abort_startup=True)
    ).install()
    try:
        summary = _train(cfg, db, run_dir, rank, world, resume, stop)
    finally:
        stop.restore()
    if world > 1:
        W.finish()  # the peers stop watching this rank; it watches them until shutdown
        jax.distributed.shutdown()
        W.stop()
    return summary



def open_sampler(
    cfg: TrainConfig, db: Path, rank: int, world: int, port: int = 0, run_dir: Path | None = None
) -> Any:
    """The rank's sampler: ``[sampler]`` + ``[ranks.<rank>]`` + the launcher's
    keys, its exporter on ``port`` (0 = none), its stall dumps in ``run_dir``
    (unless ``sampler.stall_dump_dir`` says where); a rejected value is a
    :class:`ConfigError` naming where it was set."""
    from headwater import _native
    from headwater.mixture import open_sampler as open_mixture_sampler

    kw = cfg.sampler_kwargs(rank)
    if run_dir is not None and kw.get("stall_dump_dir") is None:
        kw["stall_dump_dir"] = str(run_dir)
    lg = cfg.logging
    if port:
        kw.update(prometheus_port=port, prometheus_host=lg.prometheus_host, local_rank=0)
    if lg.otlp_endpoint:
        kw["otlp_endpoint"] = lg.otlp_endpoint
    try:
        return open_mixture_sampler(db, rank=rank, world_size=world, **kw)
    except (ValueError, _native.ConfigError) as e:
        raise ConfigError(cfg.explain_sampler_error(e, rank)) from None



def python_stacks_on_stall(run_dir: Path, rank: int) -> Callable[[], None]:
    """Register :mod:`faulthandler` on ``SIGUSR2`` (the signal the sampler's
    stall detector sends after it dumped a stuck sampler thread,
    ``PYTHON_STACKS_SIGNAL`` in ``src/stalls/capture.rs``): every Python thread's
    stack is appended to ``python-stacks-rank<rank>.txt`` in ``run_dir``.
    Only when nothing else handles ``SIGUSR2``; a file that cannot be opened
    is reported, not fatal. Returns the undo."""
    import faulthandler
    import signal

    if signal.getsignal(signal.SIGUSR2) is not signal.SIG_DFL:
        return lambda: None
    path = run_dir / f"python-stacks-rank{rank}.txt"
    try:
        f = open(path, "a", encoding="utf-8")  # noqa: SIM115  # closed by the undo
    except OSError as e:
        print(f"headwater: warning: no Python stacks on a stall: {path}: {e}", file=sys.stderr)
        return lambda: None
    faulthandler.register(signal.SIGUSR2, file=f, all_threads=True)

    def undo() -> None:
        faulthandler.unregister(signal.SIGUSR2)
        f.close()

    return undo


def _open_wandb(cfg: TrainConfig, run_dir: Path, run_id: str | None) -> Any:
    """The W&B run; ``run_id``: resume that run (rows earlier attempts logged
    are not logged again, :class:`~headwater.rundir.checkpoint.ResumedRun`)."""
    import wandb

    lg = cfg.logging
    os.environ.setdefault("WANDB_SILENT", "true")
    logged = C.logged_steps(run_dir, run_id) if run_id else {}
    run = wandb.init(
        mode=lg.wandb_mode,  # type: ignore[arg-type]  # checked in LoggingSection
        project=lg.wandb_project,
        name=run_dir.name,
        dir=str(run_dir),
        config=cfg.to_dict(),
        id=run_id,
        resume="allow" if run_id else None,
    )
    run.define_metric("trainer/step")
    run.define_metric("trainer/*", step_metric="trainer/step")
    run.define_metric("val/*", step_metric="trainer/step")
    run.define_metric("eval/*", step_metric="trainer/step")
    return C.ResumedRun(run, logged) if run_id else run



def _train(
    cfg: TrainConfig, db: Path, run_dir: Path, rank: int, world: int, resume: bool, stop: StopFlag
) -> dict[str, Any]:
    lg = cfg.logging
    run_dir.mkdir(parents=True, exist_ok=True)
    start = C.committed_steps(run_dir)[-1] if resume else 0
    meta = C.read_meta(run_dir, start) if resume else None
    port = exporter_port(lg.prometheus_port, rank)
    sampler = open_sampler(cfg, db, rank, world, port, run_dir)
    endpoints, file_sd = _endpoints(cfg, run_dir, rank, port)
    stacks = python_stacks_on_stall(run_dir, rank)
    run = None
    if rank == 0 and lg.wandb_mode != "disabled":
        run = _open_wandb(cfg, run_dir, meta.get("wandb_run_id") if meta else None)
    W.attach(run_dir, run, start, functools.partial(C.last_committed, run_dir, world))
    try:
        with sampler:
            _check_schema(cfg, sampler, rank)
            trainer = Trainer(cfg, sampler, run_dir, rank, world, run, meta, stop, db_dir=db)
            if rank == 0:
                announce(trainer, db, endpoints, file_sd)
                if (run_dir / C.LAUNCH_RECORD).is_file():
                    _record_devices(run_dir, world, trainer.batch_layout, resume)
            wall, final_val = trainer.run_steps()
            if port and lg.prometheus_linger_s > 0:
                time.sleep(lg.prometheus_linger_s)  # the exporter is up until shutdown
    except BaseException as e:
        # A collective that failed on a lost peer: the watchdog names it and
        # ends the process (W&B still open for its record).
        W.on_error(e)
        # Keep what was logged: close the W&B run as failed (the files are
        # flushed when their objects go), then let the error through.
        if run is not None:
            run.finish(exit_code=1)
        raise
    finally:
        stacks()
    param_digest = digest(trainer.params)
    summary = summarise(
        trainer.log,
        warmup_steps=cfg.train.warmup_steps,
        world=world,
        wall=wall,
        rank=rank,
        final_val_loss=final_val,
        param_digest=param_digest,
        param_norm=param_norm(trainer.params),
        metrics_endpoints=endpoints,
        wandb_dir=str(Path(run.dir).parent) if run is not None else None,
        config=cfg.to_dict(),
        batch_layout=trainer.batch_layout,
        **trainer.verdict.summary(trainer.replayed_rate),
        telemetry_reductions={e["key"]: e["reduction"] for e in trainer.hook.schema.entries},
        start_step=trainer.start_step,
        interrupted=stop.name if trainer.stopped else None,
        interrupted_signal=stop.signum if trainer.stopped else 0,
        checkpoint=trainer.ckpt.figures(),
        eval_seconds=trainer.eval_seconds,
        prefetch=trainer.prefetch_stats,
    )
    summary["throughput"] = throughput(
        trainer.model_cfg,
        trainer.batch_layout["global_batch"],
        int(cfg.sampler_kwargs(rank).get("default_sequence_length", 0)),
        summary["batches_per_second"] / world,
        shapes=trainer.shapes,
    )
    summary.update(_shape_summary(trainer))
    if run is not None:
        run.summary.update({"trainer/param_digest": param_digest})
        if summary["throughput"]["mfu"] is not None:
            run.summary.update({"trainer/mfu": summary["throughput"]["mfu"]})
        run.finish()
    (run_dir / f"rank-{rank}.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if rank == 0:
        print(format_summary(summary, profile=cfg.train.profile), flush=True)
    return summary



def _shape_summary(trainer: Any) -> dict[str, Any]:
    """Steps trained per sequence length and the train step's compilations
    (one per S and padding high-water: docs/training.md, "Variable length")."""
    lengths = sorted({s for _, s in trainer.shapes})
    return {
        "steps_by_seq_len": {
            str(s): sum(k for (_, t), k in trainer.shapes.items() if t == s) for s in lengths
        },
        "train_step_compiles": trainer.compiles(),
    }


def _record_devices(run_dir: Path, world: int, layout: dict[str, Any], resume: bool) -> None:
    """Keep the run's devices in ``launch.json``; a resume on other devices
    says so (the batches are the same, the arithmetic may differ)."""
    from headwater.train.summary import describe_layout

    before = C.record_shape(run_dir, world, layout)
    if resume and before and before != layout:
        print(
            f"resume: other devices than the checkpoint's run: {describe_layout(before)} "
            f"before, {describe_layout(layout)} now (results are no longer bit-identical)",
            flush=True,
        )


def _endpoints(
    cfg: TrainConfig, run_dir: Path, rank: int, port: int
) -> tuple[list[str], Path | None]:
    """Every rank's ``/metrics`` URL (none without an exporter); rank 0
    writes them to the run's Prometheus ``file_sd`` targets file (returned
    too, for :func:`announce`)."""
    if not port:
        return [], None
    targets = rank_endpoints(cfg.logging.prometheus_host, port)
    sd = write_file_sd(run_dir, targets, run_dir.name) if rank == 0 else None
    return [f"http://{t}/metrics" for t in targets], sd



def _check_schema(cfg: TrainConfig, sampler: Any, rank: int) -> None:
    """Every rank must pack the same telemetry layout and feed the same
    batch shapes: compared by hash before the first collective."""
    from headwater import _native
    from headwater.cluster.job import check_same_schema, schema_hash

    kw = cfg.sampler_kwargs(rank)
    steps = _native.step_shapes(kw)
    shapes = [v for x in [steps["eval"], *steps["train"]] for v in (x["B"], x["S"])]
    describe = f"B={shapes[0]} S={shapes[1]} max_hops={kw.get('max_hops')}"
    check_same_schema(schema_hash(sampler.telemetry_schema(), shapes), describe)
