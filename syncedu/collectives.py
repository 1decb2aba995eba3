"""Public face of `syncedu.strategies.collectives`: AllReduce from scratch (see that module)."""

from syncedu.strategies.collectives import *  # noqa: F401,F403
from syncedu.strategies.collectives import (  # noqa: F401
    ALGORITHMS,
    DTYPES,
    SEGMENT_BYTES,
    allreduce,
    builtin_allreduce,
    halving_doubling_allreduce,
    naive_allreduce,
    ring_all_gather,
    ring_allreduce,
    ring_reduce_scatter,
    ring_segments,
    tree_allreduce,
)
