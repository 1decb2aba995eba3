"""Mutation tests: change one thing in a schedule or an assumption, and a witness must see it.

The witnesses are the counted ledger, the trace, the values and the clock.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from syncedu import Network, sim
from syncedu.comm import sim_collectives, sim_fast
from syncedu.comm.ledger import ring_chunks

NET = Network(latency=1e-6, bandwidth=1e9)


def ring_allreduce(comm, t, stride: int = 1, boundary: int = 0):
    """A from-scratch ring allreduce whose neighbour and first chunk boundary can be bent.

    `stride`: rank r sends to r + stride (1: the true ring); `boundary`: elements
    moved from chunk 1 into chunk 0.
    """
    n, r = comm.world_size, comm.rank
    right, left = (r + stride) % n, (r - stride) % n
    place = {(q * stride) % n: q for q in range(n)}[r]  # this rank's place in the ring
    sizes = ring_chunks(t.numel(), n)
    sizes[0] += boundary
    sizes[1] -= boundary
    chunks = list(t.split(sizes))
    got = torch.empty(max(sizes), dtype=t.dtype)
    for s in range(n - 1):  # reduce-scatter
        out, into = chunks[(place - 1 - s) % n], chunks[(place - 2 - s) % n]
        w = comm.isend(out, right)
        comm.recv(got[:into.numel()], left)
        w.wait()
        into.add_(got[:into.numel()])
    for s in range(n - 1):  # all-gather
        out, into = chunks[(place - s) % n], chunks[(place - 1 - s) % n]
        w = comm.isend(out, right)
        comm.recv(into, left)
        w.wait()
    return t


def _worker(comm, mutation):
    t = torch.arange(20, dtype=torch.float64) * (comm.rank + 1)
    ring_allreduce(comm, t, stride=2 if mutation == "neighbour" else 1,
                   boundary=1 if mutation == "chunk" else 0)
    return t.tolist()


def test_changing_a_rings_neighbour_shows_in_the_trace():
    n = 5
    good = sim.run(_worker, n, args=("none",), network=NET)
    bent = sim.run(_worker, n, args=("neighbour",), network=NET)
    assert good.trace.neighbours_only(n) and not bent.trace.neighbours_only(n)
    assert good.trace.pairs() != bent.trace.pairs()
    assert list(good) == list(bent)  # the values alone cannot tell (stride 2 is a ring too)


def test_changing_a_chunk_boundary_shows_in_the_counted_ledger():
    n = 4
    good = sim.run(_worker, n, args=("none",), network=NET)
    bent = sim.run(_worker, n, args=("chunk",), network=NET)
    assert good.ledger.counted.sent != bent.ledger.counted.sent
    assert sorted(good.trace.nbytes.tolist()) != sorted(bent.trace.nbytes.tolist())
    assert list(good) == list(bent)  # still the right sum


def test_changing_the_builtins_chunk_boundary_changes_values_or_ledger(monkeypatch):
    """Bend the built-in's own schedule: its messages carry other chunks."""
    monkeypatch.setattr(sim_collectives, "FAST", False)

    def worker(comm):
        t = torch.arange(8, dtype=torch.float64) + comm.rank
        comm.all_reduce(t)
        return t.tolist()

    good = sim.run(worker, 4, network=NET)
    real_layout = sim_fast.ring_layout

    def shifted(call, n):
        nbytes, steps, sizes = real_layout(call, n)
        sizes = [sizes[0] + 1, sizes[1] - 1] + sizes[2:]
        return np.array(sizes) * 8, steps, sizes

    monkeypatch.setattr(sim_fast, "ring_layout", shifted)
    bent = sim.run(worker, 4, network=NET)
    assert bent.ledger.counted.sent != good.ledger.counted.sent
    assert list(bent) == list(good)  # a different split, the same sum: only the ledger saw it

    monkeypatch.setattr(sim_collectives, "chunk_sent",
                        lambda ranks, s, n: (ranks - 1 - s) % n if s < n - 1
                        else (ranks + 1) % n)  # all-gather: always the same, unfinished chunk
    monkeypatch.setattr(sim_fast, "ring_layout", real_layout)
    wrong = sim.run(worker, 4, network=NET)
    assert list(wrong) != list(good)  # the values come from the messages


def test_changing_the_latency_model_changes_the_clock_not_the_values():
    def worker(comm):
        t = torch.ones(1000)
        comm.all_reduce(t)
        for _ in range(3):  # back-to-back sends: latency paid per message only on the port
            if comm.rank == 0:
                comm.send(torch.ones(10), 1)
            elif comm.rank == 1:
                comm.recv(torch.ones(10), 0)
        return t.tolist()

    port = sim.run(worker, 4, network=NET)
    wire = sim.run(worker, 4, network=NET.replace(latency_model="wire"))
    assert list(port) == list(wire)
    assert wire.seconds < port.seconds
    assert port.ledger.rows() == wire.ledger.rows()


def test_changing_the_eager_limit_turns_a_hang_into_an_error():
    def worker(comm):
        peer = 1 - comm.rank
        comm.send(torch.ones(1 << 15), peer)  # 128 KiB each way, both first
        comm.recv(torch.empty(1 << 15), peer)

    sim.run(worker, 2, network=NET.replace(eager_limit=math.inf))
    with pytest.raises(sim.DeadlockError):
        sim.run(worker, 2, network=NET)
