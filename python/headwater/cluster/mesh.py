"""The data-parallel plumbing of ``headwater train``: every device of every
process on one data axis.

Owns: :class:`Mesh` (a 1-D mesh over all global devices in process order,
axis ``data``; replicated and sharded global arrays; the split of a
process's batch over its local devices; the element-wise maximum of a few
sizes over ranks; the ``shard_map``-ped, jitted step), the parameter
digest and norm that compare ranks and runs, and the host copy of a
global array. What the ranks agree on (a step's padded shapes, the stop
flag) is the caller's; :meth:`Mesh.agree` only takes the maximum.

A process with ``L`` local devices splits its batch of ``B`` sequences into
``L`` slices of ``B / L`` (tensors whose shape rule starts with ``B``); the
batch-level tensors (``text_batch_embeddings [U, D]`` and the ``[1]``
scalars) go whole to every local device, so the indices of each slice stay
valid. The global batch is ``B / L`` per device times every device.

Must never: put a process's slices on another process's devices, or
split a batch-level tensor.
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


def param_norm(tree: Any) -> float:
    """The global L2 norm of the parameters (float64): compares runs whose
    all-reduce order differs (bit-identical digests need the same order)."""
    import jax

    return float(
        np.sqrt(
            sum(
                float(np.sum(host(x).astype(np.float64) ** 2))
                for x in jax.tree_util.tree_leaves(tree)
            )
        )
    )


def host_shard(x: Any) -> Any:
    """A replicated global array's local copy (still on the device)."""
    return x.addressable_data(0) if hasattr(x, "addressable_data") else x


def host(x: Any) -> np.ndarray:
    if hasattr(x, "addressable_data"):
        x = x.addressable_data(0)
    return np.asarray(x)


class Mesh:
    """The data-parallel plumbing: mesh, shardings, global arrays, shape agreement."""

    def __init__(self, streams: int = 1) -> None:
        import jax
        from jax.sharding import Mesh as JaxMesh
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        from headwater import _native

        self.world = jax.process_count()
        self.local_devices = jax.local_device_count()
        self.devices = jax.device_count()
        self.platform = jax.default_backend()
        if streams < 1 or self.local_devices % streams:
            raise ValueError(
                f"{streams} sampler streams do not split over {self.local_devices} local devices"
            )
        #: Batches this process feeds per step, each over ``devices_per_stream`` devices.
        self.streams, self.devices_per_stream = streams, self.local_devices // streams
        order = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        self.mesh = JaxMesh(np.array(order), ("data",))
        #: Tensors split over local devices (shape rule starts with ``B``).
        self.per_sequence = frozenset(
            t["name"] for t in _native.batch_tensors() if t["shape"][0] == "B"
        )
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P("data"))

    def replicate(self, tree: Any) -> Any:
        import jax

        return jax.tree_util.tree_map(
            lambda x: jax.make_array_from_process_local_data(self.replicated, np.asarray(x)),
            tree,
        )

    def local_layout(self, batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """This process's share of the global batch, one slice per local
        device along axis 0: each of the ``streams`` batches over its
        ``devices_per_stream`` devices, ``B`` split, batch-level tensors
        repeated."""
        if len(batches) != self.streams:
            raise ValueError(f"expected {self.streams} batches per step, got {len(batches)}")
        n = self.devices_per_stream
        if len(batches) == 1 and n == 1:
            return dict(batches[0])
        out = {}
        for k in batches[0]:
            parts = []
            for b in batches:
                v = b[k]
                if k not in self.per_sequence:
                    parts.extend([v] * n)
                elif v.shape[0] % n:
                    raise ValueError(
                        f"the batch of {v.shape[0]} sequences ({k}) does not split over "
                        f"{n} devices: make sampler.default_batch_size a multiple of {n}"
                    )
                else:
                    parts.append(v)
            out[k] = np.concatenate(parts, axis=0)
        return out

    def shard(
        self, batches: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]]
    ) -> dict[str, Any]:
        """One batch (or one per sampler stream) → the global arrays."""
        import jax

        if isinstance(batches, Mapping):
            batches = [batches]

        # One call for the whole batch: on one process it is one batched
        # device_put instead of one per field.
        return dict(jax.make_array_from_process_local_data(self.sharded, self.local_layout(batches)))

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
