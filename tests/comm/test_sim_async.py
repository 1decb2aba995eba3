"""Simulated ranks: asynchronous built-ins in logical time, and the two schedulers."""

from __future__ import annotations

import math
import time

import pytest
import torch

from syncedu import Network, sim
from syncedu.comm import DeadlockError, WorkerError
from syncedu.comm.alphabeta import collective_time
from syncedu.comm.errors import TimeoutError as RunTimeoutError

NET = Network(latency=1e-3, bandwidth=1e6)


def _step(comm, async_op, compute):
    t = torch.ones(1000)
    work = comm.all_reduce(t, async_op=async_op)
    if async_op:
        comm.compute(compute)  # runs while the allreduce is in flight
        work.wait()
    else:
        comm.compute(compute)
    return t[0].item(), comm.now()


@pytest.mark.parametrize("compute", [0.001, 0.05])
def test_compute_runs_while_an_async_allreduce_is_in_flight(compute):
    comm_time = collective_time("all_reduce", 4000, 4, NET)  # 6 (1 ms + 1 ms)
    blocking = sim.run(_step, 4, args=(False, compute), network=NET)
    overlapped = sim.run(_step, 4, args=(True, compute), network=NET)
    assert all(v == 4.0 for v, _ in overlapped)
    assert math.isclose(blocking.seconds, comm_time + compute, rel_tol=1e-12)
    assert math.isclose(overlapped.seconds, max(comm_time, compute), rel_tol=1e-12)
    assert blocking.ledger.rows() == overlapped.ledger.rows()


def test_async_handles_wait_once_and_avg_divides_after_the_wait():
    def worker(comm):
        t = torch.full((4,), float(comm.rank))
        work = comm.all_reduce(t, op="avg", async_op=True)
        work.wait()
        work.wait()
        return t.tolist()

    assert sim.run(worker, 3)[2] == [1.0] * 4


def test_several_collectives_in_flight_complete_in_order():
    def worker(comm):
        ts = [torch.full((100,), float(i + comm.rank)) for i in range(3)]
        works = [comm.all_reduce(t, async_op=True) for t in ts]
        for w in reversed(works):
            w.wait()
        return [t[0].item() for t in ts], comm.now()

    res = sim.run(worker, 4, network=NET)
    assert res[0][0] == [6.0, 10.0, 14.0]
    one = collective_time("all_reduce", 400, 4, NET)
    assert math.isclose(res.seconds, 3 * one, rel_tol=1e-12)  # they share the ports: in a row


# -------------------------------------------------------------- schedulers
def _mixed(comm):
    t = torch.full((10,), float(comm.rank))
    comm.all_reduce(t)
    peer = (comm.rank + 1) % comm.world_size
    work = comm.irecv(torch.empty(3), (comm.rank - 1) % comm.world_size)
    comm.send(torch.ones(3), peer)
    work.wait()
    print("done", comm.rank)
    comm.barrier()
    return t.sum().item(), comm.now()


def test_threads_and_greenlets_give_the_same_values_ledger_time_and_prints(capsys):
    runs = []
    for scheduler in ("thread", "greenlet"):
        runs.append(sim.run(_mixed, 6, network=NET, scheduler=scheduler, output="live"))
        runs[-1] = (runs[-1], capsys.readouterr().out)
    (a, out_a), (b, out_b) = runs
    assert list(a) == list(b) and a.seconds == b.seconds
    assert a.ledger.rows() == b.ledger.rows()
    assert out_a == out_b and "[rank 5] done 5" in out_a


def test_greenlet_ranks_keep_their_own_grad_mode():
    def worker(comm):
        if comm.rank == 0:
            with torch.no_grad():
                comm.barrier()  # rank 1 runs while rank 0 is inside no_grad
                return torch.is_grad_enabled()
        comm.barrier()
        x = torch.ones(2, requires_grad=True)
        return (x * 2).requires_grad

    assert list(sim.run(worker, 2, scheduler="greenlet")) == [False, True]


def test_greenlet_ranks_cannot_wait_inside_backward_and_say_so():
    class Sync(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, comm):
            ctx.comm = comm
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            ctx.comm.all_reduce(g := g.clone())
            return g, None

    def worker(comm):
        x = torch.ones(3, requires_grad=True)
        Sync.apply(x, comm).sum().backward()
        return x.grad.tolist()

    assert list(sim.run(worker, 3, scheduler="thread")) == [[3.0] * 3] * 3
    with pytest.raises(WorkerError, match="scheduler='thread'"):
        sim.run(worker, 3, scheduler="greenlet")


def test_greenlet_deadlocks_and_timeouts():
    def stuck(comm):
        comm.recv(torch.zeros(2), 1 - comm.rank)

    with pytest.raises(DeadlockError) as info:
        sim.run(stuck, 2, scheduler="greenlet")
    assert info.value.ranks == [0, 1]

    def spin(comm):
        if comm.rank == 0:
            while True:
                time.sleep(0.01)

    start = time.monotonic()
    with pytest.raises(RunTimeoutError) as info:
        sim.run(spin, 2, timeout=0.3, scheduler="greenlet")
    assert info.value.ranks == [0, 1] and time.monotonic() - start < 5


def test_auto_uses_threads_for_small_runs_and_the_choice_is_checked():
    with pytest.raises(ValueError, match="scheduler"):
        sim.run(lambda comm: None, 2, scheduler="fibers")


# ------------------------------------------------------------------ scale
def test_4096_ranks_barrier_and_1024_ranks_builtins_equal_their_formulas():
    net = Network.preset("ethernet_10g")
    res = sim.run(lambda comm: comm.barrier(), 4096, network=net)
    assert math.isclose(res.seconds, collective_time("barrier", 0, 4096, net), rel_tol=1e-12)

    def builtins(comm):
        t = torch.full((1000,), float(comm.rank))
        comm.all_reduce(t)
        comm.broadcast(t, src=3)
        return t[0].item()

    res = sim.run(builtins, 1024, network=net)
    assert set(res) == {1023 * 1024 / 2}
    want = (collective_time("all_reduce", 4000, 1024, net)
            + collective_time("broadcast", 4000, 1024, net))
    assert math.isclose(res.seconds, want, rel_tol=1e-12)


def test_the_sim_benchmark_runs_every_operation():
    from benchmarks import sim as bench_sim

    rows = [bench_sim.measure(8, op, 64) for op in bench_sim.OPS]
    assert [r["events"] for r in rows] == [112, 112, 7, 56, 56, 24, 160]
    assert "events/s" in bench_sim.table(rows) and all(r["wall"] > 0 for r in rows)


def _bucketed_step(comm):
    from syncedu import dp

    torch.manual_seed(comm.rank)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    wrapped = dp.DataParallel(model, comm, "bucketed", bucket_cap_mb=0.0002)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(10 + comm.rank))
    wrapped(x).square().mean().backward()  # buckets go out from autograd hooks
    wrapped.finish_gradient_synchronization()
    grads = [p.grad.clone() for p in model.parameters()]
    wrapped.close()
    return grads


def test_bucketed_data_parallel_on_greenlet_ranks_equals_threads():
    on_threads = sim.run(_bucketed_step, 3, scheduler="thread")
    on_greenlets = sim.run(_bucketed_step, 3, scheduler="greenlet")
    for a, b in zip(on_threads, on_greenlets, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert on_threads.ledger.rows() == on_greenlets.ledger.rows()
