"""AllReduce from scratch: naive, ring, tree, recursive halving-doubling.

    from syncedu import collectives
    collectives.allreduce(comm, tensor, algorithm="ring")   # sums in place

Every algorithm is written once against `Comm` (send/recv, isend/irecv), so it
runs on real ranks (`launch`) and simulated ones (`sim`) alike; works for any
world size, any length (down to one element) and float32/float16/bfloat16; and
charges its traffic to a ledger op named after it (`comm.scope`), e.g.
`res.ledger.ops["ring_allreduce"].sent`.

| name | idea | time (alpha-beta, N ranks, S bytes) |
|---|---|---|
| naive | everyone sends to rank 0, which adds and sends back | 2(N-1)(alpha + S beta) |
| ring | reduce-scatter + all-gather around a ring | 2(N-1)(alpha + S/N beta) |
| tree | binomial-tree reduce + broadcast | 2 ceil(log2 N)(alpha + S beta) |
| halving_doubling | recursive halving + doubling | 2 log2(N) alpha + 2(N-1)/N S beta |

(`syncedu.cost` has the exact formulas, including non-powers of two.) The naive
one is the oracle the others are tested against; sources: Patarasuk & Yuan
(JPDC 2009) for the ring, Thakur, Rabenseifner & Gropp (IJHPCA 2005) for the
tree and halving-doubling.

Used in: notebooks/01_collectives, 02_allreduce_algorithms.
"""

from __future__ import annotations

import torch

from .collectives_ring import (
    SEGMENT_BYTES,
    _flat,
    ring_all_gather,
    ring_allreduce,
    ring_reduce_scatter,
    ring_segments,
)
from .collectives_tree import halving_doubling_allreduce, tree_allreduce

__all__ = ["allreduce", "ALGORITHMS", "naive_allreduce", "ring_allreduce",
           "ring_reduce_scatter", "ring_all_gather", "tree_allreduce",
           "halving_doubling_allreduce", "builtin_allreduce", "ring_segments",
           "SEGMENT_BYTES", "DTYPES"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def naive_allreduce(comm, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
    """Reduce to `root` with send/recv, then send the sum back to everyone: the oracle.

    1. Every other rank sends its whole tensor to `root`.
    2. `root` adds them up in rank order (so the result is the same every run).
    3. `root` sends the sum to every other rank, which receives it in place.

    The root sends and receives (N-1) * S bytes: the bottleneck the others avoid.
    """
    flat = _flat(tensor)
    n, r = comm.world_size, comm.rank
    with comm.scope("naive_allreduce"):
        if n == 1:
            return tensor
        if r != root:
            comm.send(flat, root)  # Step 1
            comm.recv(flat, root)  # Step 3 (receiving side)
            return tensor
        tmp = torch.empty_like(flat)
        for src in range(n):  # Step 2
            if src != root:
                flat.add_(comm.recv(tmp, src))
        works = [comm.isend(flat, dst) for dst in range(n) if dst != root]  # Step 3
        for w in works:
            w.wait()
    return tensor


def builtin_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """The framework's own `all_reduce` (Gloo/NCCL, or the simulator's ring), for comparison."""
    return comm.all_reduce(tensor)


# Name -> function(comm, tensor) that sums `tensor` in place over all ranks.
ALGORITHMS = {
    "naive": naive_allreduce,
    "ring": ring_allreduce,
    "tree": tree_allreduce,
    "halving_doubling": halving_doubling_allreduce,
}


def allreduce(comm, tensor: torch.Tensor, algorithm: str = "ring", op: str = "sum"
              ) -> torch.Tensor:
    """Sum (op="sum") or average (op="avg") `tensor` over all ranks, in place.

    `algorithm` is one of `ALGORITHMS` ("naive", "ring", "tree",
    "halving_doubling"). A non-contiguous tensor is reduced through a
    contiguous copy and written back. Returns `tensor`.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is unknown; choose one of {list(ALGORITHMS)}")
    if op not in ("sum", "avg"):
        raise ValueError(f"op={op!r} is not supported; choose 'sum' or 'avg'")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    ALGORITHMS[algorithm](comm, work)
    if op == "avg":
        work.div_(comm.world_size)
    if work is not tensor:
        tensor.copy_(work)
    return tensor
