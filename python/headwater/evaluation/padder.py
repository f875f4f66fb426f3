"""The shapes every rank feeds a step: :class:`Padder` pads ``U`` (the
batch's distinct texts) and ``R`` (the most rows of a sequence) of every
batch to a high-water mark all ranks agree on, one per sequence length
``S``, so every rank feeds the same shapes and the step compiles a handful
of times per run: with ``sequence_lengths`` once per ``S`` and high-water
growth, never a short ``S`` padded to the rows of a long one. The stop
flag of :mod:`headwater.rundir.checkpoint` rides on the same agreement.

The padding itself is the model's (:func:`headwater.model.device.pad_batch`);
the agreement and the global arrays are the mesh's
(:meth:`headwater.cluster.mesh.Mesh.agree`, :meth:`~headwater.cluster.mesh.Mesh.shard`).
It lives in the evaluation room, the lowest room above both that needs
it: every pass pads its batches with one (:class:`.evaluate.Evaluator`,
``headwater eval`` without a run), and the training step is fed by
another of the run's own (:mod:`headwater.train.loop`,
:mod:`headwater.train.prefetch`).

Must never: let ranks feed different shapes to the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from headwater.cluster.mesh import Mesh
from headwater.model.device import bucket_size, pad_batch


class Padder:
    """Pads ``U`` and ``R`` to a high-water mark agreed by all ranks: it only
    grows (to the next bucket), so the step compiles a handful of times per
    run instead of once per bucket combination, and every rank feeds the
    same shapes. One mark per sequence length ``S`` (the ranks agree on a
    step's ``S``: the sampler draws it from the seed and the step), so the
    ``[B, R, R]`` adjacency of a step with many short sequences is not
    padded to the rows of the longest ``S``."""

    def __init__(self, mesh: Mesh, max_categories: int) -> None:
        self.mesh, self.max_categories = mesh, max_categories
        #: ``[U, R]`` high-water marks by ``S``.
        self.marks: dict[int, list[int]] = {}
        #: The largest ``flag`` any rank passed to the last call (the stop
        #: request of :mod:`headwater.rundir.checkpoint` rides on this agreement).
        self.flag = 0

    def __call__(
        self,
        batch: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
        flag: int = 0,
    ) -> dict[str, Any]:
        """One batch (or one per sampler stream of this process) → the global
        arrays; ``flag`` rides on the same agreement (see :attr:`flag`)."""
        batches = [batch] if isinstance(batch, Mapping) else list(batch)
        high = self.marks.setdefault(int(batches[0]["is_padding"].shape[1]), [0, 0])
        want = list(high)
        for b in batches:
            u = b["text_batch_embeddings"].shape[0]
            r = b["fk_adj"].shape[1]
            want = [max(h, bucket_size(x)) for h, x in zip(want, (u, r), strict=True)]
        *agreed, self.flag = self.mesh.agree([*want, flag])
        high[:] = agreed
        padded = [
            pad_batch(
                b,
                text_rows=high[0],
                fk_rows=high[1],
                max_categories=self.max_categories,
            )
            for b in batches
        ]
        return self.mesh.shard(padded)
