"""Horovod on this machine: two real ranks over Gloo, started with ``horovod.run``.

Horovod 0.28.1 is built from source by ``make setup`` (scripts/build-horovod.sh); where
that build failed or was skipped the test skips and says how to get it.
"""

import signal
import time

import psutil
import pytest

pytestmark = [pytest.mark.horovod, pytest.mark.real, pytest.mark.slow]

try:
    import horovod
    import horovod.torch  # noqa: F401  (the PyTorch extension is what must load)
except Exception as exc:  # ImportError, or an undefined symbol from a stale build
    pytest.skip(
        f"horovod.torch is not importable ({type(exc).__name__}: {exc}); build it with "
        "`make setup` (or `make setup FORCE=1` to retry; log in .venv/horovod-build.log)",
        allow_module_level=True,
    )


def _descendants():
    """PIDs of live processes started (directly or not) by this test process.

    multiprocessing's resource_tracker helper is left out: it is started once per
    process by multiprocessing itself, stays on purpose, and is not a rank.
    """
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if "multiprocessing.resource_tracker" in " ".join(child.cmdline()):
                continue
            alive.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return set(alive)


def _wait_until_gone(pids, timeout=10.0):
    """PIDs from ``pids`` still alive after waiting up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = pids & _descendants()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _describe(pids):
    out = []
    for pid in sorted(pids):
        try:
            out.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())}")
        except psutil.NoSuchProcess:
            out.append(f"{pid}: (gone)")
    return out


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    # horovod.run (gloo_run) installs its own SIGINT/SIGTERM handlers in the caller
    # and leaves them there: Ctrl-C would then no longer interrupt this process.
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.timeout(120)
def test_horovod_run_allreduce_sum_on_two_gloo_ranks():
    # Defined inside the test, like a worker defined in a notebook cell: horovod.run
    # pickles it by value (cloudpickle), so nothing re-imports this module by name.
    def rank_plus_one():
        import horovod.torch as hvd
        import torch

        hvd.init()
        try:
            tensor = torch.tensor([float(hvd.rank() + 1)])
            # The same tensor name on every rank: names that differ hang Horovod.
            total = hvd.allreduce(tensor, op=hvd.Sum, name="rank_plus_one")
            return hvd.rank(), hvd.size(), total.item()
        finally:
            hvd.shutdown()

    before = _descendants()
    results = horovod.run(rank_plus_one, num_proc=2, use_gloo=True, start_timeout=60)

    assert sorted(r[0] for r in results) == [0, 1]
    assert [r[1] for r in results] == [2, 2]
    assert [r[2] for r in results] == [3.0, 3.0]
    leftover = _wait_until_gone(_descendants() - before)
    assert not leftover, f"processes left behind by horovod.run: {_describe(leftover)}"
