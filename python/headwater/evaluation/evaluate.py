"""Evaluation passes, in the trainer and in ``headwater eval``: predictions
per task over a val/test pass, gathered across ranks, scored with
:mod:`headwater.evaluation.scoring`.

Owns: :func:`make_predict_step` (the decoder outputs at each target cell,
turned into one prediction and one label per sequence, with a mask of the
sequences to score, all gathered over the data axis with
``lax.all_gather`` inside the step), :class:`Evaluator` (walks
``sampler.eval_batches(split, max_seeds=...)``, keeps the gathered arrays
per task, scores the union), a pass's rows for W&B and ``metrics.jsonl``
(:func:`flat_row`, :func:`telemetry_row`) and its progress line
(:func:`pass_progress`).

Every rank yields the same number of pass batches per task (the sampler's
eval shard rule), so the collectives line up; after the gather every rank
holds the union of the ranks' predictions and computes identical metrics.
A sequence counts when its ``seq_valid`` is 1 (not padding) and its target
is not null. Numerical targets are scored in the column's units (the
sampler's z-scores times the column's std plus its mean, from
``metadata.json``).

Must never: score a padded sequence; draw from the training stream.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headwater.evaluation.ranking import score_links
from headwater.evaluation.scoring import STYPES, baseline, score
from headwater.preprocessing.links import read_link_table

if TYPE_CHECKING:
    from headwater.cluster.stopping import StopFlag


@functools.cache
def make_predict_step(model_cfg: Any, axis_name: str | None = None) -> Any:
    """``(params, batch, col_emb, cat_emb, aux) -> {"pred", "label", "mask",
    "seed"}``, one value per sequence (gathered over ``axis_name`` when
    given): the prediction for the batch's target type (numeric value,
    probability of true, time z-score or class index), the label in the same
    terms, 1 where the sequence is real (``aux["valid"]``) and its target is
    not null, and its seed's position in the task (``aux["seed"]``, the
    first segment's ``segment_seeds``; a link task's ranking groups by it)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from headwater.model import transformer as M

    def step(
        params: Any, batch: Any, col_emb: jax.Array, cat_emb: jax.Array, aux: Any
    ) -> dict[str, jax.Array]:
        valid = aux["valid"]
        out = M.forward(params, batch, col_emb, cat_emb, model_cfg)
        pos = M.target_positions(batch)

        def at(x: jax.Array) -> jax.Array:
            return jnp.take_along_axis(x, pos.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]

        start = M.per_target(batch, "cat_emb_start")
        preds = jnp.stack(
            [
                out["numeric"],
                jax.nn.sigmoid(out["boolean"]),
                out["timestamp"][:, -1],
                jnp.argmax(out["categorical"], axis=-1).astype(jnp.float32),
            ]
        )
        labels = jnp.stack(
            [
                at(batch["numeric_values"]).astype(jnp.float32),
                at(batch["bool_values"]).astype(jnp.float32),
                at(batch["timestamp_values"])[:, -1].astype(jnp.float32),
                (at(batch["categorical_embed_ids"]).astype(jnp.int32) - start).astype(jnp.float32),
            ]
        )
        # Each sequence's own target type (a batch may mix tasks).
        code = jnp.clip(M.per_target(batch, "target_stype"), 0, 3)
        res = {
            "pred": jnp.take_along_axis(preds, code[None], axis=0)[0],
            "label": jnp.take_along_axis(labels, code[None], axis=0)[0],
            "mask": ((valid != 0) & (at(batch["is_null"]) == 0)).astype(jnp.float32),
            "seed": aux["seed"],
        }
        if axis_name is not None:
            res = {k: lax.all_gather(v, axis_name, tiled=True) for k, v in res.items()}
        return res

    return step


#: Prediction batches kept on the device before one transfer to the host.
FETCH_EVERY = 16


def _collect(in_flight: list[tuple[str, str, Any]], got: dict[str, dict[str, Any]]) -> None:
    """The in-flight outputs to the host (one transfer), appended per task to
    ``got`` (``{"stype", "y_true", "y_pred", "seed"}`` lists), masked;
    empties the list."""
    import jax

    from headwater.cluster.mesh import host_shard

    fetched = jax.device_get([{k: host_shard(v) for k, v in o.items()} for _, _, o in in_flight])
    for (name, stype, _), out in zip(in_flight, fetched, strict=True):
        mask = np.asarray(out["mask"]) > 0
        entry = got.setdefault(name, {"stype": stype, "y_true": [], "y_pred": [], "seed": []})
        for key, src in (("y_true", "label"), ("y_pred", "pred"), ("seed", "seed")):
            entry[key].append(np.asarray(out[src])[mask])
    in_flight.clear()


class PassInterrupted(Exception):
    """A stop request (the signal number, agreed by every rank at the same
    batch) ended a validation or evaluation pass before its end."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"pass interrupted by signal {signum}")
        self.signum = signum


#: Seconds between a pass's progress lines (off a terminal).
PASS_EVERY_S = 5.0


def pass_progress(what: str, tty: bool) -> Callable[[int, int], None]:
    """A callback ``(batches done, batches in the pass)`` for a pass's
    progress: a line when it starts, then one every :data:`PASS_EVERY_S`
    seconds (every 0.5 s, rewritten in place, on a terminal: ``tty``) and
    one at its end."""
    t0 = time.perf_counter()
    last = [t0]

    def show(done: int, total: int) -> None:
        now = time.perf_counter()
        if 0 < done < total and now - last[0] < (0.5 if tty else PASS_EVERY_S):
            return
        last[0] = now
        pct = f" ({100 * done / total:.0f}%)" if total else ""
        line = f"{what}: {done}/{total} batches{pct}, {now - t0:.1f} s"
        if tty:
            print("\r" + line, end="\n" if done >= total else "", flush=True)
        else:
            print(line, flush=True)

    return show


class Evaluator:
    """Runs passes with a mesh, a padder and frozen tables (the trainer's,
    or ``headwater eval``'s)."""

    def __init__(
        self, sampler: Any, mesh: Any, padder: Any, model_cfg: Any, tables: Any,
        db_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        from jax.sharding import PartitionSpec as P

        self.sampler, self.mesh, self.pad = sampler, mesh, padder
        self.col, self.cat = tables
        self.fn = mesh.step_fn(
            make_predict_step(model_cfg, axis_name="data"),
            in_specs=(P(), P("data"), P(), P(), P("data")),
            out_specs=P(),
        )
        meta = sampler.database_metadata()
        self.tasks = {t["name"]: t for t in meta["tasks"]}
        self.columns = meta["columns"]
        # Link tasks are ranked per group with their database's sidecar; in
        # a mixture (no one database folder) they are scored as booleans.
        self.db_dir = Path(db_dir) if db_dir is not None and Path(db_dir).is_dir() else None
        self.links: dict[str, Any] = {
            n: None for n, t in self.tasks.items() if t["kind"] == "link" and self.db_dir is not None
        }

    def _units(self, task: str) -> tuple[float, float]:
        """(std, mean) that turn the task's numeric z-scores into its units."""
        t = self.tasks[task]
        stats = self.columns[int(t["target_column"])].get("stats") or {}
        if t["target_stype"] == "numerical" and stats.get("std"):
            return float(stats["std"]), float(stats.get("mean", 0.0))
        return 1.0, 0.0

    def predictions(
        self,
        params: Any,
        split: str,
        max_seeds: int | None = None,
        stop: StopFlag | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Per task: ``{"stype", "y_true", "y_pred"}`` over the union of ranks.
        ``stop``'s signal, agreed by the ranks with each batch's shapes, ends
        the pass (:class:`PassInterrupted`). ``progress(done, total)`` is
        called before the first batch and after each one."""
        pass_ = self.sampler.eval_batches(split, max_seeds=max_seeds)
        total = len(pass_)
        if progress is not None:
            progress(0, total)
        got: dict[str, dict[str, Any]] = {}
        # Outputs stay on the device for FETCH_EVERY batches, then come to the
        # host in one transfer: the next batches are dispatched while the
        # device computes, instead of one host sync per (small) batch.
        in_flight: list[tuple[str, str, Any]] = []
        for i, np_batch in enumerate(pass_):
            if progress is not None and i:
                progress(i, total)
            name = self._task_name(int(np_batch["task_idx"][0]))
            stype = STYPES.get(int(np_batch["target_stype"][0]))
            if stype is None:
                continue  # text targets have no metric
            seeds = np.asarray(np_batch["segment_seeds"])[:, 0].astype(np.int64).astype(np.int32)
            aux = self.mesh.shard({"valid": np.asarray(np_batch["seq_valid"]), "seed": seeds})
            batch = self.pad(np_batch, flag=stop.signum if stop is not None else 0)
            if self.pad.flag:
                raise PassInterrupted(self.pad.flag)
            in_flight.append((name, stype, self.fn(params, batch, self.col, self.cat, aux)))
            if len(in_flight) >= FETCH_EVERY:
                _collect(in_flight, got)
        _collect(in_flight, got)
        if progress is not None:
            progress(total, total)
        for name, e in got.items():
            std, mean = self._units(name)
            for key in ("y_true", "y_pred"):
                e[key] = np.concatenate(e[key]).astype(np.float64) * std + mean
            e["seed"] = np.concatenate(e["seed"]).astype(np.int64)
        return got

    def _task_name(self, idx: int) -> str:
        for name, t in self.tasks.items():
            if int(t["idx"]) == idx:
                return name
        raise ValueError(f"batch task_idx {idx} is not a task of the database")

    def evaluate(
        self,
        params: Any,
        split: str,
        max_seeds: int | None = None,
        stop: StopFlag | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Per task: ``{"stype", "count", "metrics", "baseline"}`` (a link
        task's: :func:`headwater.evaluation.ranking.score_links`)."""
        preds = self.predictions(params, split, max_seeds, stop, progress)
        links = {n: preds.pop(n) for n in list(preds) if n in self.links}
        out = score_predictions(preds)
        for name, e in links.items():
            out[name] = score_links(e["seed"], e["y_pred"], self._link_table(name))
        return out

    def _link_table(self, name: str) -> Any:
        if self.links[name] is None:
            assert self.db_dir is not None
            n = int(self.tasks[name]["num_seeds"])
            self.links[name] = read_link_table(self.db_dir, name, n)
        return self.links[name]


def score_predictions(preds: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`score` and :func:`baseline` of each task's gathered predictions."""
    out: dict[str, dict[str, Any]] = {}
    for name, e in preds.items():
        out[name] = {
            "stype": e["stype"],
            "count": int(np.asarray(e["y_true"]).size),
            "metrics": score(e["stype"], e["y_true"], e["y_pred"]),
            "baseline": baseline(e["stype"], e["y_true"]),
        }
    return out


def flat_row(split: str, results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """``eval/<split>/<task>/<metric>`` (and ``…/baseline/<metric>``,
    ``…/count``) for W&B and ``metrics.jsonl``."""
    row: dict[str, float] = {}
    for task, r in results.items():
        base = f"eval/{split}/{task}"
        for m, v in r["metrics"].items():
            row[f"{base}/{m}"] = float(v)
        for m, v in r["baseline"].items():
            row[f"{base}/baseline/{m}"] = float(v)
        for m, v in r.get("past_links", {}).items():
            row[f"{base}/past_links/{m}"] = float(v)
        row[f"{base}/count"] = float(r["count"])
    return row


def telemetry_row(split: str, reduced: Mapping[str, float]) -> dict[str, float]:
    """A pass's reduced sampler telemetry as ``eval/<split>/sampler/<key>``
    (the metric table's keys; histogram buckets left out: their p50/p95/max
    are kept)."""
    return {f"eval/{split}/{k}": float(v) for k, v in reduced.items() if "/bucket_" not in k}


def define_eval_metrics(run: Any, split: str, results: Mapping[str, Mapping[str, Any]]) -> None:
    """W&B summaries of each model metric: its best (max or min) and last value."""
    from headwater.evaluation.scoring import HIGHER_IS_BETTER

    for task, r in results.items():
        for m in r["metrics"]:
            best = "max" if HIGHER_IS_BETTER[m] else "min"
            run.define_metric(
                f"eval/{split}/{task}/{m}", step_metric="trainer/step", summary=f"{best},last"
            )
