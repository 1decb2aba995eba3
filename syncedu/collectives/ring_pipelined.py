"""The ring allreduce, pipelined in segments: the fast twin of `collectives.ring_allreduce`.

Same chunks, neighbours and bytes as the plain ring (Patarasuk & Yuan, JPDC 2009), which
idles the wire while it adds a whole chunk. Here each chunk is cut into G segments, and item
(s, g), segment g of ring step s (0..N-2 reduce-scatter, N-1..2N-3 all-gather), leaves once
segment g of step s-1 has arrived and been added: 2(N-1)G latencies, reduction hidden.

1. Post receives `WINDOW` items ahead, into segment buffers.
2. Walk the items in order; item (s, g) sends segment g of the chunk that item
   (s-1, g) just completed (Step 3 for that item runs first).
3. Finish an item: wait for its receive, add the buffer in (reduce-scatter) or copy
   it in once the send from that segment is done (all-gather: a send buffer may not
   change before its send completes), post the receive `WINDOW` items further on.
4. Wait for every send: the tensor is the caller's again.
"""

from __future__ import annotations

import torch

from syncedu.collectives.algorithms import flat_view

# How the pipeline cuts a chunk is the cost model's G, so both read one rule.
from syncedu.comm.alphabeta import SEGMENT_BYTES, ring_segments
from syncedu.comm.ledger import ring_chunks

WINDOW = 8  # receives posted ahead per rank (and segment buffers it allocates)


class _Pipeline:
    """One rank's pipelined ring over `flat`: segment views, buffers, pending receives."""

    def __init__(self, comm, flat: torch.Tensor, segment_bytes: int | None):
        self.comm, self.n, self.r = comm, comm.world_size, comm.rank
        self.g = ring_segments(flat.numel(), self.n, flat.element_size(), segment_bytes)
        chunks = torch.split(flat, ring_chunks(flat.numel(), self.n))
        # segments[k][g]: segment g of chunk k, split as ring_chunks splits a chunk
        self.segments = [torch.split(c, ring_chunks(c.numel(), self.g)) for c in chunks]
        self.items = [(s, g) for s in range(2 * self.n - 2) for g in range(self.g)]
        # Buffers live for one call only: simulated ranks share a process, so any cache
        # outside the call would be shared between them.
        seg_len = max(s.numel() for s in self.segments[0])
        self.buffers = [flat.new_empty(seg_len) for _ in range(min(WINDOW, len(self.items)))]
        self.pending: dict[int, tuple] = {}

    def post(self, i: int) -> None:
        """Step 1: post the receive of item i (s, g): segment g of chunk (r-2-s)."""
        s, g = self.items[i]
        into = self.segments[(self.r - 2 - s) % self.n][g]
        buf = self.buffers[i % WINDOW][: into.numel()]
        self.pending[i] = (self.comm.irecv(buf, (self.r - 1) % self.n), buf, into, s)

    def finish(self, i: int) -> None:
        """Step 3: wait for item i, add it in, and post the receive WINDOW items on."""
        work, buf, into, s = self.pending.pop(i)
        work.wait()
        if s < self.n - 1:
            into.add_(buf)
        else:  # the reduce-scatter sent this segment at item i - (n-1)G: done first
            self.sends[i - (self.n - 1) * self.g].wait()
            into.copy_(buf)
        if i + WINDOW < len(self.items):
            self.post(i + WINDOW)

    def run(self) -> None:
        n, r, g_count, right = self.n, self.r, self.g, (self.r + 1) % self.n
        for i in range(min(WINDOW, len(self.items))):  # Step 1
            self.post(i)
        sends, done = [], 0
        self.sends = sends  # finish() waits on the reduce-scatter's
        for i, (s, g) in enumerate(self.items):  # Step 2
            if s > 0:  # what (s, g) sends is what (s-1, g) received: finish that first
                self.finish(i - g_count)  # Step 3
                done = i - g_count + 1
            sends.append(self.comm.isend(self.segments[(r - 1 - s) % n][g], right))
        for i in range(done, len(self.items)):  # Step 3 for the last step's items
            self.finish(i)
        for work in sends:  # Step 4
            work.wait()


def ring_pipelined_allreduce(comm, tensor: torch.Tensor, *,
                             segment_bytes: int | None = SEGMENT_BYTES) -> torch.Tensor:
    """Ring allreduce (sum) in place, pipelined in segments of `segment_bytes`; returns
    `tensor`. Rank r sends what the plain ring sends: every chunk but r in the
    reduce-scatter, every chunk but r+1 in the all-gather."""
    flat = flat_view(tensor)
    with comm.scope("ring_pipelined_allreduce"):
        if comm.world_size > 1:
            _Pipeline(comm, flat, segment_bytes).run()
    return tensor
