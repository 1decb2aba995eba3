"""backend="shm": point-to-point and built-ins through shared memory (syncedu/comm/shm.py).

A shm run keeps Gloo's default group beside the shared-memory channels, so each check
compares the two transports in the same processes: Gloo's `torch.distributed` built-in is
the witness for ours. Values are small integers, so every sum is exact in every dtype and
any order of addition gives the same bits.
"""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from syncedu import Network, collectives, launch
from syncedu.comm import shm
from syncedu.comm.ledger import ring_allreduce_elements

pytestmark = pytest.mark.real

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SIZES = (1, 7, 1001, 1_300_001)  # odd; the last is 5.2 MB in float32, over a ring's capacity


def _segments() -> set[str]:
    return {f for f in os.listdir(shm.SHM_DIR) if f.startswith("syncedu-")}


@pytest.fixture(autouse=True)
def nothing_left_in_shared_memory():
    before = _segments()
    yield
    assert _segments() - before == set(), "a shared-memory segment outlived its run"


@pytest.fixture(scope="module")
def pool2():
    with launch.Pool(2, backend="shm", output="quiet", timeout=120) as pool:
        yield pool


def _data(comm, n: int, dtype, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * comm.rank + n + salt)
    return torch.randint(-4, 5, (n,), generator=g).to(dtype)


def _against_gloo(comm) -> list[str]:
    """Every built-in and every course algorithm on shm, each against Gloo's answer."""
    bad, checks, n = [], [], comm.world_size
    for dtype in DTYPES:
        for size in SIZES:
            x = _data(comm, size, dtype)

            def same(name, ours, gloo, size=size, dtype=dtype):
                checks.append(name)
                if not torch.equal(ours, gloo):
                    bad.append(f"{name} {dtype} n={size}")

            for op, gop in (("sum", dist.ReduceOp.SUM), ("max", dist.ReduceOp.MAX)):
                ours, gloo = x.clone(), x.clone()
                comm.all_reduce(ours, op=op)
                dist.all_reduce(gloo, op=gop)
                same(f"all_reduce {op}", ours, gloo)
            for name, algorithm in collectives.ALGORITHMS.items():
                ours, gloo = x.clone(), x.clone()
                algorithm(comm, ours)
                dist.all_reduce(gloo)
                same(name, ours, gloo)
            ours, gloo = x.clone(), x.clone()
            comm.broadcast(ours, src=n - 1)
            dist.broadcast(gloo, src=n - 1)
            same("broadcast", ours, gloo)
            ours, gloo = x.clone(), x.clone()
            comm.reduce(ours, dst=1)
            dist.reduce(gloo, dst=1)
            if comm.rank == 1:
                same("reduce", ours, gloo)
            got, want = [torch.empty_like(x) for _ in range(n)], [torch.empty_like(x)
                                                                 for _ in range(n)]
            comm.all_gather(got, x)
            dist.all_gather(want, x)
            same("all_gather", torch.cat(got), torch.cat(want))
            parts = [_data(comm, size, dtype, salt=p) for p in range(n)]
            ours, gloo = torch.empty_like(x), torch.empty_like(x)
            comm.reduce_scatter(ours, parts)
            dist.reduce_scatter(gloo, parts)
            same("reduce_scatter", ours, gloo)
    x = torch.randn(100_001, generator=torch.Generator().manual_seed(comm.rank))
    comm.all_reduce(x)  # not exact: rounding depends on the order, which every rank shares
    everyone = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(everyone, x)
    same("the same bits on every rank", everyone[comm.rank], everyone[0])
    return bad, len(checks)


def test_every_collective_equals_gloos_on_two_ranks(pool2):
    # 3 dtypes x 4 sizes x (2 ops + 7 algorithms + 3 built-ins; reduce on its dst), + 1
    assert pool2.run(_against_gloo) == [([], 12 * 12 + 1), ([], 12 * 13 + 1)]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [3, 4])
def test_every_collective_equals_gloos_on_three_and_four_ranks(world_size):
    res = launch.run(_against_gloo, world_size, backend="shm", output="quiet", timeout=300)
    assert [bad for bad, _ in res] == [[]] * world_size


def _ledger_and_transport(comm, numel: int):
    t, before = torch.ones(numel), dict(comm.transport_bytes)  # (since the comm was made)
    comm.all_reduce(t)
    collectives.ring_allreduce(comm, t)
    return t[0].item(), *(comm.transport_bytes[k] - before[k] for k in ("shm", "gloo"))


def test_every_byte_is_counted_and_the_counts_agree_with_the_transport(pool2):
    numel = 1 << 20  # divisible by 2: the exchange and the ring send the same bytes
    res = pool2.run(_ledger_and_transport, (numel,))
    for r in range(2):
        ring = ring_allreduce_elements(numel, 2, r)[0] * 4  # 2(N-1)/N * S by the formula
        assert res[r][0] == 4.0  # two allreduces of ones on two ranks
        assert res.ledger.counted.ops["all_reduce"].sent[r] == ring
        assert res.ledger.counted.ops["ring_allreduce"].sent[r] == ring
        assert res.ledger.modeled.sent[r] == 0  # nothing charged by formula
        assert res[r][1] == res.ledger.sent[r] and res[r][2] == 0  # what the rings carried
        assert res.trace.nbytes[res.trace.src == r].sum() == res.ledger.sent[r]  # each message


def _filled(shape: tuple, dtype, rank: int) -> torch.Tensor:
    n = torch.Size(shape).numel()
    return (torch.arange(n) % 100 + rank).reshape(shape).to(dtype)


def _all_dtypes_and_crossing_sends(comm):
    peer, out = 1 - comm.rank, []
    for dtype in (torch.bool, torch.int8, torch.int64, torch.float64, torch.complex64,
                  torch.bfloat16):
        for shape in ((), (0,), (3, 5), (2_000_003,)):
            theirs = torch.empty(shape, dtype=dtype)
            works = [comm.isend(_filled(shape, dtype, comm.rank), peer), comm.irecv(theirs, peer)]
            for work in works:  # both ranks send first: progress in wait() sees them through
                work.wait(timeout=60)
            out.append(torch.equal(theirs, _filled(shape, dtype, peer)))
    return all(out), len(out)


def test_any_dtype_and_shape_and_messages_larger_than_the_ring(pool2):
    assert list(pool2.run(_all_dtypes_and_crossing_sends)) == [(True, 24)] * 2


def _receive_with_a_timeout(comm):
    if comm.rank == 0:
        t0 = time.monotonic()
        try:
            comm.irecv(torch.empty(4), 1).wait(timeout=0.5)  # rank 1 sends nothing yet
        except TimeoutError as e:
            return str(e), time.monotonic() - t0
    time.sleep(1.0)
    return None


def test_a_wait_past_its_timeout_raises_naming_the_peer():
    res = launch.run(_receive_with_a_timeout, 2, backend="shm", output="quiet", timeout=60)
    message, seconds = res[0]
    assert "rank 0: recv from rank 1" in message and 0.5 <= seconds < 5, (message, seconds)


def _mismatched(comm):
    if comm.rank == 0:
        comm.send(torch.ones(10), 1)
    else:
        comm.recv(torch.empty(20), 0)


def test_a_receive_of_the_wrong_size_raises_naming_both_sides():
    with pytest.raises(launch.WorkerError, match=r"rank 0 sent \(40, 0\).*rank 1.*\(80, 0\)"):
        launch.run(_mismatched, 2, backend="shm", output="quiet", timeout=60)


def _killed_mid_message(comm):
    big = torch.ones(16 << 20)  # 64 MiB: 16 rings' worth
    if comm.rank == 1:
        work = comm.isend(big, 0)
        time.sleep(0.5)  # rank 0 is copying it out by now
        os.kill(os.getpid(), signal.SIGKILL)
        work.wait()
    comm.recv(big, 1)


def test_a_rank_killed_mid_message_is_named_and_leaves_nothing():
    t0 = time.monotonic()
    with pytest.raises(launch.WorkerError, match="SIGKILL") as err:
        launch.run(_killed_mid_message, 2, backend="shm", output="quiet", timeout=60)
    assert err.value.rank == 1 and time.monotonic() - t0 < 30


def _segments_while_running(comm):
    return sorted(_segments())


def test_segment_names_are_gone_once_mapped_and_a_closed_pool_leaves_none():
    before = _segments()
    with launch.Pool(2, backend="shm", output="quiet") as pool:
        assert set(pool.run(_segments_while_running)[0]) - before == set()
        # a rank killed during set-up would leave its segment: the launcher removes it
        leftover = Path(shm.SHM_DIR) / f"{os.path.basename(pool._ranks._tmp)}-7"
        leftover.write_bytes(b"")
    assert not leftover.exists()


def _slow(comm):
    comm.barrier()
    time.sleep(30)


def test_a_run_past_its_timeout_leaves_no_segment():
    with pytest.raises(launch.TimeoutError):
        launch.run(_slow, 2, backend="shm", output="quiet", timeout=3)


@pytest.mark.parametrize("after", [0.3, 1.5, 4.0])
def test_an_interrupted_kernel_leaves_no_segment(after):
    """Ctrl-C as a notebook kernel sees it, early (Python starting), in the set-up (segments
    being made) or in the run: the caller gets KeyboardInterrupt, and the autouse fixture
    finds no segment left."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(after, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch.run(_slow, 2, backend="shm", output="quiet", timeout=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


def _ring_with_emulation(comm):
    t = torch.full((100_003,), float(comm.rank + 1))
    collectives.ring_pipelined_allreduce(comm, t, segment_bytes=64 << 10)
    try:
        comm.recv_any(torch.empty(1))
    except NotImplementedError as e:
        return t.unique().tolist(), str(e)


def test_emulated_network_sends_from_threads_and_any_source_is_refused():
    res = launch.run(_ring_with_emulation, 2, backend="shm", output="quiet", timeout=60,
                     network=Network(latency=1e-4, bandwidth=1e9))
    assert res[0][0] == [3.0] and "use 'gloo'" in res[0][1]


def test_unknown_backends_raise_naming_backend():
    with pytest.raises(ValueError, match="backend"):
        launch.Pool(2, backend="tcp")


AGENT_SCRIPT = '''
import torch
from syncedu import collectives, launch
comm = launch.from_env(backend="shm", timeout=60)
t = torch.full((1 << 16,), float(comm.rank + 1))
collectives.hierarchical_allreduce(comm, t)
# One file per rank: the two ranks of an agent share its stdout pipe, and even print(line)
# is two writes (the text, then the newline), so their lines interleaved in CI.
line = (f"rank {comm.rank} node {comm.node} local {comm.local_rank} sum {int(t[0])} "
        f"shm {comm.transport_bytes['shm']} gloo {comm.transport_bytes['gloo']} "
        f"ledger {comm.ledger.sent}")
with open(f"row{comm.rank}.txt", "w") as f:
    f.write(line)
'''


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_torchrun_agents_split_shared_memory_inside_from_gloo_across(tmp_path):
    """A 2 x 2 job: two agents (nodes) of two ranks; lesson 02's hierarchical allreduce
    sends its two inside steps over shared memory and its across step over Gloo."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    port = launch.free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]),
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    agents = [subprocess.Popen([torchrun, "--nnodes=2", "--nproc-per-node=2",
                                f"--node-rank={node}", "--master-addr=127.0.0.1",
                                f"--master-port={port}", str(script)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=tmp_path, start_new_session=True)
              for node in (0, 1)]
    try:
        outs = [a.communicate(timeout=180) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait()
    assert [a.returncode for a in agents] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    rows = sorted((tmp_path / f"row{rank}.txt").read_text().split() for rank in range(4))
    nbytes = 4 << 16
    # inside: a reduce-scatter and an all-gather of S/2 each; across: a 2-rank ring of S/2
    assert [(int(r[1]), int(r[3]), int(r[5]), int(r[7]), int(r[9]), int(r[11]), int(r[13]))
            for r in rows] == [(rank, rank // 2, rank % 2, 10, nbytes, nbytes // 2,
                                nbytes * 3 // 2) for rank in range(4)]
