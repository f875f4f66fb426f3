"""``headwater train``: the relational transformer fed by the sampler, on one
or many processes, with the telemetry hook every step.

Owns: the launcher (:func:`launch`: resolve the database once, then run rank
0 in this process or start ``--num-processes`` local processes that join one
``jax.distributed`` job on loopback and watch them by PID), the per-rank
training loop (:func:`train_rank`), the progress line, the profile and the
end-of-run summary.

Data parallelism: one device per process, a 1-D mesh over processes (axis
``data``). Each rank samples its own shard (``rank`` of ``world_size``) and
the train step runs under ``shard_map``: gradients, loss and metrics are
averaged with ``lax.pmean`` inside the step, so every rank applies the same
update to the same replicated parameters. Batch shapes must agree across
ranks: ``U`` (distinct texts) and ``R`` (rows per sequence) vary per batch,
so the ranks agree on the bucketed maximum with one small host all-gather
per step (none on one process).

Per step, timed separately (``--profile`` prints the breakdown): sample
wait (blocked in ``next_train_batch``), host → device (padding, the shape
agreement, building the global arrays), compute (the jitted step, until the
loss is on the host), telemetry (drain, cross-rank reduction, sinks) and the
rest (progress, W&B logging of the trainer's own metrics).

Outputs, under ``<logging.dir>/<run name>/``: ``wandb/`` (rank 0, offline by
default), ``rank-<r>.json`` (per-rank summary: losses, timings, a digest of
the final parameters), ``rank-<r>.log`` (ranks > 0, multi-process runs).

Must never: let ranks apply different updates; hide a failed rank (the
launcher stops the others and reports it); log telemetry from ranks > 0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headwater.errors import ConfigError
from headwater.train_config import TrainConfig, load_config

#: Timed phases of a step, in order.
PHASES = ("sample_wait", "host_to_device", "compute", "telemetry", "other")
INVARIANTS = ("sampler/invariants/duplicate_seeds", "sampler/invariants/temporal_leaks")


# ---------------------------------------------------------------------------
# Database and run directory
# ---------------------------------------------------------------------------


def resolve_database(cfg: TrainConfig) -> Path:
    """``database.path``, or the embedded default database (built once, cached)."""
    if cfg.database.path:
        p = Path(cfg.database.path).expanduser()
        if not (p / "metadata.json").is_file():
            raise ConfigError(
                f"{cfg.source}: `database.path` = {cfg.database.path!r} is not a headwater "
                "database (no metadata.json); build one with `headwater preprocess`"
            )
        return p
    from headwater.default_db import default_database

    return Path(default_database(cfg.database.scale_factor, embedder=cfg.database.embedder))


def run_directory(cfg: TrainConfig, name: str) -> Path:
    """Where the run ``name`` of ``cfg`` writes: ``<logging.dir>/<name>``."""
    return Path(cfg.logging.dir).expanduser().resolve() / name


def default_run_name() -> str:
    return time.strftime("train-%Y%m%d-%H%M%S") + f"-{os.getpid()}"


# ---------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------


class _Progress:
    """Rank 0's progress: a self-rewriting line on a terminal, else a line
    every ``log_every`` steps."""

    def __init__(self, total: int, log_every: int, enabled: bool) -> None:
        self.total, self.log_every, self.enabled = total, log_every, enabled
        self.tty = enabled and sys.stdout.isatty()
        self.ema: float | None = None

    def update(self, step: int, loss: float, bps: float, wait_share: float) -> None:
        if not self.enabled:
            return
        self.ema = loss if self.ema is None else 0.9 * self.ema + 0.1 * loss
        line = (
            f"step {step + 1:>5}/{self.total}  loss {self.ema:8.4f}  "
            f"{bps:7.2f} batches/s  data wait {100 * wait_share:5.2f}%"
        )
        if self.tty:
            print("\r" + line, end="", flush=True)
            if step + 1 == self.total:
                print()
        elif (step + 1) % self.log_every == 0 or step == 0 or step + 1 == self.total:
            print(line, flush=True)

    def message(self, text: str) -> None:
        if self.enabled:
            print(("\n" if self.tty else "") + text, flush=True)


def _scalars(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` without histogram bucket counts (the JSONL files' rows)."""
    return {k: v for k, v in metrics.items() if "/bucket_" not in k}


class _JsonlSink:
    """A telemetry sink writing ``{"step": t, **reduced scalars}`` per line."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("w", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.write({"step": step, **_scalars(metrics)})

    def write(self, row: Mapping[str, Any]) -> None:
        self.file.write(json.dumps(row, allow_nan=True) + "\n")

    def close(self) -> None:
        self.file.close()


class _DrainRecorder:
    """Forwards a sampler, writing every packed drain of the hook as a JSONL row."""

    def __init__(self, sampler: Any, path: Path) -> None:
        self.sampler = sampler
        self.keys = tuple(sampler.telemetry_keys())
        self.file = path.open("w", encoding="utf-8")
        self.step = 0

    def drain_step_metrics_packed(self, split: str = "train") -> Any:
        v = self.sampler.drain_step_metrics_packed(split)
        row = _scalars(dict(zip(self.keys, v.tolist()))) if len(v) else {}
        self.file.write(json.dumps({"step": self.step, **row}) + "\n")
        self.step += 1
        return v

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

    def close(self) -> None:
        self.file.close()


def _digest(tree: Any) -> str:
    import jax

    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        a = leaf.addressable_data(0) if hasattr(leaf, "addressable_data") else leaf
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


def _host(x: Any) -> np.ndarray:
    if hasattr(x, "addressable_data"):
        x = x.addressable_data(0)
    return np.asarray(x)


class _Mesh:
    """The data-parallel plumbing: mesh, shardings, global arrays, shape agreement."""

    def __init__(self) -> None:
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from headwater.telemetry import process_mesh

        self.world = jax.process_count()
        self.mesh = process_mesh("data")
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P("data"))

    def replicate(self, tree: Any) -> Any:
        import jax

        return jax.tree_util.tree_map(
            lambda x: jax.make_array_from_process_local_data(self.replicated, np.asarray(x)),
            tree,
        )

    def shard(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        import jax

        return {
            k: jax.make_array_from_process_local_data(self.sharded, v) for k, v in arrays.items()
        }

    def agree(self, sizes: Sequence[int]) -> list[int]:
        """The element-wise maximum of ``sizes`` over ranks (one host collective)."""
        if self.world == 1:
            return list(sizes)
        from headwater.telemetry import _Gather

        g = _Gather.get()
        got = g.finish(g.start(np.asarray(sizes, dtype=np.float64)))
        return [int(x) for x in got.reshape(self.world, -1).max(axis=0)]

    def step_fn(self, fn: Any, in_specs: Any, out_specs: Any) -> Any:
        import jax

        from headwater.telemetry import _shard_map

        return jax.jit(_shard_map(fn, self.mesh, in_specs=in_specs, out_specs=out_specs))


class _Padder:
    """Pads ``U`` and ``R`` to a high-water mark agreed by all ranks: it only
    grows (to the next bucket), so the step compiles a handful of times per
    run instead of once per bucket combination, and every rank feeds the
    same shapes."""

    def __init__(self, mesh: _Mesh, max_categories: int) -> None:
        self.mesh, self.max_categories = mesh, max_categories
        self.high = [0, 0]

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        from headwater.model import bucket_size, pad_batch

        u = batch["text_batch_embeddings"].shape[0]
        r = batch["fk_adj"].shape[1]
        want = [max(h, bucket_size(x)) for h, x in zip(self.high, (u, r))]
        self.high = self.mesh.agree(want)
        arrays = pad_batch(
            batch,
            text_rows=self.high[0],
            fk_rows=self.high[1],
            max_categories=self.max_categories,
        )
        return self.mesh.shard(arrays)


def train_rank(
    cfg: TrainConfig,
    db: Path,
    run_dir: Path,
    *,
    rank: int = 0,
    world: int = 1,
    port: int = 0,
) -> dict[str, Any]:
    """Train on this process as ``rank`` of ``world``; return its summary.

    With ``world > 1`` the process joins the loopback ``jax.distributed``
    job on ``port`` first.
    """
    import jax

    from headwater import telemetry as T

    if world > 1:
        T.initialize_loopback(rank, world, port)
    try:
        return _train(cfg, db, run_dir, rank, world)
    finally:
        if world > 1:
            jax.distributed.shutdown()


def _train(cfg: TrainConfig, db: Path, run_dir: Path, rank: int, world: int) -> dict[str, Any]:
    import jax
    from jax.sharding import PartitionSpec as P

    from headwater import _native
    from headwater import model as M
    from headwater import telemetry as T
    from headwater.optim import make_schedule

    tc, lg = cfg.train, cfg.logging
    lead = rank == 0
    run_dir.mkdir(parents=True, exist_ok=True)
    sampler_kw = cfg.sampler_kwargs(rank)
    names: list[str] = []
    if isinstance(sampler_kw.get("task_weights"), Mapping):
        names = [t["name"] for t in json.loads((db / "metadata.json").read_text())["tasks"]]
        weights = dict(sampler_kw["task_weights"])
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ConfigError(
                f"{cfg.source}: `sampler.task_weights`: unknown task(s) {unknown} "
                f"(the database has {names})"
            )
        sampler_kw["task_weights"] = [float(weights.get(n, 1.0)) for n in names]
    if lg.prometheus_port:
        sampler_kw.update(
            prometheus_port=lg.prometheus_port, prometheus_host=lg.prometheus_host, local_rank=rank
        )
    if lg.otlp_endpoint:
        sampler_kw["otlp_endpoint"] = lg.otlp_endpoint
    try:
        sampler = _native.Sampler(str(db), rank=rank, world_size=world, **sampler_kw)
    except (ValueError, _native.ConfigError) as e:
        raise ConfigError(f"{cfg.source}: [sampler] {e}") from None

    progress = _Progress(tc.steps, tc.log_every, lead)
    endpoints = []
    if lg.prometheus_port:
        endpoints = [
            f"http://{lg.prometheus_host}:{lg.prometheus_port + r}/metrics" for r in range(world)
        ]

    run: Any = None
    sinks: list[Any] = []
    if lead and lg.wandb_mode != "disabled":
        import wandb

        from headwater.telemetry import WandbSink

        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(
            mode=lg.wandb_mode,  # type: ignore[arg-type]  # checked in LoggingSection
            project=lg.wandb_project,
            name=run_dir.name,
            dir=str(run_dir),
            config=cfg.to_dict(),
        )
        run.define_metric("trainer/step")
        run.define_metric("trainer/*", step_metric="trainer/step")
        run.define_metric("val/*", step_metric="trainer/step")
        sinks.append(WandbSink(run))

    try:
        with sampler:
            meta = sampler.database_metadata()
            model_cfg = cfg.model
            if cfg.auto_categories:
                model_cfg = dataclasses.replace(model_cfg, max_categories=M.max_categories(meta))
            col_np, cat_np = sampler.column_embeddings(), sampler.categorical_embeddings()
            embed_dim = int(col_np.shape[1])

            mesh = _Mesh()
            col, cat = mesh.replicate(M.tables_to_device(col_np, cat_np))
            # Every rank initialises the same parameters from the same seed.
            local_params = M.init_params(tc.seed, model_cfg, embed_dim)
            params = mesh.replicate(local_params)
            opt_state = mesh.replicate(M.init_opt_state(local_params, cfg.optim))
            del local_params
            train_fn = mesh.step_fn(
                M.make_train_step(model_cfg, cfg.optim, axis_name="data"),
                in_specs=(P(), P(), P("data"), P(), P()),
                out_specs=(P(), P(), P()),
            )
            eval_fn = mesh.step_fn(
                M.make_eval_step(model_cfg, axis_name="data"),
                in_specs=(P(), P("data"), P(), P()),
                out_specs=P(),
            )
            lr = make_schedule(cfg.optim)
            pad = _Padder(mesh, model_cfg.max_categories)
            jsonl = _JsonlSink(run_dir / "metrics.jsonl") if lead and lg.jsonl else None
            drains = (
                _DrainRecorder(sampler, run_dir / f"drains-rank{rank}.jsonl")
                if lg.record_drains
                else None
            )
            hook = T.StepHook(
                drains or sampler,
                sinks=[*sinks, *([jsonl] if jsonl else [])],
                buffered=tc.buffered_telemetry,
            )

            if lead:
                print(
                    f"headwater train: {db.name} · {world} process(es) · B={sampler_kw.get('default_batch_size')} "
                    f"S={sampler_kw.get('default_sequence_length')} per rank · model d={model_cfg.d_model} "
                    f"layers={model_cfg.num_layers} heads={model_cfg.num_heads} · {tc.steps} steps",
                    flush=True,
                )
                if endpoints:
                    print(f"metrics: {', '.join(endpoints)}", flush=True)
                if run is not None:
                    print(f"W&B run ({lg.wandb_mode}): {Path(run.dir).parent}", flush=True)

            times = {p: [] for p in PHASES}  # type: dict[str, list[float]]
            losses: list[float] = []
            val_losses: list[tuple[int, float]] = []
            telemetry_rows = 0
            invariants = dict.fromkeys(INVARIANTS, 0.0)
            culprits: dict[str, set[int]] = {k: set() for k in INVARIANTS}

            def validate(step: int) -> float:
                vals = []
                for _ in range(tc.val_batches):
                    vb = pad(sampler.next_val_batch())
                    m = eval_fn(params, vb, col, cat)
                    vals.append(float(_host(m["loss"])))
                v = float(np.mean(vals)) if vals else math.nan
                val_losses.append((step, v))
                if run is not None:
                    run.log({"val/loss": v, "trainer/step": step})
                if jsonl is not None:
                    jsonl.write({"step": step, "val/loss": v})
                progress.message(f"validation at step {step + 1}: loss {v:.4f}")
                return v

            t_start = time.perf_counter()
            for step in range(tc.steps):
                t0 = time.perf_counter()
                np_batch = sampler.next_train_batch()
                t1 = time.perf_counter()
                batch = pad(np_batch)
                if tc.profile:
                    jax.block_until_ready(batch)
                t2 = time.perf_counter()
                params, opt_state, metrics = train_fn(params, opt_state, batch, col, cat)
                host_metrics = {k: float(_host(v)) for k, v in metrics.items()}
                t3 = time.perf_counter()
                reduced = hook.step(step)
                t4 = time.perf_counter()
                if reduced:
                    telemetry_rows += 1 if run is not None else 0
                    for k in INVARIANTS:
                        if reduced.get(k, 0.0) > 0:
                            invariants[k] += reduced[k]
                            culprits[k].add(int(reduced.get(f"{k}_argmax_rank", 0)))
                loss = host_metrics["loss"]
                losses.append(loss)
                if not math.isfinite(loss):
                    raise FloatingPointError(f"loss is {loss} at step {step}")
                step_s = t4 - t0
                wait_share = (t1 - t0) / step_s if step_s > 0 else 0.0
                row = {
                    **{f"trainer/{k}": v for k, v in host_metrics.items()},
                    "trainer/lr": float(lr(step)),
                    "trainer/step_seconds": step_s,
                    "trainer/batches_per_second": world / step_s if step_s > 0 else 0.0,
                    "trainer/data_wait_share": wait_share,
                    "trainer/step": step,
                }
                if run is not None:
                    run.log(row)
                if jsonl is not None:
                    jsonl.write({"step": step, **row})
                progress.update(step, loss, world / step_s if step_s > 0 else 0.0, wait_share)
                if tc.val_every and (step + 1) % tc.val_every == 0 and step + 1 < tc.steps:
                    validate(step)
                t5 = time.perf_counter()
                for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                    times[name].append(dt)
            final_val = validate(tc.steps - 1) if tc.val_batches else math.nan
            hook.close()
            if drains is not None:
                drains.close()
            wall = time.perf_counter() - t_start
            digest = _digest(params)
            if lg.prometheus_port and lg.prometheus_linger_s > 0:
                time.sleep(lg.prometheus_linger_s)  # the exporter is up until shutdown
    except BaseException:
        # Keep what was logged: close the W&B run as failed (the files are
        # flushed when their objects go), then let the error through.
        if run is not None:
            run.finish(exit_code=1)
        raise

    summary = _summary(
        cfg,
        rank,
        world,
        losses,
        val_losses,
        times,
        wall,
        digest,
        invariants,
        culprits,
        telemetry_rows,
        endpoints,
        str(Path(run.dir).parent) if run is not None else None,
        final_val,
    )
    summary["telemetry_reductions"] = {e["key"]: e["reduction"] for e in hook.schema.entries}
    if run is not None:
        run.summary.update({"trainer/param_digest": digest})
        run.finish()
    (run_dir / f"rank-{rank}.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if lead:
        print(format_summary(summary, profile=tc.profile), flush=True)
    return summary


def _summary(
    cfg: TrainConfig,
    rank: int,
    world: int,
    losses: list[float],
    val_losses: list[tuple[int, float]],
    times: Mapping[str, list[float]],
    wall: float,
    digest: str,
    invariants: Mapping[str, float],
    culprits: Mapping[str, set[int]],
    telemetry_rows: int,
    endpoints: list[str],
    wandb_dir: str | None,
    final_val: float,
) -> dict[str, Any]:
    warm = min(cfg.train.warmup_steps, max(0, len(losses) - 1))
    steady = {p: v[warm:] for p, v in times.items()}
    step_times = [sum(x) for x in zip(*steady.values())]
    total = sum(step_times)
    k = max(1, min(10, len(losses) // 5))
    warnings = [
        f"{key.removeprefix('sampler/')} = {int(v)} (ranks {sorted(culprits[key])}): "
        + (
            "a seed was drawn twice in one epoch"
            if "duplicate" in key
            else "rows dated after the observation time reached the model"
        )
        for key, v in invariants.items()
        if v > 0
    ]
    wait_share = sum(steady["sample_wait"]) / total if total > 0 else 0.0
    if wait_share > 0.05:
        warnings.append(
            f"data wait is {100 * wait_share:.1f}% of step time (> 5%): the sampler does not keep "
            "up; raise num_threads / num_prefetch"
        )
    return {
        "rank": rank,
        "world": world,
        "steps": len(losses),
        "losses": losses,
        "loss_start": float(np.mean(losses[:k])),
        "loss_end": float(np.mean(losses[-k:])),
        "val_losses": val_losses,
        "final_val_loss": final_val,
        "wall_seconds": wall,
        "steady_steps": len(step_times),
        "step_seconds_median": statistics.median(step_times) if step_times else math.nan,
        "batches_per_second": world * len(step_times) / total if total > 0 else math.nan,
        "data_wait_share": wait_share,
        "phase_seconds_mean": {p: float(np.mean(v)) if v else 0.0 for p, v in steady.items()},
        "phase_share": {p: sum(v) / total if total > 0 else 0.0 for p, v in steady.items()},
        "param_digest": digest,
        "invariants": dict(invariants),
        "telemetry_rows_logged": telemetry_rows,
        "warnings": warnings,
        "metrics_endpoints": endpoints,
        "wandb_dir": wandb_dir,
        "config": cfg.to_dict(),
    }


def format_summary(s: Mapping[str, Any], profile: bool = False) -> str:
    lines = [
        f"done: {s['steps']} steps in {s['wall_seconds']:.1f} s on {s['world']} process(es)",
        (
            f"  loss {s['loss_start']:.4f} -> {s['loss_end']:.4f} (mean of first/last steps); "
            f"val loss {s['final_val_loss']:.4f}"
        ),
        (
            f"  {s['batches_per_second']:.2f} batches/s, "
            f"median step {1e3 * s['step_seconds_median']:.1f} ms, "
            f"data wait {100 * s['data_wait_share']:.2f}% of step time"
        ),
    ]
    if profile:
        lines.append(
            f"  step breakdown (rank {s['rank']}, mean over {s['steady_steps']} steps "
            "after warm-up):"
        )
        for p in PHASES:
            lines.append(
                f"    {p:<15} {1e3 * s['phase_seconds_mean'][p]:9.3f} ms  "
                f"{100 * s['phase_share'][p]:6.2f}%"
            )
    health = "sampler health: ok (invariant counters all 0)"
    if s["warnings"]:
        health = "sampler health: WARNING\n" + "\n".join(f"  warning: {w}" for w in s["warnings"])
    lines.append(health)
    if s["wandb_dir"]:
        lines.append(f"W&B run: {s['wandb_dir']}")
    if s["metrics_endpoints"]:
        lines.append(f"metrics were served at: {', '.join(s['metrics_endpoints'])}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------


def launch(
    config: str | Path | Mapping[str, Any] | None = None,
    *,
    num_processes: int = 1,
    run_name: str | None = None,
    timeout_s: float | None = None,
    **overrides: Any,
) -> list[dict[str, Any]]:
    """Run ``headwater train``: returns every rank's summary (rank order).

    ``num_processes > 1`` starts that many local processes (``python -m
    headwater.train --worker``) on one loopback ``jax.distributed`` job; the
    first failure stops the others.
    """
    cfg = load_config(config, **overrides)
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {num_processes}")
    bad = sorted(r for r in cfg.ranks if r >= num_processes)
    if bad:
        raise ConfigError(
            f"{cfg.source}: [ranks.{bad[0]}] names a rank outside 0..{num_processes - 1} "
            f"(--num-processes {num_processes})"
        )
    db = resolve_database(cfg)
    name = run_name or cfg.logging.run_name or default_run_name()
    run_dir = run_directory(cfg, name)
    run_dir.mkdir(parents=True, exist_ok=True)
    if num_processes == 1:
        return [train_rank(cfg, db, run_dir)]
    return _launch_many(config, overrides, db, run_dir, num_processes, timeout_s)


def _launch_many(
    config: str | Path | Mapping[str, Any] | None,
    overrides: Mapping[str, Any],
    db: Path,
    run_dir: Path,
    world: int,
    timeout_s: float | None,
) -> list[dict[str, Any]]:
    from headwater.telemetry import _free_port

    spec = {
        "config": config if isinstance(config, Mapping) or config is None else str(config),
        "overrides": dict(overrides),
        "db": str(db),
        "run_dir": str(run_dir),
        "world": world,
        "port": _free_port(),
    }
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for r in range(world):
            log = None if r == 0 else open(run_dir / f"rank-{r}.log", "wb")  # noqa: SIM115
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "headwater.train", "--worker", str(r), json.dumps(spec)],
                    stdout=log,
                    stderr=subprocess.STDOUT if log else None,
                    env=env,
                )
            )
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [(r, p) for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                r, p = failed[0]
                tail = ""
                if r > 0:
                    tail = (run_dir / f"rank-{r}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(
                    f"rank {r} (pid {p.pid}) exited with status {p.returncode}; "
                    f"the other ranks were stopped"
                    + (f"\n--- rank {r} log ---\n{tail}" if tail else "")
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"training did not finish in {timeout_s} s")
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            if log is not None:
                log.close()
    return [
        json.loads((run_dir / f"rank-{r}.json").read_text(encoding="utf-8")) for r in range(world)
    ]


def _worker_main(rank: int, spec_json: str) -> int:
    spec = json.loads(spec_json)
    cfg = load_config(spec["config"], **spec["overrides"])
    train_rank(
        cfg,
        Path(spec["db"]),
        Path(spec["run_dir"]),
        rank=rank,
        world=spec["world"],
        port=spec["port"],
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(int(sys.argv[2]), sys.argv[3]))
    print("usage: headwater train [CONFIG.toml] [--steps N] [--num-processes N]", file=sys.stderr)
    sys.exit(2)
