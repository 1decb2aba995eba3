"""The ring's fast path: the same messages as sim_collectives.py's, a step at a time.

A ring on N ranks is 2(N-1) (or N-1) steps of one chunk per rank: two million
messages per all-reduce at 1024 ranks. This does each step for all ranks at
once, bit for bit as the message-by-message path (tests/comm/test_counted.py):

1. values (`ring_values`): chunk k reduced in the ring's order, rank k+1 to rank k
   (IEEE addition commutes: "mine + yours" is "yours + mine");
2. clocks (`ring_clock`): on a flat, noiseless network with free receive ports;
3. ledger and trace (`ring_counts`, `ring_clock`'s arrays), from `chunk_sent`.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import REDUCE_FNS
from .ledger import ring_chunks


def chunk_sent(ranks: np.ndarray, s: int, n: int) -> np.ndarray:
    """Step s of the ring (0..n-2 reduce-scatter, n-1.. all-gather): chunk rank r sends."""
    return (ranks - 1 - s) % n if s < n - 1 else (ranks - (s - n + 1)) % n


def combine(acc: torch.Tensor, data: torch.Tensor, op: str) -> None:
    """acc = acc (op) data, in place and in acc's dtype."""
    REDUCE_FNS[op](acc, data, out=acc)


def ring_values(rows: torch.Tensor, op: str, sizes: list[int]) -> torch.Tensor:
    """Step 1: reduce rows (one per rank) as the ring does: chunk k from rank k+1 on, k last;
    with chunks padded as X[rank, chunk, :], pass j combines X[(k + j) mod N, k] into k."""
    n, length = rows.shape
    width = max(sizes)
    if length == 0:
        return rows[0].clone()
    k = torch.arange(n)
    if length == n * width:  # equal chunks: a view
        x = rows.view(n, n, width)
        pos = None
    else:  # chunk c's i-th element sits at c * width + i
        chunk_of = torch.repeat_interleave(k, torch.tensor(sizes))
        starts = torch.tensor([0] + sizes[:-1]).cumsum(0)
        pos = chunk_of * width + (torch.arange(length) - starts[chunk_of])
        padded = rows.new_zeros(n, n * width)
        padded[:, pos] = rows
        x = padded.view(n, n, width)
    cells = x.reshape(n * n, width)  # row (rank * N + chunk)

    def part(j: int) -> torch.Tensor:  # chunk k of rank (k + j) mod N, for every k
        return torch.index_select(cells, 0, ((k + j) % n) * n + k)

    acc = part(1)
    for j in range(2, n + 1):
        combine(acc, part(j), op)
    flat = acc.reshape(-1)
    return flat if pos is None else flat[pos]


def ring_counts(nbytes: np.ndarray, steps: list[int], n: int):
    """Step 3: (sent, received, messages) per rank over `steps` (every rank: one per step)."""
    ranks = np.arange(n)
    sent = np.zeros(n, dtype=np.int64)
    for s in steps:
        sent += nbytes[chunk_sent(ranks, s, n)]
    return sent, np.roll(sent, 1), len(steps)


def ring_clock(wires, nbytes: np.ndarray, steps: list[int]):
    """Step 2: (departures, arrivals, chunks) of the ring's steps, shape (steps, N), column
    r the message rank r got from r - 1; None if this does not apply."""
    net, clocks, n = wires.net, wires.clocks, len(wires.clocks)
    if wires.cluster or not net.deterministic:
        return None
    xfer = nbytes / net.bandwidth
    shift = net.latency if wires.wire else 0.0  # latency after the port ("wire") or in it
    hold = xfer if wires.wire else net.latency + xfer  # per chunk: how long a port is held
    if (hold <= 0).any() and not (hold <= 0).all():
        return None
    now = np.array([c.now for c in clocks])
    free = np.array([c.send_free for c in clocks])
    ranks = np.arange(n)
    prev = (ranks - 1) % n  # x[prev][r] is x[r - 1]: what rank r receives from
    first_in = np.maximum(now, free)[prev] + shift  # step 0's message into each port
    if any(c.port.busy_until() > t for c, t in zip(clocks, first_in.tolist())):
        return None
    deps, ends = np.empty((len(steps), n)), np.empty((len(steps), n))
    chunks = np.empty((len(steps), n), dtype=np.int64)
    for i, s in enumerate(steps):
        sent = chunk_sent(ranks, s, n)
        d = hold[sent]
        start = np.maximum(now, free)
        free = start + d
        dep = start[prev]
        arrival = (dep + shift) + d[prev]  # from r - 1, its port being free
        now = np.maximum(np.maximum(now, arrival), free)
        deps[i], ends[i], chunks[i] = dep, arrival, sent[prev]
    for c, t, f in zip(clocks, now.tolist(), free.tolist()):
        c.now, c.send_free = t, f
    if hold[0] > 0:
        _book(clocks, deps + shift, ends)
    return deps, ends, chunks


def _book(clocks, starts: np.ndarray, ends: np.ndarray) -> None:
    """Book each rank's receive port with its column of intervals, merging touching ones."""
    breaks = starts[1:] != ends[:-1]
    for r, c in enumerate(clocks):
        cut = np.flatnonzero(breaks[:, r]).tolist()
        lo = 0
        for i in cut + [len(starts) - 1]:
            c.port.append(float(starts[lo, r]), float(ends[i, r]))
            lo = i + 1


def ring_layout(call, n: int) -> tuple[np.ndarray, list[int], list[int]]:
    """(bytes of chunk k, the steps it runs, elements of chunk k) of a ring collective."""
    if call.kind == "all_reduce":
        sizes = ring_chunks(call.tensor.numel(), n)
        es = call.tensor.element_size()
        return np.array(sizes, dtype=np.int64) * es, list(range(2 * (n - 1))), sizes
    part = call.tensor if call.kind == "reduce_scatter" else call.parts[0]
    sizes = [part.numel()] * n
    nbytes = np.full(n, part.numel() * part.element_size(), dtype=np.int64)
    steps = list(range(n - 1)) if call.kind == "reduce_scatter" else list(range(n - 1, 2 * n - 2))
    return nbytes, steps, sizes
