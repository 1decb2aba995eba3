"""Public face of `syncedu.strategies.collectives` (AllReduce from scratch: read that module)."""

from syncedu.strategies.collectives import (
    ALGORITHMS,
    DTYPES,
    SEGMENT_BYTES,
    allreduce,
    halving_doubling_allreduce,
    hierarchical_allreduce,
    naive_allreduce,
    recursive_doubling_allreduce,
    ring_all_gather,
    ring_all_gather_chunks,
    ring_allreduce,
    ring_pipelined_allreduce,
    ring_reduce_scatter,
    ring_reduce_scatter_chunks,
    ring_segments,
    tree_allreduce,
)

__all__ = ["ALGORITHMS", "DTYPES", "SEGMENT_BYTES", "allreduce", "halving_doubling_allreduce",
           "hierarchical_allreduce", "naive_allreduce", "recursive_doubling_allreduce",
           "ring_all_gather", "ring_all_gather_chunks", "ring_allreduce",
           "ring_pipelined_allreduce", "ring_reduce_scatter", "ring_reduce_scatter_chunks",
           "ring_segments", "tree_allreduce"]
