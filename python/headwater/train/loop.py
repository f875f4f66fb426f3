"""One rank's step loop: :class:`Trainer` holds the model, the optimiser
state and the step functions, and runs the steps, validation, evaluation
passes and checkpoints (:func:`headwater.train.rank.train_rank` builds one
per rank and writes its summary).

Data parallelism: one device per process, a 1-D mesh over processes (axis
``data``, :mod:`headwater.cluster.mesh`). Each rank samples its slice of the
one global stream (``rank`` of ``world_size``: the same task at every step,
its part of the pool's global order) and the train step runs under ``shard_map``:
gradients, loss and metrics are averaged with ``lax.pmean`` inside the step,
so every rank applies the same update to the same replicated parameters.

Per step, timed separately (``--profile`` prints the breakdown): sample
wait (blocked in ``next_train_batch``), host → device (padding, the shape
agreement, building the global arrays), compute (the jitted step, until the
loss is on the host), telemetry (drain, cross-rank reduction, sinks) and the
rest (progress, W&B logging of the trainer's own metrics).

Evaluation (:mod:`headwater.evaluation.evaluate`): every ``train.eval_every``
steps a val pass capped at ``train.eval_max_seeds`` seeds per task; at the
end (``train.eval_final``) val and test passes capped at
``train.eval_final_max_seeds`` (0: whole splits), which then stand in for
the capped pass of the last step. Passes come from
``sampler.eval_batches`` and never touch the training stream; each pass's
sampler telemetry (the split's recorders, cleared before the pass) is
reduced over ranks and logged beside its metrics as
``eval/<split>/sampler/<key>``.

Must never: let ranks apply different updates; log telemetry from ranks > 0.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from headwater.cluster import watchdog as W
from headwater.cluster.mesh import Mesh, host, host_shard
from headwater.cluster.stopping import StopFlag
from headwater.evaluation.evaluate import (
    Evaluator,
    PassInterrupted,
    define_eval_metrics,
    flat_row,
    telemetry_row,
)
from headwater.evaluation.padder import Padder
from headwater.runconfig.config import TrainConfig
from headwater.rundir import checkpoint as C
from headwater.train.build import batch_layout, model_config, open_sinks
from headwater.train.prefetch import Prefetcher, consumed_state, local_shape, useful_cells
from headwater.train.records import Progress
from headwater.train.shapes import StepShapes
from headwater.train.step_rows import Window, write_row
from headwater.train.summary import RunLog
from headwater.train.verdict import LIVE_WINDOW, VerdictTracker, replayed_rate


class Trainer:
    """The model, the optimiser state and the step loop of one rank."""

    def __init__(
        self,
        cfg: TrainConfig,
        sampler: Any,
        run_dir: Path,
        rank: int,
        world: int,
        run: Any,
        checkpoint: dict[str, Any] | None = None,
        stop: StopFlag | None = None,
        streams: int = 1,
        db_dir: Path | None = None,
    ) -> None:
        """``streams``: sampler streams this process feeds per step (the
        sampler's ``next_train_batch`` then returns that many batches); 1
        in ``headwater train``, more to replay several ranks' streams in one
        process (the cluster test's reference run). ``db_dir``: the
        database folder (its link tasks' sidecars rank their candidates)."""
        self.cfg, self.sampler, self.rank, self.world, self.wb = cfg, sampler, rank, world, run
        self.log = RunLog()
        self.model_cfg = model_config(cfg, sampler)
        col_np, cat_np = sampler.column_embeddings(), sampler.categorical_embeddings()
        self.mesh = Mesh(streams)
        #: How the global batch is formed (stated in the run summary).
        self.batch_layout = batch_layout(cfg, rank, self.mesh, streams)
        self.stop, self.stopped = stop or StopFlag(), False
        self._init_state(col_np, cat_np, run_dir, checkpoint)
        self._init_steps(db_dir)
        self.run_dir = run_dir
        self.jsonl, self.drains, self.hook = open_sinks(
            cfg,
            sampler,
            run_dir,
            rank,
            run,
            resumed_at=self.start_step if checkpoint is not None else None,
        )
        self.progress = Progress(cfg.train.steps, cfg.train.log_every, rank == 0)
        # The live window spans whole log windows: the device time of a
        # window lands in its last step (the flush).
        self.verdict = VerdictTracker(
            world, cfg.train.warmup_steps, max(LIVE_WINDOW, cfg.train.log_every)
        )
        self.verdict.read_plan_of(sampler)
        #: Steps whose metrics are still on the device; (step seconds, wait) per step.
        self._pending: list[tuple[int, Any]] = []
        self._window: list[tuple[float, float]] = []
        #: Useful (non-padding) cells of the fetched next batch, and of each
        #: step since the last flush (for useful cells per second).
        self._next_useful = 0
        self._useful: list[int] = []
        #: The fetched next batch's global ``(B, S)``, and the shapes and
        #: FLOPs of the steps trained (``sequence_lengths`` varies ``S``; the
        #: summary's tokens/s and the MFU count each step's real tokens).
        self._next_shape = (0, 0)
        self.step_shapes = StepShapes(self.model_cfg, self.mesh.devices_per_stream, self.mesh.devices)
        self.shapes = self.step_shapes.counts
        #: The next batch on the device, its sample wait and host→device seconds.
        self._next: tuple[Any, float, float] = (None, 0.0, 0.0)
        #: With ``device_prefetch``: the thread that fetches ahead, and the
        #: next batch's drain, stop flag and the stream state after it.
        self.prefetcher: Prefetcher | None = None
        self._next_meta: tuple[Any, int, dict[str, Any] | None] = (None, 0, None)
        #: The stream state after the last batch stepped on (prefetching).
        self._consumed_state: dict[str, Any] | None = None
        #: The prefetch thread's figures (:meth:`Prefetcher.stats`), once closed.
        self.prefetch_stats: dict[str, float] = {}
        #: The devices the steps run on (MFU per step).
        self._devices = (self.mesh.devices, self.mesh.mesh.devices.flat[0].device_kind)
        #: A batch fetched outside the previous step: (seconds, sample wait).
        self._lead = (0.0, 0.0)
        #: The last batch stepped on (replayed for the headspace).
        self._last: Any = None
        #: Steps/s of the train step replaying a cached batch (NaN until measured).
        self.replayed_rate = math.nan
        #: Seconds spent in validation and evaluation passes (the summary
        #: reports them apart from training).
        self.eval_seconds = 0.0

    def _init_state(
        self,
        col_np: np.ndarray,
        cat_np: np.ndarray,
        run_dir: Path,
        checkpoint: dict[str, Any] | None,
    ) -> None:
        """The frozen tables and the replicated parameters and optimiser
        state on the mesh: initialised from the seed (the same on every
        rank), then, on resume, restored from the checkpoint with the
        sampler's state."""
        from headwater.model import transformer as M
        from headwater.model.device import tables_to_device

        cfg, mesh = self.cfg, self.mesh
        self.col, self.cat = mesh.replicate(tables_to_device(col_np, cat_np))
        # Every rank initialises the same parameters from the same seed.
        local = M.init_params(cfg.train.seed, self.model_cfg, int(col_np.shape[1]))
        self.params = mesh.replicate(local)
        self.opt_state = mesh.replicate(M.init_opt_state(local, cfg.optim))
        self.ckpt = C.Checkpointer(run_dir, cfg.train.keep_checkpoints)
        self.start_step = 0
        if checkpoint is not None:  # resume: the meta of the last checkpoint
            self.start_step = int(checkpoint["step"])
            self.params, self.opt_state, _ = self.ckpt.restore(
                self.start_step, self.params, self.opt_state
            )
            self.sampler.load_state_dict(checkpoint["sampler"])
            if self.rank == 0:
                print(
                    f"resume: restored the parameters and optimiser state of checkpoint "
                    f"{self.start_step} ({self.ckpt.dir / str(self.start_step)}) and its "
                    "sampler state",
                    flush=True,
                )

    def _init_steps(self, db_dir: Path | None) -> None:
        """The jitted train and eval steps over the mesh, the learning-rate
        schedule, the batch padder and the evaluator (with its own padder:
        evaluation never changes the training batches' shapes)."""
        from jax.sharding import PartitionSpec as P

        from headwater.model import transformer as M
        from headwater.model.optim import make_schedule

        cfg, mesh, model_cfg = self.cfg, self.mesh, self.model_cfg
        self.train_fn = mesh.step_fn(
            M.make_train_step(
                model_cfg, cfg.optim, axis_name="data", grad_accum=cfg.train.grad_accum
            ),
            in_specs=(P(), P(), P("data"), P(), P()),
            out_specs=(P(), P(), P()),
        )
        self.eval_fn = mesh.step_fn(
            M.make_eval_step(model_cfg, axis_name="data"),
            in_specs=(P(), P("data"), P(), P()),
            out_specs=P(),
        )
        self.lr = make_schedule(cfg.optim)
        self.pad = Padder(mesh, model_cfg.max_categories)
        self.evaluator = Evaluator(
            self.sampler,
            mesh,
            Padder(mesh, model_cfg.max_categories),
            model_cfg,
            (self.col, self.cat),
            db_dir=db_dir,
        )

    def validate(self, step: int, final: bool = False) -> float:
        """``val_batches`` batches of the val stream: their mean loss. ``final``:
        a stop request agreed by the ranks ends it (:class:`PassInterrupted`)."""
        t0 = time.perf_counter()
        try:
            return self._validate(step, final)
        finally:
            self.eval_seconds += time.perf_counter() - t0

    def _validate(self, step: int, final: bool) -> float:
        if final:
            self.progress.message(
                f"final validation: {self.cfg.train.val_batches} batch(es) of the val stream…"
            )
        vals = []
        for _ in range(self.cfg.train.val_batches):
            vb = self.pad(self.sampler.next_val_batch(), flag=self.stop.signum if final else 0)
            if final and self.pad.flag:
                raise PassInterrupted(self.pad.flag)
            m = self.eval_fn(self.params, vb, self.col, self.cat)
            vals.append(float(host(m["loss"])))
        v = float(np.mean(vals)) if vals else math.nan
        self.log.val_losses.append((step, v))
        if self.wb is not None:
            self.wb.log({"val/loss": v, "trainer/step": step})
        if self.jsonl is not None:
            self.jsonl.write({"step": step, "val/loss": v})
        self.progress.message(f"validation at step {step + 1}: loss {v:.4f}")
        return v

    def evaluate(
        self, split: str, step: int, max_seeds: int | None = None, final: bool = False
    ) -> dict[str, Any]:
        """An evaluation pass over ``split`` (capped at ``max_seeds`` per task),
        logged as ``eval/<split>/<task>/<metric>`` beside the pass's sampler
        telemetry reduced over ranks (``eval/<split>/sampler/<key>``); the
        per-task results. ``final``: a stop request agreed by the ranks ends
        the pass unlogged (:class:`PassInterrupted`)."""
        t0 = time.perf_counter()
        try:
            return self._evaluate(split, step, max_seeds, final)
        finally:
            self.eval_seconds += time.perf_counter() - t0

    def _evaluate(
        self, split: str, step: int, max_seeds: int | None, final: bool
    ) -> dict[str, Any]:
        from headwater import telemetry as T

        # The split's recorders also hold the val stream's batches (validate);
        # cleared here so the logged telemetry is this pass's alone.
        self.sampler.drain_step_metrics(split)
        stop = self.stop if final else None
        what = f"{'final ' if final else ''}eval {split}"
        results = self.evaluator.evaluate(
            self.params, split, max_seeds, stop=stop, progress=self.progress.pass_progress(what)
        )
        local = self.sampler.drain_step_metrics_packed(split)
        sampler_row = telemetry_row(split, T.reduce(local, self.hook.schema))
        row = {**flat_row(split, results), **sampler_row}
        self.log.evals.append(
            {
                "step": step,
                "split": split,
                "full": max_seeds is None,
                "final": final,
                "max_seeds": max_seeds,
                "results": results,
                "sampler": sampler_row,
            }
        )
        if self.wb is not None:
            define_eval_metrics(self.wb, split, results)
            self.wb.log({**row, "trainer/step": step})
        if self.jsonl is not None:
            self.jsonl.write({"step": step, **row})
        shown = ", ".join(
            f"{t} {next(iter(r['metrics']))} {next(iter(r['metrics'].values())):.4f}"
            for t, r in results.items()
        )
        self.progress.message(f"eval {split} at step {step + 1}: {shown}")
        return results

    def _fetch(self) -> tuple[Any, float, float]:
        """The next batch as global device arrays: ``(batch, wait s, host→device s)``.

        Called right after the step before it is dispatched, so the wait and
        the transfer overlap that step on the device. With ``device_prefetch``
        the batch comes from the prefetch thread (:meth:`Prefetcher.take`)."""
        import jax

        if self.cfg.train.device_prefetch:
            return self._take()
        t0 = time.perf_counter()
        np_batch = self.sampler.next_train_batch()
        t1 = time.perf_counter()
        # One batch, or one per local sampler stream (a list, see ``streams``).
        self._next_useful = useful_cells(np_batch)
        self._next_shape = self.step_shapes.global_shape(local_shape(np_batch))
        batch = self.pad(np_batch, flag=self.stop.signum)
        self._next_meta = (None, self.pad.flag, None)
        if self.cfg.train.profile:
            jax.block_until_ready(batch)
        return batch, t1 - t0, time.perf_counter() - t1

    def _take(self) -> tuple[Any, float, float]:
        """:meth:`_fetch` from the prefetch thread (started on first use)."""
        if self.prefetcher is None:
            self.prefetcher = Prefetcher.for_loop(self)
        item, wait, put = self.prefetcher.take(self.pad, self.cfg.train.profile)
        self._next_useful = item.useful
        self._next_shape = self.step_shapes.global_shape(item.shape)
        # One process needs no agreement: a stop stops after this batch.
        flag = item.flag or (self.stop.signum if self.mesh.world == 1 else 0)
        self._next_meta = (item.drain, flag, item.state)
        return item.batch, wait, put

    def step(self, step: int, prefetch: bool = True) -> None:
        """One training step: dispatch it, run the telemetry hook (this
        batch's drain), fetch the next batch while the device computes
        (unless ``prefetch`` is false: before a checkpoint or a stop, so the
        saved sampler state is exactly the completed steps'), and bring the
        trainer's metrics to the host only every ``log_every`` steps (and
        before a validation, a checkpoint or the end): no device sync per step."""
        tc = self.cfg.train
        t0 = time.perf_counter()
        batch = self._next[0]
        self._last = batch
        self._useful.append(self._next_useful)
        self.step_shapes.stepped(self._next_shape)
        drain, _, self._consumed_state = self._next_meta
        self.params, self.opt_state, metrics = self.train_fn(
            self.params, self.opt_state, batch, self.col, self.cat
        )
        # The first call compiles: a start-up signal whose exception was
        # lost there ends the run here, before any step line or checkpoint.
        self.stop.recheck_startup()
        if tc.profile:  # the device's time in "compute", not in a later phase
            import jax

            jax.block_until_ready(metrics)
        t1 = time.perf_counter()
        reduced = self.hook.step(step, drain)  # this batch's drain (fetched last step)
        t2 = time.perf_counter()
        self._next = self._fetch() if prefetch else (None, 0.0, 0.0)
        t3 = time.perf_counter()
        if reduced:
            self.log.telemetry_rows += 1 if self.wb is not None else 0
            self.log.record_invariants(reduced)
        self._pending.append((step, metrics))
        # A batch fetched before this step (not overlapped with the one
        # before: see run_steps) counts towards this step's wait.
        (lead_s, lead_wait), self._lead = self._lead, (0.0, 0.0)
        nw = self._next[1] + lead_wait
        pre = time.perf_counter() - t0 + lead_s
        self._window.append((pre, nw))  # the flush adds its own time
        self.verdict.observe(reduced or {}, pre, nw)
        due_val = bool(tc.val_every) and (step + 1) % tc.val_every == 0 and step + 1 < tc.steps
        fetch_s = 0.0
        if (step + 1) % tc.log_every == 0 or not prefetch or due_val:
            fetch_s = self._flush()
        # Phases of this iteration (the wait and transfer are the next batch's).
        wall = time.perf_counter() - t0
        compute = t1 - t0 + fetch_s
        transfer = t3 - t2 - self._next[1]
        phases = (nw, transfer, compute, t2 - t1, wall - compute - (t3 - t1))
        self.log.record_phases(phases)
        self.verdict.settle(sum(phases))  # the step time the summary adds up
        if due_val:
            self.validate(step)
        # The last step's capped pass is left to the full one, if there is one.
        last = step + 1 == tc.steps
        if tc.eval_every and (step + 1) % tc.eval_every == 0 and not (last and tc.eval_final):
            self.evaluate("val", step, tc.eval_max_seeds)

    def _flush(self) -> float:
        """The pending steps' metrics to the host in one transfer, then their
        rows (W&B, ``metrics.jsonl``, progress); returns the seconds it took."""
        import jax

        t0 = time.perf_counter()
        pending, self._pending = self._pending, []
        fetched = jax.device_get([{k: host_shard(v) for k, v in m.items()} for _, m in pending])
        for (step, _), values in zip(pending, fetched, strict=True):
            loss = float(values["loss"])
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at step {step}")
            self.log.losses.append(loss)
        dt = time.perf_counter() - t0
        self.verdict.add_seconds(dt)  # the window's device time, before its rows are judged
        # Step time and wait share per row: the window's means (the device
        # wait of the whole window lands in this flush).
        window, self._window = self._window, []
        useful, self._useful = self._useful, []
        self.step_shapes.flush()
        useful_per_batch = sum(useful) / max(len(useful), 1)
        total = sum(w for w, _ in window) + dt
        wait_share = sum(x for _, x in window) / total if total > 0 else 0.0
        step_s = total / max(len(window), 1)
        # The progress line shows the window's mean loss (these steps only:
        # nothing carried over from before a restart).
        mean_loss = float(np.mean([float(v["loss"]) for v in fetched])) if fetched else 0.0
        w = Window(step_s, wait_share, useful_per_batch, mean_loss, len(fetched))
        for (step, _), values in zip(pending, fetched, strict=True):
            write_row(self, step, {k: float(v) for k, v in values.items()}, w)
        return dt

    def compiles(self) -> int:
        """Compilations of the train step so far (its jit cache: one per
        distinct batch shape fed, i.e. per ``S`` and padding high-water)."""
        return int(self.train_fn._cache_size())

    def replay_rate(self, steps: int = 8) -> float:
        """:func:`.verdict.replayed_rate` of the last batch stepped on."""
        if self._last is None:
            return math.nan
        args = (self.params, self.opt_state, self._last, self.col, self.cat)
        return replayed_rate(self.train_fn, args, steps)

    def stream_state(self) -> dict[str, Any]:
        """The sampler state after the batches stepped on (not after those
        the prefetch thread holds)."""
        live = self.sampler.state_dict()
        if self._consumed_state is None:  # no prefetch thread: nothing fetched ahead
            return live
        return consumed_state(live, self._consumed_state)

    def save(self, done: int, final_phase: str | None = None) -> None:
        """Checkpoint after ``done`` steps (asynchronous: see
        :mod:`headwater.rundir.checkpoint`); ``final_phase="pending"`` marks
        the last one, taken before the final validation and evaluation (see
        :func:`headwater.rundir.checkpoint.check_resume`)."""
        meta = {
            "format": "headwater-train-checkpoint",
            "version": 1,
            "step": done,
            "sampler": self.stream_state(),
            "wandb_run_id": self.wb.id if self.wb is not None else None,
            "config": self.cfg.to_dict(),
            "model_max_categories": self.model_cfg.max_categories,
            "world": self.world,
            # No trainer RNG besides the init seed: the stream's RNGs are in
            # the sampler state.
            "rng": {"param_init_seed": self.cfg.train.seed},
            **({"final_phase": final_phase} if final_phase else {}),
        }
        self.ckpt.save(done, self.params, self.opt_state, meta)

    def final_phase(self) -> float:
        """The final validation and evaluation passes: the val loss (NaN
        without val batches or when a stop ended them).

        The trained model is checkpointed before them, since they change
        nothing it holds: a stop during them (agreed by the ranks at the same
        batch) loses no training, and ``--resume`` reruns them alone from the
        same sampler state (the same batches, the same figures)."""
        tc = self.cfg.train
        if self.start_step < tc.steps:
            self.save(tc.steps, final_phase="pending")
        final_val = math.nan
        self.stop.final_phase = True
        try:
            if tc.val_batches:
                final_val = self.validate(tc.steps - 1, final=True)
            if tc.eval_final:
                cap = tc.eval_final_max_seeds or None
                for split in ("val", "test"):
                    self.evaluate(split, tc.steps - 1, cap, final=True)
        except PassInterrupted:
            self.stopped = True
            self.progress.message(
                f"stopping during the final evaluation: {self.stop.name} "
                f"(checkpoint {tc.steps} holds the trained model)"
            )
            return final_val  # NaN unless the final validation had ended
        if self.rank == 0:
            C.mark_final_phase_done(self.run_dir, tc.steps)
        return final_val

    def close_prefetch(self) -> None:
        """Stop the prefetch thread (its queued batches are dropped)."""
        if self.prefetcher is not None:
            self.prefetch_stats = self.prefetcher.stats()
            self.prefetcher.close()
            self.prefetcher = None

    def run_steps(self) -> tuple[float, float]:
        """:meth:`_run_steps`, the prefetch thread stopped however it ends."""
        try:
            return self._run_steps()
        finally:
            self.close_prefetch()

    def _run_steps(self) -> tuple[float, float]:
        """Every step (from the checkpoint's, on resume), checkpoints, then
        the final validation: ``(wall seconds, val loss)``. A stop request
        agreed by the ranks ends the loop after the current step, with a
        checkpoint and no final validation."""
        t_start = time.perf_counter()
        tc = self.cfg.train
        final_val = math.nan
        if self.start_step < tc.steps:
            self.progress.message(
                "start-up: compiling the train step (the first step waits for it)…"
                if self.start_step == 0
                else f"start-up: compiling the train step; resuming at step {self.start_step + 1}…"
            )
        for step in range(self.start_step, tc.steps):
            W.at_step(step)  # named if a peer is lost during it
            done = step + 1
            if self._next[0] is None:  # the first step, or the first after a checkpoint
                t = time.perf_counter()
                self._next = self._fetch()
                self._lead = (time.perf_counter() - t, self._next[1])
            # The ranks agreed on the stop request with this batch's shapes.
            stopping = bool(self._next_meta[1])
            due_save = bool(tc.checkpoint_every) and done % tc.checkpoint_every == 0
            if step == self.start_step:
                self.stop.recheck_startup()
            self.step(step, prefetch=not (stopping or due_save or done == tc.steps))
            if step == self.start_step:
                self.stop.recheck_startup()  # one lost after the dispatch: no save
                # From here a signal waits for the current step (and its
                # checkpoint); before, it ends the start-up at once.
                self.stop.training = True
                self.progress.message(
                    f"start-up: train step compiled and dispatched in "
                    f"{time.perf_counter() - t_start:.1f} s; training"
                )
            if stopping:
                self.stopped = True
                self.progress.message(f"stopping after step {done}: {self.stop.name}")
                # After the last step, the final phase is still to run.
                self.save(done, final_phase="pending" if done == tc.steps else None)
                break
            if due_save and done < tc.steps:
                self.save(done)
        self.stop.training = True  # a resume with only the final phase left
        self.close_prefetch()
        if not self.stopped:
            self.replayed_rate = self.replay_rate()
            final_val = self.final_phase()
        self.hook.close()
        if self.drains is not None:
            self.drains.close()
        self.ckpt.close()
        return time.perf_counter() - t_start, final_val
