"""The simulator: values, ledger, logical time, determinism, deadlocks, errors, scale."""

from __future__ import annotations

import math
import random
import threading
import time

import pytest
import torch

from syncedu.collectives import ALGORITHMS
from syncedu.comm.errors import DeadlockError, WorkerError
from syncedu.comm.errors import TimeoutError as RunTimeoutError
from syncedu.comm.ledger import ring_chunks
from syncedu.comm.network import Network
from syncedu.comm.sim import SimComm, run

WORLDS = [1, 2, 3, 5, 8]
LENGTHS = [1, 7, 1000]
ALPHA, BW = 1e-3, 1e6  # 1 ms latency, 1 MB/s: easy numbers to check by hand
NET = Network(latency=ALPHA, bandwidth=BW)


def _sim_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sim-rank-")]


@pytest.fixture(autouse=True)
def no_leftover_threads():
    yield
    assert _sim_threads() == [], "a simulated rank's thread outlived its run"


def _values(rank: int, numel: int, dtype=torch.float32, low=-4, high=5) -> torch.Tensor:
    """Small integers, so sums are exact even in float16 and bfloat16."""
    g = torch.Generator().manual_seed(1000 * rank + numel)
    return torch.randint(low, high, (numel,), generator=g).to(dtype)


def ring_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """A from-scratch ring allreduce on isend/irecv (rank r owns chunk r after step 1)."""
    n, r = comm.world_size, comm.rank
    chunks = list(tensor.view(-1).split(ring_chunks(tensor.numel(), n)))
    right, left = (r + 1) % n, (r - 1) % n
    with comm.scope("ring_allreduce"):
        for s in range(n - 1):  # Step 1: reduce-scatter
            into = chunks[(r - 2 - s) % n]
            buf = torch.empty_like(into)
            pending = comm.irecv(buf, left)
            comm.isend(chunks[(r - 1 - s) % n], right).wait()
            pending.wait()
            into.add_(buf)
        for s in range(n - 1):  # Step 2: all-gather
            pending = comm.irecv(chunks[(r - 1 - s) % n], left)
            comm.isend(chunks[(r - s) % n], right).wait()
            pending.wait()
    return tensor


# ---------------------------------------------------------------- values
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("numel", LENGTHS)
@pytest.mark.parametrize("n", WORLDS)
def test_all_reduce_sum_equals_direct_sum(n, numel, dtype):
    def worker(comm):
        return comm.all_reduce(_values(comm.rank, numel, dtype))

    res = run(worker, n)
    expected = sum(_values(r, numel, dtype) for r in range(n))
    assert all(torch.equal(v, expected) and v.dtype == dtype for v in res)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("n", WORLDS)
def test_all_reduce_ops(n, op):
    inputs = [_values(r, 7, low=-3, high=4) for r in range(n)]
    stacked = torch.stack(inputs)
    expected = {"sum": stacked.sum(0), "prod": stacked.prod(0), "max": stacked.amax(0),
                "min": stacked.amin(0), "avg": stacked.mean(0)}[op]
    res = run(lambda comm: comm.all_reduce(inputs[comm.rank].clone(), op=op), n)
    for v in res:
        torch.testing.assert_close(v, expected)


@pytest.mark.parametrize("numel", LENGTHS)
@pytest.mark.parametrize("n", WORLDS)
def test_broadcast_from_every_root(n, numel):
    def worker(comm):
        return [comm.broadcast(_values(comm.rank, numel), src=src) for src in range(n)]

    res = run(worker, n)
    for src in range(n):
        assert all(torch.equal(res[r][src], _values(src, numel)) for r in range(n))


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("n", WORLDS)
def test_reduce_to_every_root_leaves_other_ranks_alone(n, op):
    inputs = [_values(r, 7, low=-3, high=4) for r in range(n)]
    stacked = torch.stack(inputs)
    expected = {"sum": stacked.sum(0), "prod": stacked.prod(0), "max": stacked.amax(0),
                "min": stacked.amin(0)}[op]

    def worker(comm):
        return [comm.reduce(inputs[comm.rank].clone(), dst=dst, op=op) for dst in range(n)]

    res = run(worker, n)
    for dst in range(n):
        for r in range(n):
            assert torch.equal(res[r][dst], expected if r == dst else inputs[r])


@pytest.mark.parametrize("numel", LENGTHS)
@pytest.mark.parametrize("n", WORLDS)
def test_reduce_scatter_and_all_gather(n, numel):
    def inputs(rank):
        return [_values(100 * rank + i, numel) for i in range(n)]

    def worker(comm):
        mine = inputs(comm.rank)
        out = torch.empty(numel)
        comm.reduce_scatter(out, mine)
        unchanged = all(torch.equal(a, b) for a, b in zip(mine, inputs(comm.rank), strict=True))
        gathered = [torch.empty(numel) for _ in range(n)]
        comm.all_gather(gathered, _values(comm.rank, numel))
        return out, unchanged, gathered

    res = run(worker, n)
    for r, (out, unchanged, gathered) in enumerate(res):
        assert torch.equal(out, sum(inputs(q)[r] for q in range(n)))
        assert unchanged
        assert all(torch.equal(gathered[q], _values(q, numel)) for q in range(n))


def test_point_to_point_copies_at_send_and_receives_into_parameters():
    def worker(comm):
        if comm.rank == 0:
            buf = torch.arange(6.0).view(2, 3)
            comm.isend(buf, 1).wait()
            buf.zero_()  # free once the send completed
            comm.broadcast(torch.zeros(3, 2), src=1)  # every rank joins a collective
            return None
        param = torch.nn.Parameter(torch.zeros(3, 2))
        comm.recv(param, 0)  # a reshaped receive buffer that requires grad
        comm.broadcast(param, src=1)
        return param.detach().clone()

    res = run(worker, 2)
    assert torch.equal(res[1], torch.arange(6.0).view(3, 2))


def test_messages_match_in_order_per_source_and_tag():
    def worker(comm):
        if comm.rank == 0:
            for i, tag in enumerate([5, 7, 5, 7]):
                comm.send(torch.tensor([float(i)]), 1, tag=tag)
            return None
        got = [comm.recv(torch.empty(1), 0, tag=tag).item() for tag in (7, 7, 5, 5)]
        return got

    assert run(worker, 2, network=Network(eager_limit="open_mpi"))[1] == [1.0, 3.0, 0.0, 2.0]
    with pytest.raises(DeadlockError, match="tag 5"):  # Gloo's rendezvous: send 5 waits
        run(worker, 2)


def test_comm_identity():
    res = run(lambda comm: (comm.backend, comm.device.type, comm.rank, comm.world_size,
                            isinstance(comm, SimComm)), 3)
    assert list(res) == [("sim", "cpu", r, 3, True) for r in range(3)]
    assert len(res) == res.world_size == 3


# ---------------------------------------------------------------- ledger
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_all_reduce_sends_2_n_minus_1_over_n_of_the_tensor(n):
    numel = 250 * n
    res = run(lambda comm: comm.all_reduce(torch.ones(numel)), n)
    size = numel * 4
    assert res.ledger.sent == [2 * (n - 1) * size // n] * n
    assert res.ledger.received == [2 * (n - 1) * size // n] * n
    assert res.ledger.msgs_sent == [2 * (n - 1)] * n


@pytest.mark.parametrize("n, numel", [(3, 1000), (5, 7), (8, 3)])
def test_from_scratch_ring_and_built_in_agree_on_ledger_time_and_values(n, numel):
    def worker(comm, scratch):
        t = _values(comm.rank, numel)
        return ring_allreduce(comm, t) if scratch else comm.all_reduce(t)

    a = run(worker, n, args=(True,), network=NET)
    b = run(worker, n, args=(False,), network=NET)
    assert a.ledger.ops["ring_allreduce"].sent == b.ledger.ops["all_reduce"].sent
    assert a.ledger.ops["ring_allreduce"].received == b.ledger.ops["all_reduce"].received
    assert a.seconds == pytest.approx(b.seconds, rel=1e-12)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_send_and_recv_bytes():
    def worker(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(1000), 1)
        else:
            comm.recv(torch.zeros(1000), 0)

    ledger = run(worker, 2).ledger
    assert ledger.ops["send"].sent == [4000, 0]
    assert ledger.ops["recv"].received == [0, 4000]
    assert ledger.msgs_sent == [1, 0] and ledger.msgs_received == [0, 1]


# ---------------------------------------------------------- logical time
T = ALPHA + 4000 / BW  # one message of 1000 float32


def test_one_message_takes_latency_plus_bytes_over_bandwidth():
    def worker(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(1000), 1)
        else:
            comm.recv(torch.zeros(1000), 0)
        return comm.now()

    res = run(worker, 2, network=NET)
    assert list(res) == pytest.approx([T, T])
    assert res.seconds == pytest.approx(T)


def test_two_messages_on_one_link_queue():
    def worker(comm):
        if comm.rank == 0:
            works = [comm.isend(torch.zeros(1000), 1) for _ in range(2)]
            assert comm.now() == 0.0  # isend returns at once
            for w in works:
                w.wait()
            return [comm.now()]
        return [comm.recv(torch.zeros(1000), 0) is not None and comm.now() for _ in range(2)]

    res = run(worker, 2, network=NET)
    assert res[0] == pytest.approx([2 * T])
    assert res[1] == pytest.approx([T, 2 * T])


def test_messages_into_one_rank_take_turns_but_a_rank_sends_and_receives_at_once():
    def fan_in(comm):
        if comm.rank == 0:
            for src in (1, 2):
                comm.recv(torch.zeros(1000), src)
        else:
            comm.send(torch.zeros(1000), 0)
        return comm.now()

    assert list(run(fan_in, 3, network=NET)) == pytest.approx([2 * T, T, T])

    def swap(comm):
        pending = comm.irecv(torch.zeros(1000), 1 - comm.rank)
        comm.send(torch.zeros(1000), 1 - comm.rank)
        pending.wait()
        return comm.now()

    assert list(run(swap, 2, network=NET)) == pytest.approx([T, T])


def test_a_receive_waits_for_the_arrival_and_no_longer():
    def worker(comm, receiver_busy):
        if comm.rank == 0:
            comm.compute(1.0)
            comm.send(torch.zeros(1000), 1)
        else:
            comm.compute(receiver_busy)
            comm.recv(torch.zeros(1000), 0)
        return comm.now()

    assert run(worker, 2, args=(0.0,), network=NET)[1] == pytest.approx(1.0 + T)
    assert run(worker, 2, args=(5.0,), network=NET)[1] == pytest.approx(5.0)


def test_an_early_message_waited_for_late_still_comes_in_early():
    def worker(comm):
        if comm.rank == 0:  # waits for the straggler first, then for rank 2's message
            comm.recv(torch.zeros(1000), 1)
            after_first = comm.now()
            comm.recv(torch.zeros(1000), 2)
            return after_first, comm.now()
        if comm.rank == 1:
            comm.compute(10.0)
        comm.send(torch.zeros(1000), 0)
        return None

    first, second = run(worker, 3, network=NET)[0]
    assert first == pytest.approx(10.0 + T)
    assert second == pytest.approx(10.0 + T)  # rank 2's message came in at T, in a gap


def test_compute_overlaps_an_isend_and_slowdown_multiplies_it():
    def worker(comm):
        if comm.rank == 0:
            work = comm.isend(torch.zeros(1000), 1)
            comm.compute(T / 2)
            work.wait()
        else:
            comm.recv(torch.zeros(1000), 0)
            comm.compute(2.0)
        return comm.now()

    net = NET.replace(slowdown=[1.0, 3.0])
    assert list(run(worker, 2, network=net)) == pytest.approx([T, T + 6.0])


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_time_is_2_n_minus_1_alpha_plus_chunk_beta(n):
    numel = 250 * n
    expected = 2 * (n - 1) * (ALPHA + numel * 4 / n / BW)
    for worker in (lambda comm: comm.all_reduce(torch.ones(numel)),
                   lambda comm: ring_allreduce(comm, torch.ones(numel))):
        assert run(worker, n, network=NET).seconds == pytest.approx(expected)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_broadcast_chain_barrier_and_naive_gather_times(n):
    chain = run(lambda comm: comm.broadcast(torch.zeros(1000)), n, network=NET)
    assert chain.seconds == pytest.approx((n - 1) * T)
    barrier = run(lambda comm: comm.barrier(), n, network=NET)
    assert barrier.seconds == pytest.approx(math.ceil(math.log2(n)) * ALPHA)

    def gather(comm):
        if comm.rank == 0:
            for src in range(1, n):
                comm.recv(torch.zeros(1000), src)
        else:
            comm.send(torch.zeros(1000), 0)

    assert run(gather, n, network=NET).seconds == pytest.approx((n - 1) * T)


def test_default_network_is_free_and_compute_is_counted():
    def worker(comm):
        comm.all_reduce(torch.ones(1000))
        comm.compute(1.5 if comm.rank == 1 else 0.5)
        return comm.now()

    res = run(worker, 3)
    assert list(res) == [0.5, 1.5, 0.5]
    assert res.seconds == 1.5


# ----------------------------------------------------------- determinism
def _busy_worker(comm, shake):
    """Collectives, point-to-point and compute; `shake` perturbs the real thread timing."""
    if shake:
        time.sleep(random.random() * 0.002)
    n, r = comm.world_size, comm.rank
    t = _values(r, 100)
    comm.all_reduce(t)
    comm.compute(0.001 * (r + 1))
    pending = comm.irecv(torch.empty(50), (r - 1) % n, tag=3)
    comm.send(t[:50].clone(), (r + 1) % n, tag=3)
    pending.wait()
    if shake:
        time.sleep(random.random() * 0.002)
    out = [torch.empty(100) for _ in range(n)]
    comm.all_gather(out, t)
    comm.barrier()
    return t, comm.now()


def _same(a, b) -> bool:
    return (all(torch.equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
            and a.ledger.rows() == b.ledger.rows() and a.seconds == b.seconds)


@pytest.mark.parametrize("network", [NET, NET.replace(jitter=2e-4, loss=0.2, seed=7)])
def test_same_call_same_values_ledger_and_seconds(network):
    first = run(_busy_worker, 6, args=(False,), network=network)
    assert _same(first, run(_busy_worker, 6, args=(False,), network=network))
    assert _same(first, run(_busy_worker, 6, args=(True,), network=network))


def test_jitter_and_loss_change_time_and_follow_the_seed():
    base = run(_busy_worker, 6, args=(False,), network=NET).seconds
    noisy = [run(_busy_worker, 6, args=(False,),
                 network=NET.replace(jitter=2e-4, loss=0.2, seed=s)).seconds for s in (1, 2)]
    assert base < noisy[0] != noisy[1]


def test_ranks_run_in_the_same_order_every_time():
    def worker(comm, log):
        for step in range(3):
            log.append((comm.rank, step))
            comm.barrier()

    logs = [[], []]
    for log in logs:
        run(worker, 5, args=(log,))
    assert logs[0] == logs[1]


def test_concurrent_runs_do_not_share_state():
    results = {}

    def one(key, n):
        results[key] = run(lambda comm: comm.all_reduce(torch.full((10,), 1.0)), n)

    threads = [threading.Thread(target=one, args=(k, n)) for k, n in enumerate([3, 4, 5, 6])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, n in enumerate([3, 4, 5, 6]):
        assert all(torch.equal(v, torch.full((10,), float(n))) for v in results[k])


# ------------------------------------------------------ deadlock, errors
def test_both_ranks_receiving_first_is_a_deadlock_naming_both():
    def worker(comm):
        comm.recv(torch.zeros(4), 1 - comm.rank)
        comm.send(torch.zeros(4), 1 - comm.rank)

    start = time.monotonic()
    with pytest.raises(DeadlockError) as info:
        run(worker, 2)
    assert time.monotonic() - start < 1.0
    assert info.value.ranks == [0, 1]
    assert info.value.waiting[0] == "recv from rank 1 (tag 0, 16 bytes)"
    assert "rank 1: recv from rank 0" in str(info.value)


def test_waiting_for_a_rank_that_returned_or_skipped_a_collective():
    def p2p(comm):
        if comm.rank == 0:
            comm.recv(torch.zeros(4), 2, tag=9)

    with pytest.raises(DeadlockError) as info:
        run(p2p, 3)
    assert info.value.waiting == {0: "recv from rank 2 (tag 9, 16 bytes); "
                                     "rank 2 has already returned"}

    def skipped(comm):
        if comm.rank != 1:
            comm.all_reduce(torch.ones(8))

    with pytest.raises(DeadlockError, match="all_reduce: waiting for a message from rank"):
        run(skipped, 3)


def _fails_on_rank_2(comm):
    if comm.rank == 2:
        raise ValueError("boom on purpose")
    comm.all_reduce(torch.ones(10))  # the others block here and must be released


def test_an_exception_in_rank_2_becomes_a_worker_error():
    with pytest.raises(WorkerError) as info:
        run(_fails_on_rank_2, 4)
    assert info.value.rank == 2
    assert "ValueError: boom on purpose" in str(info.value)
    assert "_fails_on_rank_2" in info.value.traceback


def test_mismatched_messages_and_collectives_are_errors_naming_both_ranks():
    def dtypes(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(4), 1)
        else:
            comm.recv(torch.zeros(4, dtype=torch.float16), 0)

    with pytest.raises(WorkerError, match="rank 1 posted a receive .* rank 0 sent") as info:
        run(dtypes, 2)
    assert info.value.rank == 1

    def calls(comm):
        if comm.rank == 0:
            comm.broadcast(torch.zeros(4))
        else:
            comm.all_reduce(torch.zeros(4))

    with pytest.raises(WorkerError, match="same collectives in the same order"):
        run(calls, 2)

    with pytest.raises(WorkerError, match="same shape and dtype"):
        run(lambda comm: comm.all_reduce(torch.zeros(4 + comm.rank)), 2)


def test_a_run_past_its_timeout_is_stopped():
    def worker(comm):
        if comm.rank == 0:
            while True:  # never calls the comm again: stopped from outside
                time.sleep(0.01)

    start = time.monotonic()
    with pytest.raises(RunTimeoutError) as info:
        run(worker, 2, timeout=0.3)
    assert info.value.ranks == [0, 1]  # rank 1 never got its turn
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("kwargs, name", [
    (dict(world_size=0), "world_size"), (dict(world_size=4097), "world_size"),
    (dict(world_size=2.0), "world_size"), (dict(world_size=True), "world_size"),
    (dict(fn=None), "fn"), (dict(network="10g"), "network"),
    (dict(network=Network(slowdown=[1, 2])), "slowdown"), (dict(kwargs=[1]), "kwargs"),
    (dict(args=5), "args"), (dict(timeout=0), "timeout"),
])
def test_bad_arguments_name_the_parameter(kwargs, name):
    call = dict(fn=lambda comm: None, world_size=3) | kwargs
    with pytest.raises(ValueError, match=name):
        run(call.pop("fn"), call.pop("world_size"), **call)


# ----------------------------------------------------------------- scale
def test_256_ranks_ring_allreduce_from_scratch():
    n, numel = 256, 1000
    net = Network.preset("ethernet_10g")

    def worker(comm):
        t = torch.full((numel,), float(comm.rank))
        ring_allreduce(comm, t)
        return bool((t == n * (n - 1) / 2).all())

    start = time.process_time()  # CPU, not wall: a loaded machine must not fail it
    res = run(worker, n, network=net)
    cpu = time.process_time() - start
    assert all(res)
    chunks = ring_chunks(numel, n)  # 232 chunks of 4 floats, 24 of 3
    assert res.ledger.sent[0] == 4 * (2 * numel - chunks[0] - chunks[1])
    assert res.seconds > 2 * (n - 1) * net.latency
    assert cpu < 60, f"256 simulated ranks took {cpu:.1f} s of CPU"


def test_1024_ranks_with_small_messages():
    def worker(comm):
        comm.barrier()
        t = torch.full((4,), float(comm.rank))
        comm.broadcast(t, src=7)
        pending = comm.irecv(torch.empty(4), (comm.rank - 1) % comm.world_size)
        comm.send(t, (comm.rank + 1) % comm.world_size)
        pending.wait()
        return t[0].item()

    res = run(worker, 1024, network=NET)
    assert list(res) == [7.0] * 1024
    assert res.seconds == pytest.approx(10 * ALPHA + 1023 * (ALPHA + 16 / BW) + ALPHA + 16 / BW)


class _Bar:
    def __init__(self):
        self.n = 0

    def update(self, k):
        self.n += k


def test_progress_counts_every_message_and_rejects_bad_values():
    # 64 ranks x 2(N-1) ring messages = 8064: more than one update of 4096, then the rest.
    bar = _Bar()
    run(lambda c: ALGORITHMS["ring"](c, torch.ones(100)), 64, progress=bar)
    assert bar.n == 2 * 63 * 64
    run(lambda c: c.all_reduce(torch.ones(3)), 4, progress=True)  # makes and closes a bar
    run(lambda c: None, 2, progress=False)
    with pytest.raises(ValueError, match="progress='yes' must be None or False"):
        run(lambda c: None, 2, progress="yes")
