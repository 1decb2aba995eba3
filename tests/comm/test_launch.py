"""The launcher on real processes: values, output, faults, timeouts, bad arguments."""

from __future__ import annotations

import _thread
import builtins
import os
import signal
import threading
import time

import psutil
import pytest
import torch

from syncedu import Network, launch

pytestmark = pytest.mark.real


def _rank_procs():
    me = psutil.Process()
    out = []
    for p in me.children(recursive=True):
        try:
            if "syncedu.comm._worker" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


_SHARED: list = []  # the module's warm pool, whose ranks outlive each test by design


@pytest.fixture(scope="module")
def shared():
    """One warm 2-rank pool for the tests of values and output (each start costs seconds)."""
    with launch.Pool(2, output="ordered") as pool:
        _SHARED.append(pool)
        yield pool
    _SHARED.clear()


@pytest.fixture(autouse=True)
def no_leftover_ranks():
    before = {p.pid for p in _rank_procs()}  # another module's live pool (same pytest worker)
    yield
    keep = before | {pid for pool in _SHARED for pid in pool.pids}
    deadline = time.monotonic() + 5
    while [p for p in _rank_procs() if p.pid not in keep] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in _rank_procs() if p.pid not in keep] == [], \
        "a rank process outlived its run"


def _started(world_size: int, **kwargs) -> launch.Pool:
    """Ranks up and warm, so a test can time its failure without the start-up."""
    pool = launch.Pool(world_size, **kwargs)
    pool.run(module_level_worker, (1.0,))
    return pool


def module_level_worker(comm, scale):
    t = torch.full((3,), float(comm.rank + 1))
    comm.all_reduce(t)
    return (t * scale).tolist()


def test_values_in_rank_order_with_module_function():
    res = launch.run(module_level_worker, 3, args=(2.0,))
    assert list(res) == [[12.0] * 3] * 3
    assert len(res) == 3 and res.seconds > 0


def test_function_defined_locally_is_sent_by_value(shared):
    offset = 10

    def local(comm, *, k):
        return comm.rank * k + offset

    assert list(shared.run(local, kwargs={"k": 5})) == [10, 15]
    offset = 20  # a new value of a global it uses reaches the ranks on the next run
    assert list(shared.run(local, kwargs={"k": 5})) == [20, 25]


def test_prints_reach_caller_marked_with_rank(shared, capsys):
    def talk(comm):
        print(f"hello {comm.rank}")
        print("second line")

    shared.run(talk)
    out = capsys.readouterr().out.splitlines()
    assert out == ["[rank 0] hello 0", "[rank 0] second line",
                   "[rank 1] hello 1", "[rank 1] second line"]


def test_stderr_also_reaches_stdout(shared, capsys):
    import sys as _sys

    def warn(comm):
        print("to stderr", file=_sys.stderr)

    shared.run(warn)
    assert "[rank 1] to stderr" in capsys.readouterr().out


def test_threads_default_to_a_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("SYNCEDU_PERTURB", raising=False)  # the test run perturbs thread counts
    res = launch.run(lambda comm: torch.get_num_threads(), 2)
    cores = len(os.sched_getaffinity(0))
    assert list(res) == [max(1, cores // 2)] * 2
    assert list(launch.run(lambda comm: torch.get_num_threads(), 2, threads=3)) == [3, 3]


def test_raising_rank_gives_worker_error_and_stops_the_others():
    def boom(comm):
        if comm.rank == 1:
            raise KeyError("no such key")
        time.sleep(60)  # the other ranks must be stopped, not awaited

    with _started(3) as pool:
        t0 = time.monotonic()
        with pytest.raises(launch.WorkerError) as info:
            pool.run(boom)
        assert time.monotonic() - t0 < 20
    assert info.value.rank == 1
    assert "KeyError" in str(info.value) and "no such key" in str(info.value)
    assert "Traceback" in str(info.value) and "in boom" in str(info.value)


def test_rank_that_exits_gives_error_within_seconds():
    def die(comm):
        if comm.rank == 0:
            os._exit(3)
        comm.barrier()

    with _started(2) as pool:
        t0 = time.monotonic()
        with pytest.raises(launch.WorkerError, match="exited with code 3") as info:
            pool.run(die)
        assert time.monotonic() - t0 < 20
    assert info.value.rank == 0


def test_killed_rank_is_named():
    def killed(comm):
        if comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    with pytest.raises(launch.WorkerError, match="SIGKILL") as info:
        launch.run(killed, 2)
    assert info.value.rank == 1


def test_timeout_names_the_ranks_still_running():
    def slow(comm):
        if comm.rank == 1:
            time.sleep(60)
        return comm.rank

    with _started(2) as pool:
        t0 = time.monotonic()
        with pytest.raises(launch.TimeoutError) as info:
            pool.run(slow, timeout=2)
        assert time.monotonic() - t0 < 20
    assert isinstance(info.value, builtins.TimeoutError)
    assert info.value.ranks == [1]


def test_keyboard_interrupt_stops_every_rank():
    def forever(comm):
        time.sleep(60)

    # Ctrl-C as a notebook kernel or a terminal sees it: Python's default handler
    # (another library, e.g. horovod.run, may have left its own in place).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    try:
        # The ranks start in ~2-4 s; the interrupt may land during start-up or the run:
        # either way the caller sees KeyboardInterrupt and no rank survives.
        with pytest.raises(KeyboardInterrupt):
            launch.run(forever, 2)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("kwargs, word", [
    (dict(world_size=0), "world_size"),
    (dict(world_size=10_000), "world_size"),
    (dict(world_size="2"), "world_size"),
    (dict(world_size=2, backend="mpi"), "backend"),
    (dict(world_size=2, timeout=-1), "timeout"),
    (dict(world_size=2, threads=0), "threads"),
    (dict(world_size=2, output="loud"), "output"),
    (dict(world_size=2, network=Network(slowdown=[1, 2, 3])), "slowdown"),
    (dict(world_size=2, network="fast"), "network"),
])
def test_bad_arguments_name_the_parameter(kwargs, word):
    with pytest.raises(ValueError, match=word):
        launch.run(module_level_worker, args=(1,), **kwargs)


def test_not_callable_and_nccl_without_gpus():
    with pytest.raises(ValueError, match="fn"):
        launch.run(42, 2)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="nccl"):
            launch.run(module_level_worker, 2, args=(1,), backend="nccl")


def test_pool_reuses_ranks_and_recovers_after_a_failure():
    def pid(comm):
        return os.getpid()

    def boom(comm):
        raise RuntimeError("bad step")

    with launch.Pool(2) as pool:
        first = list(pool.run(pid))
        assert list(pool.run(pid)) == first  # same live processes
        with pytest.raises(launch.WorkerError, match="bad step"):
            pool.run(boom)
        again = list(pool.run(pid))  # fresh ranks after the failure
        assert again != first and len(again) == 2
        assert list(pool.run(module_level_worker, (1.0,))) == [[3.0] * 3] * 2


def test_comm_exposes_rank_world_device_and_backend(shared):
    res = shared.run(lambda c: (c.rank, c.world_size, str(c.device), c.backend))
    expected_backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    assert [r[:2] for r in res] == [(0, 2), (1, 2)]
    assert {r[3] for r in res} == {expected_backend}
