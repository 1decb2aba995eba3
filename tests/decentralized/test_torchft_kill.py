"""Streaming DiLoCo under torchft's manager with a SIGKILLed replica (torchft_kill.py), and the
witness lesson 12 shows beside it: ours with the dead rank's pseudo-gradient dropped."""

import signal
import time

import psutil
import pytest
import torch

from syncedu import sim
from syncedu.decentralized import torchft_check as check
from syncedu.faults.torchft_run import available

TOL = 1e-6  # stated before looking: a 3-way sum in another order, a few float32 ulps


class Dropping:
    """The witness's comm (as lesson 12's cell writes it): the dead rank sends zeros after its
    first `syncs` allreduces, while the others divide by one fewer (`shrink=False`: still by
    all, the negative control)."""

    def __init__(self, comm, dead: int, syncs: int, shrink: bool = True):
        self.comm, self.dead, self.syncs, self.shrink = comm, dead, syncs, shrink
        self.world_size = comm.world_size  # what StreamingDiLoCo.start divides by

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def all_reduce(self, t, async_op: bool = False):
        if self.syncs <= 0 and self.comm.rank == self.dead:
            t.zero_()
        self.syncs -= 1
        self.world_size = self.comm.world_size - (self.shrink and self.syncs <= 0)
        return self.comm.all_reduce(t, async_op=async_op)


def witness(replicas: int, dead: int, after: int, shrink: bool = True) -> list[dict]:
    period = check.JOB["inner_steps"] // check.JOB["fragments"]
    return list(sim.run(lambda c: check.ours(Dropping(c, dead, after // period, shrink),
                                             check.JOB), replicas))


def _diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.skipif(available() is not None, reason="torchft is not importable here")
@pytest.mark.parametrize("dead, after", [(2, 8), (0, 4)])
def test_kill_shrinks_the_quorum_and_survivors_match_ours(dead, after, started):
    from syncedu.decentralized import torchft_kill

    t0 = time.time()
    r = torchft_kill.run(3, dead, after)
    assert time.time() - t0 < 60
    ours, control = witness(3, dead, after), witness(3, dead, after, shrink=False)
    assert r["exit"][dead] == -signal.SIGKILL  # the launcher's own count: who died, how
    alive = [i for i, code in enumerate(r["exit"]) if code == 0]
    assert alive == [i for i in range(3) if i != dead] == sorted(r["final"])
    for i in alive:  # the manager's quorum, step by step, against the launcher's count
        assert r["final"][i]["participants"] == [3] * after + [len(alive)] * (24 - after)
        assert _diff(r["final"][i]["params"], ours[i]) < TOL  # the witness
        assert _diff(r["final"][i]["params"], control[i]) > 1e-3  # the dead counted: off
    assert len(started) == 4 and not _orphans(started)


@pytest.fixture
def started(monkeypatch):
    """The pids this test's run started (the forker and its replicas), caught where
    torchft_kill calls start_replicas: matching every process by its command line also caught
    another run's replicas (lesson 12's cell on the other pytest worker) as orphans in CI."""
    from syncedu.decentralized import torchft_kill

    pids: list[int] = []
    original = torchft_kill.start_replicas

    def recording(*args, **kwargs):
        forker, replicas = original(*args, **kwargs)
        pids.extend([forker.pid, *replicas])
        return forker, replicas

    monkeypatch.setattr(torchft_kill, "start_replicas", recording)
    return pids


def _orphans(pids: list[int], grace: float = 5.0) -> list[int]:
    """Those of `pids` still running after `grace` seconds (a SIGKILLed process can take a
    moment to go; a zombie has ended)."""
    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + grace
    while (left := [p for p in pids if alive(p)]) and time.time() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.skipif(available() is not None, reason="torchft is not importable here")
def test_a_dead_replica_never_dropped_times_out_without_orphans(started):
    """Negative control: a heartbeat timeout longer than the run's, so the lighthouse keeps
    waiting for the dead replica: the run must raise in time and leave no process behind."""
    from syncedu.decentralized import torchft_kill

    with pytest.raises(TimeoutError, match="every replica's end"):
        torchft_kill.run(heartbeat_ms=60_000, timeout=5)
    assert len(started) == 4 and not _orphans(started)


def test_dropping_changes_nothing_before_the_kill():
    """The witness's comm with a kill after every sync of the run is plain ours, bit for bit;
    with a kill it is not (sim only: no torchft needed)."""
    plain = sim.run(check.ours, 3, args=(check.JOB,))
    late = witness(3, 2, 4 * 99)
    early = witness(3, 2, 16)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(plain, late) for k in a)
    assert _diff(plain[0], early[0]) > 1e-3


@pytest.mark.parametrize("kw, name", [(dict(replicas=2), "replicas=2"), (dict(dead=3), "dead=3"),
                                      (dict(after=5), "after=5"), (dict(after=24), "after=24")])
def test_bad_arguments(kw, name):
    from syncedu.decentralized import torchft_kill

    pytest.importorskip("torchft")
    with pytest.raises(ValueError, match=name):
        torchft_kill.run(**kw)
