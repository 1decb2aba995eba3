"""torchft for real: kill, discard, continue, recover; nothing beyond loopback; no orphans."""

from __future__ import annotations

import psutil
import pytest

from syncedu.faults import torchft_run

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(torchft_run.available() is not None,
                                 reason=str(torchft_run.available()))]


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_kill_discard_continue_recover_on_loopback_only(tmp_path):
    before = _children()
    result = torchft_run.run(folder=str(tmp_path))
    v = torchft_run.verdicts(result)
    for claim in ("discarded, parameters unchanged", "quorum shrank, survivor trained on",
                  "restarted replica healed from its peer", "final weights bit-identical",
                  "SIGKILLed (exit code -9)", "only 127.0.0.1 listening"):
        assert v[claim], claim
    # lighthouse + for each of 2 replicas: manager server, TCPStore, checkpoint server, Gloo
    assert len(result.listening) >= 5
    assert 0 < v["detect_s"] < 1.5 and 1.0 < v["shrink_s"] < 6.0 and v["recover_s"] < 3.0
    assert _children() <= before
    # the ledger, charged per logged step: 36 fp32 gradients, a ring of 2 sends them once; the
    # survivor is charged one allreduce more than replica 1, its discarded step
    together = [e for e in result.survivor["log"] if e["participants"] == 2]
    assert result.ledger.sent[0] == 144 * len(together) > 0
    assert result.ledger.sent[1] == result.ledger.sent[0] - 144
    assert result.seconds > v["shrink_s"]
    both = [sum(e["participants"] == 2 for e in log) for log in
            (result.survivor["log"], result.killed["log"] + result.restarted["log"])]
    assert both[0] - both[1] == 1  # the discarded step: the killed one never sent its gradients


@pytest.mark.parametrize("bad, name", [(dict(world_size=3), "world_size"),
                                       (dict(simulate=True), "simulate"),
                                       (dict(network=object()), "network"),
                                       (dict(kill_after=-1), "kill_after")])
def test_run_refuses_what_it_cannot_do_before_starting(bad, name):
    with pytest.raises(ValueError, match=name):
        torchft_run.run(**bad)


class _Manager:
    """torchft's Manager as replica_step uses it, with the commit decided by the test."""

    def __init__(self, commit: bool):
        self.commit, self.step = commit, 0

    def start_quorum(self):
        pass

    def current_step(self):
        return self.step

    def num_participants(self):
        return 2

    def allreduce(self, tensor):
        return type("Work", (), {"wait": lambda self: None})()

    def should_commit(self):
        self.step += self.commit  # as torchft's: a commit counts a step
        return self.commit


def _step(commit: bool, wrapped: bool) -> dict:
    import torch
    from torchft.optim import OptimizerWrapper

    manager, model = _Manager(commit), torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = OptimizerWrapper(manager, opt) if wrapped else opt
    return torchft_run.replica_step(manager, model, opt, 0, lambda step, n: False)


def test_torchfts_own_gate_keeps_a_discarded_step_unchanged():
    for commit in (True, False):
        e = _step(commit, wrapped=True)
        assert e["committed"] == commit and e["unchanged"] == (not commit), commit
    # the wrong answer: an optimizer stepped without torchft's gate on should_commit()
    e = _step(False, wrapped=False)
    assert not e["committed"] and not e["unchanged"], \
        "an optimizer not wrapped in OptimizerWrapper must change a discarded step"
