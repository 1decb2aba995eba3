"""From-scratch per-step fault tolerance on simulated ranks (syncedu/faults/ft.py)."""

from __future__ import annotations

import pytest
import torch

from syncedu.faults import ft

CFG = ft.FTConfig(replicas=3, iterations=10, failures=(ft.Failure(1, 3, 2), ft.Failure(2, 6, 1)))


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_failed_steps_are_discarded_and_the_rest_equals_training_without_them():
    res = ft.run(CFG)
    leader = res[1]
    verdicts = [ok for _, _, ok in leader["log"]]
    assert verdicts == [True] * 3 + [False, True, True, False] + [True] * 3
    assert res[0][4] == [0, 2]  # replica 1 dropped from the quorum while down
    ref = ft.reference(CFG, ft.committed_steps(leader["log"]))
    for r in res[1:]:
        assert r["alive"] and r["step"] == 8
        assert _equal(r["params"], ref)  # bit-identical, the restarted ones included


def test_deterministic_and_heartbeat_on_the_logical_clock():
    a, b = ft.run(CFG), ft.run(CFG)
    assert a.seconds == b.seconds
    assert a.seconds == pytest.approx(10 * CFG.step_seconds + CFG.heartbeat_timeout)
    assert _equal(a[1]["params"], b[1]["params"])


def test_without_recovery_the_restarted_replica_would_differ():
    res = ft.run(CFG)
    wrong = ft.reference(CFG, ft.committed_steps(res[1]["log"])[:-1])
    assert not _equal(res[2]["params"], wrong)


@pytest.mark.parametrize("bad", [dict(replicas=1), dict(iterations=0),
                                 dict(failures=(ft.Failure(5, 1),)),
                                 dict(replicas=2,
                                      failures=(ft.Failure(0, 1, 3), ft.Failure(1, 2, 3))),
                                 dict(failures=(ft.Failure(0, 1), ft.Failure(1, 1)))])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        ft.FTConfig(**bad)


def test_failure_rejects_bad_values():
    with pytest.raises(ValueError, match="down"):
        ft.Failure(0, 1, 0)
