"""Lessons 01-02: AllReduce from scratch on `Comm` (`algorithms`, `ring_pipelined`) and what
it costs (`cost`, public as `syncedu.cost`). The notebook helpers need matplotlib and
ipywidgets, so they are imported by name."""

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
from syncedu.comm.runs import check_choice

__all__ = ["ALGORITHMS", "DTYPES", "SEGMENT_BYTES", "allreduce", "halving_doubling_allreduce",
           "hierarchical_allreduce", "naive_allreduce", "recursive_doubling_allreduce",
           "ring_all_gather", "ring_all_gather_chunks", "ring_allreduce",
           "ring_pipelined_allreduce", "ring_reduce_scatter", "ring_reduce_scatter_chunks",
           "ring_segments", "tree_allreduce"]

ALGORITHMS = {"naive": naive_allreduce, "ring": ring_allreduce,
              "ring_pipelined": ring_pipelined_allreduce, "tree": tree_allreduce,
              "halving_doubling": halving_doubling_allreduce,
              "recursive_doubling": recursive_doubling_allreduce,
              "hierarchical": hierarchical_allreduce}


def allreduce(comm, tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum"
              ) -> torch.Tensor:
    """Sum (op="sum") or average (op="avg") `tensor` over all ranks in place with
    `ALGORITHMS[algorithm]`; returns it. A non-contiguous tensor goes through a copy."""
    check_choice("algorithm", algorithm, list(ALGORITHMS))
    if op not in ("sum", "avg"):
        raise ValueError(f"op={op!r} is not supported; choose 'sum' or 'avg'")
    work = tensor.contiguous() if isinstance(tensor, torch.Tensor) else tensor  # else TypeError
    ALGORITHMS[algorithm](comm, work)
    if op == "avg":
        work.div_(comm.world_size)
    if work is not tensor:
        tensor.copy_(work)
    return tensor

