"""Exercise 04.1 (the worker's push and pull): the checker accepts the library's step and
rejects the wrong answers a learner plausibly writes, naming the mistake."""

import pytest
import torch

from syncedu import ps
from syncedu.ps import exercises04 as ex
from syncedu.ps.worker import push_pull


def _push(comm, cfg, grad, loss, params, dst=lambda s, cfg: s, with_loss=True):
    for s, (lo, hi) in enumerate(ps.shard_ranges(params.numel(), cfg.servers)):
        msg = torch.cat([grad[lo:hi], torch.tensor([loss])]) if with_loss else grad[lo:hi].clone()
        comm.send(msg, cfg.server_rank(dst(s, cfg)), ps.PUSH_TAG)


def _pull(comm, cfg, params):
    for s, (lo, hi) in enumerate(ps.shard_ranges(params.numel(), cfg.servers)):
        comm.recv(params[lo:hi], cfg.server_rank(s), ps.PULL_TAG)


def blocking(comm, cfg, grad, loss, params, pull):  # a right answer with blocking sends
    _push(comm, cfg, grad, loss, params)
    if pull:
        _pull(comm, cfg, params)


def no_loss(comm, cfg, grad, loss, params, pull):
    _push(comm, cfg, grad, loss, params, with_loss=False)
    if pull:
        _pull(comm, cfg, params)


def swapped_servers(comm, cfg, grad, loss, params, pull):  # tied shard sizes: no size error
    _push(comm, cfg, grad, loss, params, dst=lambda s, cfg: cfg.servers - 1 - s)
    if pull:
        _pull(comm, cfg, params)


def pull_after_last(comm, cfg, grad, loss, params, pull):
    _push(comm, cfg, grad, loss, params)
    _pull(comm, cfg, params)


def pull_first(comm, cfg, grad, loss, params, pull):
    if pull:
        _pull(comm, cfg, params)
    _push(comm, cfg, grad, loss, params)


def pull_into_copy(comm, cfg, grad, loss, params, pull):
    blocking(comm, cfg, grad, loss, params.clone(), pull)


def server0_only(comm, cfg, grad, loss, params, pull):
    lo, hi = ps.shard_ranges(params.numel(), cfg.servers)[0]
    comm.send(torch.cat([grad[lo:hi], torch.tensor([loss])]), cfg.server_rank(0), ps.PUSH_TAG)
    if pull:
        _pull(comm, cfg, params)


@pytest.mark.parametrize("answer", [push_pull, blocking])
def test_right_answers_pass(answer):
    assert ex.push_pull.grade(answer)


@pytest.mark.parametrize("answer, words", [
    (no_loss, "wrong size"), (swapped_servers, "its own server"),
    (pull_after_last, "after the last step"), (pull_first, "push to every server first"),
    (pull_into_copy, "write the answers into `params`"), (server0_only, "waiting for a push")])
def test_wrong_answers_named(answer, words, capsys):
    assert not ex.push_pull.grade(answer)
    assert words in capsys.readouterr().out


def test_stub_is_not_attempted(capsys):
    def stub(*args):
        raise NotImplementedError

    assert not ex.push_pull.grade(stub)
    assert "not attempted yet" in capsys.readouterr().out


# ------------------------------------------------ Exercise 04.2 (the release rule)
@pytest.mark.parametrize("rule, words", [
    (lambda c, clocks, tau: c - clocks[0] <= tau, "expected False"),      # "worker 0 is slowest"
    (lambda c, clocks, tau: c - min(clocks) < tau, "expected True"),      # off by one
    (lambda c, clocks, tau: max(clocks) - min(clocks) <= tau, "expected True"),  # fastest, not me
    (lambda c, clocks, tau: True, "expected False")])                     # async
def test_ssp_rule_rejects_wrong_rules(rule, words, capsys):
    assert not ex.ssp_rule.grade(rule)
    out = capsys.readouterr().out
    assert "Exercise 2 (the bounded-staleness rule)" in out and words in out
    assert "min(clocks)" in out


def test_ssp_rule_accepts_the_rule():
    assert ex.ssp_rule.grade(lambda c, clocks, tau: c - min(clocks) <= tau)


def test_ingress_rejects_the_smallest_range(capsys):
    """Review 03-06 #5b: numel // servers is the smallest range; 8970 % 4 = 2, so S = 4 tells."""
    assert not ex.server_ingress.grade(lambda w, s, n: w * (n // s + 1) * 4)
    assert "server 0 owns the largest range" in capsys.readouterr().out
    assert ex.server_ingress.grade(lambda w, s, n: w * (-(-n // s) + 1) * 4)


def test_delay_counts_updates_missed():
    """Review 03-06 #1: delay = server version at apply - version pulled; sync has none, async
    about W - 1 for balanced workers, and the SSP clock gap stays within tau."""
    kw = dict(steps=6, global_batch=24, simulate=True, variability=0.5)
    assert max(ps.run("sync", 3, **kw).delay) == 0
    h = ps.run("async", 3, **kw)
    assert len(h.delay) == h.applied and 1 <= sum(h.delay) / len(h.delay) <= 3
    h = ps.run("ssp", 3, staleness=1, servers=2, **kw)
    assert max(h.staleness) <= 1 and max(h.delay) >= 2
