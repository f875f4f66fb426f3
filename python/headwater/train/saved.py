"""The final parameters of a run, saved for ``headwater eval``.

Owns the run directory's ``params.npz`` (one array per parameter leaf, keyed
by its path in the parameter tree, ``enc/emb_proj`` style, float32 as
trained) and ``model.json`` (the :class:`~headwater.train.model.ModelConfig`
the parameters belong to, ``max_categories`` resolved), written by rank 0 at
the end of a run with ``train.eval_final``.

This is a stand-in until training checkpoints exist (orbax, the resume
work): it holds parameters only, no optimiser state or step, and the
checkpoint module is meant to replace it (``headwater eval`` then loads the
latest checkpoint through the same two functions).

Must never: write a partial file under the final name (written to a
temporary name, then renamed).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

PARAMS_FILE = "params.npz"
MODEL_FILE = "model.json"


def _key(path: tuple[Any, ...]) -> str:
    parts = []
    for p in path:
        parts.append(str(getattr(p, "key", getattr(p, "idx", p))))
    return "/".join(parts)


def save_params(
    run_dir: Path, params: Any, model_cfg: Any, *, db: Path, sampler: dict[str, Any]
) -> Path:
    """Write ``params.npz`` and ``model.json`` (the model config, the database
    and rank 0's sampler keys) under ``run_dir``; the params path."""
    import jax

    from headwater.train.mesh import host

    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    arrays = {_key(path): host(leaf) for path, leaf in flat}
    run_dir = Path(run_dir)
    tmp = run_dir / (PARAMS_FILE + ".tmp.npz")
    np.savez(tmp, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, run_dir / PARAMS_FILE)
    doc = {"model": dataclasses.asdict(model_cfg), "db": str(db), "sampler": sampler}
    (run_dir / MODEL_FILE).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return run_dir / PARAMS_FILE


def load_run(run_dir: Path) -> dict[str, Any]:
    """``model.json`` of ``run_dir``: ``{"model", "db", "sampler"}``."""
    path = Path(run_dir) / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: {run_dir} is not a run saved with train.eval_final = true"
        )
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def load_params(run_dir: Path, embed_dim: int) -> tuple[Any, Any]:
    """``(params, model_cfg)`` saved in ``run_dir`` (the tree rebuilt from a
    fresh init of the saved config, every leaf replaced by the saved one)."""
    import jax

    from headwater.train import model as M

    run_dir = Path(run_dir)
    ppath, mpath = run_dir / PARAMS_FILE, run_dir / MODEL_FILE
    for p in (ppath, mpath):
        if not p.is_file():
            raise FileNotFoundError(
                f"{p} does not exist: {run_dir} is not a run saved with train.eval_final = true"
            )
    raw = load_run(run_dir)["model"]
    fields = {f.name for f in dataclasses.fields(M.ModelConfig)}
    kw = {k: v for k, v in raw.items() if k in fields}
    if "attention" in kw:
        kw["attention"] = tuple(kw["attention"])
    cfg = M.ModelConfig(**kw)
    template = M.init_params(0, cfg, embed_dim)
    with np.load(ppath) as saved:
        flat, tree = jax.tree_util.tree_flatten_with_path(template)
        leaves = []
        for path, leaf in flat:
            k = _key(path)
            if k not in saved or saved[k].shape != np.shape(leaf):
                raise ValueError(f"{ppath}: parameter {k!r} is missing or has the wrong shape")
            leaves.append(saved[k])
    return jax.tree_util.tree_unflatten(tree, leaves), cfg
