"""`res.trace`: one record per message, column-wise; checkers' helpers; the diagram."""

from __future__ import annotations

import pickle

import pytest
import torch

from syncedu import Network, collectives, sim
from syncedu.comm.trace import FIELDS, Record, Trace

NET = Network(latency=1e-6, bandwidth=1e9)


def _algo(name):
    def worker(comm, numel):
        t = torch.full((numel,), float(comm.rank))
        getattr(collectives, name)(comm, t)
        return t.tolist()
    return worker


def test_records_read_by_name_and_columns_are_arrays():
    def worker(comm):
        x = torch.ones(3)
        if comm.rank == 0:
            comm.send(x, 1, tag=7)
        else:
            comm.recv(x, 0, tag=7)

    res = sim.run(worker, 2, network=NET)
    (rec,) = list(res.trace)
    assert isinstance(rec, Record) and rec._fields == FIELDS
    assert (rec.src, rec.dst, rec.nbytes, rec.tag, rec.op, rec.chunk) == (0, 1, 12, 7, "send", -1)
    assert rec.start == 0.0 and rec.end == pytest.approx(1e-6 + 12 / 1e9)
    assert res.trace.nbytes.tolist() == [12] and res.trace[0] == rec
    assert list(pickle.loads(pickle.dumps(res.trace))) == [rec]


def test_ring_talks_only_to_neighbours_and_naive_has_a_root():
    n = 5
    ring = sim.run(_algo("ring_allreduce"), n, args=(10,), network=NET).trace
    assert len(ring) == n * 2 * (n - 1) and ring.neighbours_only(n)
    assert set(ring.op.tolist()) == {"ring_allreduce"}
    assert ring.busiest_receiver()[1] == 1
    naive = sim.run(_algo("naive_allreduce"), n, args=(10,), network=NET).trace
    assert not naive.neighbours_only(n)
    assert naive.busiest_receiver() == (0, n - 1)  # everybody reports to rank 0
    assert naive.pairs()[(1, 0)] == 1 and naive.pairs()[(0, 1)] == 1


def test_builtin_all_reduce_is_traced_as_a_ring_with_chunks():
    n = 4

    def worker(comm):
        comm.all_reduce(torch.ones(8))

    tr = sim.run(worker, n, network=NET).trace
    assert len(tr) == 2 * (n - 1) * n and tr.neighbours_only(n)
    assert ((tr.dst - tr.src) % n == 1).all()  # always to the right
    first_step = tr.only(dst=1).chunk.tolist()
    assert first_step == [3, 2, 1, 0, 3, 2]  # chunk (r - 1 - s) from rank 0, then all-gather


def test_reduce_scatter_precedes_all_gather():
    def worker(comm):
        out = torch.zeros(2)
        comm.reduce_scatter(out, [torch.ones(2) for _ in range(comm.world_size)])
        parts = [torch.zeros(2) for _ in range(comm.world_size)]
        comm.all_gather(parts, out)

    tr = sim.run(worker, 4, network=NET).trace
    assert set(tr.op.tolist()) == {"reduce_scatter", "all_gather"}
    assert tr.only(op="reduce_scatter").end.max() <= tr.only(op="all_gather").start.min()
    assert len(tr.only(op="reduce_scatter")) == len(tr.only(op="all_gather")) == 12


def test_closed_form_answer_sends_nothing():
    def worker(comm):
        return float(sum(range(comm.world_size)))  # the right value, no communication

    assert len(sim.run(worker, 4).trace) == 0


def test_merge_and_blocks():
    t = Trace()
    t.add(0, 1, 4, 0, "send", 0.0, 1.0)
    t.add_block([1, 2], [2, 0], [8, 8], -1, "all_reduce", [1.0, 1.0], [2.0, 2.0], [0, 1])
    u = Trace()
    u.extend(t)
    u.add(2, 1, 1, 5, "send", 3.0, 4.0)
    assert len(u) == 4 and u.op.tolist() == ["send", "all_reduce", "all_reduce", "send"]
    assert u.only(op="send", src=2)[0].tag == 5
    with pytest.raises(AttributeError, match="columns are"):
        _ = u.colour


@pytest.mark.parametrize("name", ["ring_allreduce", "tree_allreduce",
                                  "halving_doubling_allreduce"])
def test_draw_trace(name):
    import matplotlib.pyplot as plt

    from syncedu.ui.trace import draw_trace

    res = sim.run(_algo(name), 4, args=(8,), network=NET)
    ax = draw_trace(res.trace, title=name)
    assert len(ax.texts) == len(res.trace)  # one arrow per message
    assert ax.get_title() == name
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="max_messages"):
        draw_trace(res.trace, max_messages=0)


def test_a_full_trace_says_so():
    t = Trace(limit=3)
    t.add(0, 1, 4, 0, "send", 0.0, 1.0)
    t.add_block([1, 2, 3], [2, 3, 0], [8] * 3, -1, "all_reduce", [1.0] * 3, [2.0] * 3, [0] * 3)
    t.add(2, 1, 1, 5, "send", 3.0, 4.0)
    assert len(t) == 3 and t.dropped == 2 and not t.complete
    assert "2 more dropped" in repr(t)
    u = pickle.loads(pickle.dumps(t))
    assert len(u) == 3 and u.dropped == 2
    assert Trace().complete and sim.run(lambda comm: None, 2).trace.complete
    with pytest.raises(ValueError, match="limit"):
        Trace(limit=-1)
