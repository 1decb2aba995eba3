"""Streaming DiLoCo under torchft's manager with a SIGKILLed replica (torchft_kill.py)."""

import signal
import time

import psutil
import pytest
import torch

from syncedu import sim
from syncedu.decentralized import torchft_check as check
from syncedu.faults.torchft_run import available

TOL = 1e-6  # stated before looking: a 3-way sum in another order, a few float32 ulps


def _diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.skipif(available() is not None, reason="torchft is not importable here")
@pytest.mark.parametrize("dead, after", [(2, 8), (0, 4)])
def test_kill_shrinks_the_quorum_and_survivors_match_ours(dead, after):
    from syncedu.decentralized import torchft_kill

    t0 = time.time()
    r = torchft_kill.run(3, dead, after)
    assert time.time() - t0 < 60
    assert r["exit"][dead] == -signal.SIGKILL  # the launcher's own count: who died, how
    alive = [i for i, code in enumerate(r["exit"]) if code == 0]
    assert alive == [i for i in range(3) if i != dead] == sorted(r["final"])
    for i in alive:  # the manager's quorum, step by step, against the launcher's count
        assert r["final"][i]["participants"] == [3] * after + [len(alive)] * (24 - after)
        assert _diff(r["final"][i]["params"], r["ours"][i]) < TOL  # the witness
        assert _diff(r["final"][i]["params"], r["control"][i]) > 1e-3  # the dead counted: off
    assert not _orphans()


def _orphans() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "syncedu.decentralized.torchft_kill" in " ".join(p.info["cmdline"] or [])]


@pytest.mark.skipif(available() is not None, reason="torchft is not importable here")
def test_a_dead_replica_never_dropped_times_out_without_orphans():
    """Negative control: a heartbeat timeout longer than the run's, so the lighthouse keeps
    waiting for the dead replica: the run must raise in time and leave no process behind."""
    from syncedu.decentralized import torchft_kill

    with pytest.raises(TimeoutError, match="every replica's end"):
        torchft_kill.run(heartbeat_ms=60_000, timeout=5)
    assert not _orphans()


def test_dropping_changes_nothing_before_the_kill():
    """The witness's comm with a kill after every sync of the run is plain ours, bit for bit;
    with a kill it is not (sim only: no torchft needed)."""
    from syncedu.decentralized.torchft_kill import Dropping

    plain = sim.run(check.ours, 3, args=(check.JOB,))
    late = sim.run(lambda c: check.ours(Dropping(c, 2, 99), check.JOB), 3)
    early = sim.run(lambda c: check.ours(Dropping(c, 2, 4), check.JOB), 3)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(plain, late) for k in a)
    assert _diff(plain[0], early[0]) > 1e-3


@pytest.mark.parametrize("kw, name", [(dict(replicas=2), "replicas=2"), (dict(dead=3), "dead=3"),
                                      (dict(after=5), "after=5"), (dict(after=24), "after=24")])
def test_bad_arguments(kw, name):
    from syncedu.decentralized import torchft_kill

    pytest.importorskip("torchft")
    with pytest.raises(ValueError, match=name):
        torchft_kill.run(**kw)
