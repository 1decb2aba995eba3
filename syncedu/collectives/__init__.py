"""Lessons 01-02, collectives: AllReduce from scratch on `Comm`, and what it costs.

Open in this order: `algorithms.py` (naive, ring = reduce-scatter + all-gather, tree,
halving-doubling, recursive doubling, hierarchical: each `(comm, tensor)`, summing in
place); `ring_pipelined.py` (the segmented ring); `cost.py` (their alpha-beta times,
public as `syncedu.cost`); then the notebooks' helpers, imported by name because they
need matplotlib and ipywidgets: `lesson01.py`, `lesson02.py` (widgets), `plots.py`,
`exercises01.py`, `exercises02.py` (checkers). `ALGORITHMS` maps a name to its
function; `allreduce(comm, t, algorithm=name)` calls it.
"""

from __future__ import annotations

import torch

from syncedu.collectives.algorithms import (
    DTYPES,
    halving_doubling_allreduce,
    hierarchical_allreduce,
    naive_allreduce,
    recursive_doubling_allreduce,
    ring_all_gather,
    ring_all_gather_chunks,
    ring_allreduce,
    ring_reduce_scatter,
    ring_reduce_scatter_chunks,
    tree_allreduce,
)
from syncedu.collectives.ring_pipelined import (
    SEGMENT_BYTES,
    ring_pipelined_allreduce,
    ring_segments,
)

__all__ = ["ALGORITHMS", "DTYPES", "SEGMENT_BYTES", "allreduce", "halving_doubling_allreduce",
           "hierarchical_allreduce", "naive_allreduce", "recursive_doubling_allreduce",
           "ring_all_gather", "ring_all_gather_chunks", "ring_allreduce",
           "ring_pipelined_allreduce", "ring_reduce_scatter", "ring_reduce_scatter_chunks",
           "ring_segments", "tree_allreduce"]

# Name -> function(comm, tensor) that sums `tensor` in place over all ranks.
ALGORITHMS = {"naive": naive_allreduce, "ring": ring_allreduce,
              "ring_pipelined": ring_pipelined_allreduce, "tree": tree_allreduce,
              "halving_doubling": halving_doubling_allreduce,
              "recursive_doubling": recursive_doubling_allreduce,
              "hierarchical": hierarchical_allreduce}


def allreduce(comm, tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum"
              ) -> torch.Tensor:
    """Sum (op="sum") or average (op="avg") `tensor` over all ranks in place with
    `ALGORITHMS[algorithm]`; returns it. A non-contiguous tensor goes through a copy."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is unknown; choose one of {list(ALGORITHMS)}")
    if op not in ("sum", "avg"):
        raise ValueError(f"op={op!r} is not supported; choose 'sum' or 'avg'")
    work = tensor.contiguous() if isinstance(tensor, torch.Tensor) else tensor  # else TypeError
    ALGORITHMS[algorithm](comm, work)
    if op == "avg":
        work.div_(comm.world_size)
    if work is not tensor:
        tensor.copy_(work)
    return tensor

