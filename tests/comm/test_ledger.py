"""Exact byte counts of the ledger on real ranks (the simulator's are in test_sim.py)."""

from __future__ import annotations

import pytest
import torch

from syncedu import launch
from syncedu.comm.ledger import Ledger, RankLedger, ring_allreduce_elements, ring_chunks


def test_ring_chunks_split_evenly():
    assert ring_chunks(10, 4) == [3, 3, 2, 2]
    assert ring_chunks(1, 3) == [1, 0, 0]
    assert sum(ring_chunks(1001, 7)) == 1001


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_allreduce_sends_2_n_minus_1_over_n_when_n_divides(n):
    numel = 12 * n
    for r in range(n):
        assert ring_allreduce_elements(numel, n, r) == (2 * (n - 1) * numel // n,) * 2


def test_ring_bytes_balance_for_odd_sizes():
    for n in (2, 3, 5, 7):
        for numel in (1, 2, 7, 1001):
            pairs = [ring_allreduce_elements(numel, n, r) for r in range(n)]
            assert sum(s for s, _ in pairs) == sum(rc for _, rc in pairs)


def test_merged_ledger_lists_and_table():
    a, b = RankLedger(0), RankLedger(1)
    a.record("send", sent=40, msgs_sent=1)
    b.record("recv", received=40, msgs_received=1)
    led = Ledger([a, b])
    assert led.sent == [40, 0] and led.received == [0, 40]
    assert led.ops["send"].sent == [40, 0] and led.ops["recv"].received == [0, 40]
    assert "total" in led.table() and sum(led.sent) == 40


def _traffic(comm):
    n, r = comm.world_size, comm.rank
    comm.all_reduce(torch.zeros(1000))  # 4000 bytes
    comm.broadcast(torch.zeros(10, dtype=torch.float64), src=0)
    comm.all_gather([torch.zeros(5) for _ in range(n)], torch.zeros(5))
    comm.reduce_scatter(torch.zeros(6), [torch.zeros(6) for _ in range(n)])
    if r == 0:
        comm.send(torch.zeros(7, dtype=torch.int16), dst=n - 1)
    if r == n - 1:
        comm.recv(torch.zeros(7, dtype=torch.int16), src=0)
    with comm.scope("mine"):
        if r == 0:
            comm.send(torch.zeros(3), dst=1)
        if r == 1:
            comm.recv(torch.zeros(3), src=0)
    return r


@pytest.mark.real
def test_ledger_bytes_are_exact_on_real_ranks():
    n = 4
    led = launch.run(_traffic, n).ledger
    assert led.ops["all_reduce"].sent == [2 * (n - 1) * 4000 // n] * n
    assert led.ops["all_reduce"].msgs_sent == [2 * (n - 1)] * n
    assert led.ops["broadcast"].sent == [80, 80, 80, 0]  # a chain 0 -> 1 -> 2 -> 3
    assert led.ops["broadcast"].received == [0, 80, 80, 80]
    assert led.ops["all_gather"].sent == [(n - 1) * 20] * n
    assert led.ops["reduce_scatter"].received == [(n - 1) * 24] * n
    assert led.ops["send"].sent == [14, 0, 0, 0]
    assert led.ops["recv"].received == [0, 0, 0, 14]
    assert led.ops["mine"].sent == [12, 0, 0, 0] and led.ops["mine"].received == [0, 12, 0, 0]
    assert led.sent == [sum(op.sent[r] for op in led.ops.values()) for r in range(n)]
