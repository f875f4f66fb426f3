"""The data-parallel plumbing of ``headwater train``: one device per process.

Owns: :class:`Mesh` (a 1-D mesh over processes, axis ``data``; replicated and
sharded global arrays; the element-wise maximum of a few sizes over ranks;
the ``shard_map``-ped, jitted step) and :class:`Padder` (pads ``U`` and
``R`` of every batch to a high-water mark all ranks agree on, so every rank
feeds the same shapes and the step compiles a handful of times per run).

Must never: let ranks feed different shapes to the step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def digest(tree: Any) -> str:
    import jax

    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        a = leaf.addressable_data(0) if hasattr(leaf, "addressable_data") else leaf
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


def host(x: Any) -> np.ndarray:
    if hasattr(x, "addressable_data"):
        x = x.addressable_data(0)
    return np.asarray(x)


class Mesh:
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
        from headwater.telemetry import Gather

        g = Gather.get()
        got = g.finish(g.start(np.asarray(sizes, dtype=np.float64)))
        return [int(x) for x in got.reshape(self.world, -1).max(axis=0)]

    def step_fn(self, fn: Any, in_specs: Any, out_specs: Any) -> Any:
        import jax

        from headwater.telemetry import shard_map

        return jax.jit(shard_map(fn, self.mesh, in_specs=in_specs, out_specs=out_specs))


class Padder:
    """Pads ``U`` and ``R`` to a high-water mark agreed by all ranks: it only
    grows (to the next bucket), so the step compiles a handful of times per
    run instead of once per bucket combination, and every rank feeds the
    same shapes."""

    def __init__(self, mesh: Mesh, max_categories: int) -> None:
        self.mesh, self.max_categories = mesh, max_categories
        self.high = [0, 0]
        #: The largest ``flag`` any rank passed to the last call (the stop
        #: request of :mod:`.checkpoint` rides on this agreement).
        self.flag = 0

    def __call__(self, batch: Mapping[str, np.ndarray], flag: int = 0) -> dict[str, Any]:
        from headwater.train.device import bucket_size, pad_batch

        u = batch["text_batch_embeddings"].shape[0]
        r = batch["fk_adj"].shape[1]
        want = [max(h, bucket_size(x)) for h, x in zip(self.high, (u, r), strict=True)]
        *self.high, self.flag = self.mesh.agree([*want, flag])
        arrays = pad_batch(
            batch,
            text_rows=self.high[0],
            fk_rows=self.high[1],
            max_categories=self.max_categories,
        )
        return self.mesh.shard(arrays)
