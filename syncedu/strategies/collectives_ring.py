"""Ring reduce-scatter, ring all-gather and ring allreduce, pipelined in segments.

The ring (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009): split the tensor into N chunks
(`ring_chunks`); rank r talks only to its neighbours r+1 (right) and r-1 (left).

1. Reduce-scatter, N-1 steps: in step s rank r sends chunk (r-1-s) mod N to the
   right and adds the chunk (r-2-s) mod N it gets from the left into its own.
   After the last step rank r owns chunk r, fully reduced (the ledger's
   convention, so our bytes equal `comm.all_reduce`'s charge exactly).
2. All-gather, N-1 steps: in step s rank r sends chunk (r-s) mod N and writes
   the chunk (r-1-s) mod N it receives in place. Written as steps N-1..2N-3 of
   one loop, step s again sends chunk (r-1-s) and receives chunk (r-2-s).

Each rank sends 2(N-1)/N * S bytes in all, whatever N: bandwidth-optimal.

Pipelining: each chunk is cut into `segments` equal pieces. Segment g of step s
leaves as soon as segment g of step s-1 has arrived and been added, so while
one segment is being added the next ones are on the wire in both directions
(isend/irecv), and the two phases flow into each other without a pause.
Receives are posted a window ahead into a few segment-sized buffers (no
chunk-sized temporaries, no copies: adds are in place, all-gather receives
land in the tensor itself).

Used in: notebooks/01_collectives, 02_allreduce_algorithms.
"""

from __future__ import annotations

import math

import torch

from syncedu.comm.ledger import ring_chunks

SEGMENT_BYTES = 4 << 20  # default pipeline segment: 4 MiB (see ring_segments)
WINDOW = 8  # receives posted ahead (and segment buffers kept) per rank


def ring_segments(numel: int, world_size: int, element_size: int,
                  segment_bytes: int | None = SEGMENT_BYTES) -> int:
    """How many segments each ring chunk is cut into (1 = no pipelining).

    The largest chunk, ceil(numel / N) elements, is cut into pieces of at most
    `segment_bytes` (None: never cut). Every rank computes the same number.
    """
    if segment_bytes is None:
        return 1
    if segment_bytes < 1:
        raise ValueError(f"segment_bytes={segment_bytes} must be >= 1 or None")
    biggest = -(-numel // world_size) * element_size
    return max(1, math.ceil(biggest / segment_bytes))


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (call .contiguous() first)")
    return (tensor.detach() if tensor.requires_grad else tensor).view(-1)


class _Ring:
    """One rank's view of a ring pass over `flat`: chunk/segment views and buffers."""

    def __init__(self, comm, flat: torch.Tensor, segment_bytes: int | None):
        self.comm, self.flat = comm, flat
        self.n, self.r = comm.world_size, comm.rank
        self.right, self.left = (self.r + 1) % self.n, (self.r - 1) % self.n
        sizes = ring_chunks(flat.numel(), self.n)
        self.starts = [sum(sizes[:k]) for k in range(self.n)]
        self.sizes = sizes
        self.g = ring_segments(flat.numel(), self.n, flat.element_size(), segment_bytes)
        self.seg_len = -(-max(sizes) // self.g)
        # Receive buffers live on the comm between calls: fresh memory each call would
        # be page-faulted and zeroed by the OS every time (a few % at 16 MiB).
        cache = comm.__dict__.setdefault("_ring_buffers", {})
        self.bufs: list[torch.Tensor] = cache.setdefault((flat.dtype, flat.device), [])

    def segment(self, k: int, g: int) -> torch.Tensor:
        """Segment g of chunk k (segments split the chunk as `ring_chunks` does)."""
        parts = ring_chunks(self.sizes[k], self.g)
        return self.flat.narrow(0, self.starts[k % self.n] + sum(parts[:g]), parts[g])

    def buffer(self, i: int, like: torch.Tensor) -> torch.Tensor:
        """Receive buffer slot i % WINDOW, allocated once, viewed at `like`'s length."""
        slot = i % WINDOW
        while len(self.bufs) <= slot:
            self.bufs.append(self.flat.new_empty(0))
        if self.bufs[slot].numel() < like.numel():
            self.bufs[slot] = self.flat.new_empty(self.seg_len)
        return self.bufs[slot][: like.numel()]


def _ring_steps(comm, flat: torch.Tensor, steps: range, segment_bytes: int | None) -> None:
    """Run ring steps `steps` (0..N-2 reduce, N-1..2N-3 gather) on `flat`, pipelined.

    Step s sends chunk (r-1-s) to the right and receives chunk (r-2-s) from the
    left: added in place during the reduce-scatter (s < N-1), written in place
    during the all-gather. Work items i = (step, segment) run in order.
    """
    ring = _Ring(comm, flat, segment_bytes)
    n, r, g_count = ring.n, ring.r, ring.g
    items = [(s, g) for s in steps for g in range(g_count)]
    posted: dict[int, tuple] = {}

    def post(i: int) -> None:  # Step A: post the receive of item i
        s, g = items[i]
        into = ring.segment((r - 2 - s) % n, g)
        buf = ring.buffer(i, into) if s < n - 1 else into
        posted[i] = (comm.irecv(buf, ring.left), buf, into, s < n - 1)

    def finish(i: int) -> None:  # Step B: wait for item i, add it in, post the next
        work, buf, into, add = posted.pop(i)
        work.wait()
        if add:
            into.add_(buf)
        if i + WINDOW < len(items):
            post(i + WINDOW)

    for i in range(min(WINDOW, len(items))):
        post(i)
    sends, done = [], 0
    for i, (s, g) in enumerate(items):
        if s > steps.start:  # Step C: segment g of this step is what step s-1 delivered
            finish(i - g_count)
            done = i - g_count + 1
        sends.append(comm.isend(ring.segment((r - 1 - s) % n, g), ring.right))
    for i in range(done, len(items)):
        finish(i)
    for work in sends:  # Step D: buffers are reusable once every send is through
        work.wait()


def ring_reduce_scatter(comm, tensor: torch.Tensor, *,
                        segment_bytes: int | None = SEGMENT_BYTES) -> torch.Tensor:
    """Ring reduce-scatter in place: afterwards chunk r of rank r's `tensor` is the sum.

    Other chunks hold partial sums. Returns the view of chunk `comm.rank`
    (`ring_chunks` split of the flattened tensor). Sends (N-1)/N * S bytes.
    """
    flat = _flat(tensor)
    n = comm.world_size
    with comm.scope("ring_reduce_scatter"):
        if n > 1:
            _ring_steps(comm, flat, range(0, n - 1), segment_bytes)
    sizes = ring_chunks(flat.numel(), n)
    return flat.narrow(0, sum(sizes[: comm.rank]), sizes[comm.rank])


def ring_all_gather(comm, tensor: torch.Tensor, *,
                    segment_bytes: int | None = SEGMENT_BYTES) -> torch.Tensor:
    """Ring all-gather in place: rank r contributes chunk r; every rank ends with all.

    Sends (N-1)/N * S bytes per rank. Returns `tensor`.
    """
    flat = _flat(tensor)
    n = comm.world_size
    with comm.scope("ring_all_gather"):
        if n > 1:
            _ring_steps(comm, flat, range(n - 1, 2 * n - 2), segment_bytes)
    return tensor


def ring_allreduce(comm, tensor: torch.Tensor, *,
                   segment_bytes: int | None = SEGMENT_BYTES) -> torch.Tensor:
    """Ring allreduce (sum) in place: reduce-scatter then all-gather, one pipeline.

    Rank r sends exactly what `comm.all_reduce` is charged: all chunks but r in
    the reduce-scatter, all but r+1 in the all-gather. Returns `tensor`.
    """
    flat = _flat(tensor)
    n = comm.world_size
    with comm.scope("ring_allreduce"):
        if n > 1:
            _ring_steps(comm, flat, range(0, 2 * n - 2), segment_bytes)
    return tensor
