"""From-scratch per-step fault tolerance on simulated ranks (syncedu/faults/ft.py)."""

from __future__ import annotations

import pytest
import torch

from syncedu.faults import ft

RUN = dict(iterations=10, failures=(ft.Failure(1, 3, 2), ft.Failure(2, 6, 1)))
CFG = ft.FTConfig(replicas=3, **RUN)


def _equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_failed_steps_are_discarded_and_the_rest_equals_training_without_them():
    res = ft.run(4, simulate=True, **RUN)
    assert res.config == CFG
    leader = res.replicas[0]
    verdicts = [ok for _, _, ok in leader["log"]]
    assert verdicts == [True] * 3 + [False, True, True, False] + [True] * 3
    assert res.quorums[4] == [0, 2]  # replica 1 dropped from the quorum while down
    ref = ft.reference(CFG, ft.committed_steps(leader["log"]))
    for r in res.replicas:
        assert r["alive"] and r["step"] == 8
        assert _equal(r["params"], ref)  # bit-identical, the restarted ones included


def test_deterministic_and_heartbeat_on_the_logical_clock():
    a, b = ft.run(4, simulate=True, **RUN), ft.run(4, simulate=True, **RUN)
    assert a.seconds == b.seconds
    assert a.seconds == pytest.approx(10 * CFG.step_seconds + CFG.heartbeat_timeout)
    assert _equal(a.replicas[0]["params"], b.replicas[0]["params"])


def test_without_recovery_the_restarted_replica_would_differ():
    res = ft.run(4, simulate=True, **RUN)
    wrong = ft.reference(CFG, ft.committed_steps(res.replicas[0]["log"])[:-1])
    assert not _equal(res.replicas[1]["params"], wrong)


@pytest.mark.real
def test_real_processes_exchange_what_the_simulated_ranks_exchange():
    """The same protocol on 4 real processes (Gloo): the same quorums, commits, bytes and
    final parameters as on simulated ranks; the heartbeat timeout is slept for real."""
    quick = dict(RUN, heartbeat_timeout=0.5, step_seconds=0.01)  # slept for real: keep it short
    real, simulated = ft.run(4, **quick), ft.run(4, simulate=True, **quick)
    assert real.quorums == simulated.quorums
    assert [r["log"] for r in real.replicas] == [r["log"] for r in simulated.replicas]
    assert real.ledger.sent == simulated.ledger.sent
    for a, b in zip(real.replicas, simulated.replicas):
        torch.testing.assert_close(a["params"], b["params"], atol=1e-6, rtol=1e-6)
    assert real.seconds >= 0.5


@pytest.mark.parametrize("bad, name", [(dict(world_size=2), "world_size"),  # 1 replica
                                       (dict(world_size=4.0), "world_size"),
                                       (dict(world_size=True), "world_size"),
                                       (dict(lr="x"), "lr"), (dict(batch=2.5), "batch"),
                                       (dict(heartbeat_timeout=-1), "heartbeat_timeout"),
                                       (dict(failures=ft.Failure(1, 3)), "failures"),
                                       (dict(failures=[(1, 3, 2)]), "failures")])
def test_run_names_the_bad_argument_before_any_rank_starts(bad, name):
    with pytest.raises(ValueError, match=name):
        ft.run(**bad)


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
    with pytest.raises(ValueError, match="replica"):
        ft.Failure(1.5, 2)  # would never fire
