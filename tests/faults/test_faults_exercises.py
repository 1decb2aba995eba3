"""The lesson 11 checkers accept the right answers and reject the plausible wrong ones."""

from __future__ import annotations

import math

import torch

from syncedu.faults import exercises as ex
from syncedu.faults import ft
from syncedu.faults.join import join_allreduce


def test_join_shadow_accepts_ours(capsys):
    assert ex.join_shadow.grade(join_allreduce)
    assert "correct" in capsys.readouterr().out


def _divide_by_world(comm, params, has_data):
    n = join_allreduce(comm, params, has_data)
    for p in params:
        if n and p.grad is not None:
            p.grad *= n / comm.world_size
    return n


def _skip_when_done(comm, params, has_data):
    if not has_data:
        return 0  # stops answering its peers
    return join_allreduce(comm, params, has_data)


def _no_count(comm, params, has_data):
    join_allreduce(comm, params, has_data)
    return comm.world_size


def test_join_shadow_rejects_wrong_answers(capsys):
    assert not ex.join_shadow.grade(_divide_by_world)
    assert "differ" in capsys.readouterr().out
    assert not ex.join_shadow.grade(_skip_when_done)
    assert "deadlock" in capsys.readouterr().out
    assert not ex.join_shadow.grade(_no_count)
    assert "active-rank counts" in capsys.readouterr().out


def test_join_shadow_not_attempted(capsys):
    def stub(comm, params, has_data):
        raise NotImplementedError
    assert not ex.join_shadow.grade(stub)
    assert "not attempted" in capsys.readouterr().out


def test_commit_rule():
    assert ex.commit_rule.grade(ft.should_commit)  # the rule ft.py's leader applies
    assert not ex.commit_rule.grade(lambda m, s: bool(s))  # any success
    assert not ex.commit_rule.grade(lambda m, s: len(s & set(m)) > len(m) / 2)  # majority
    assert not ex.commit_rule.grade(lambda m, s: len(s) >= len(m))  # as many as members
    assert not ex.commit_rule.grade(lambda m, s: set(m) <= s)  # commits an empty quorum
    assert not ex.commit_rule.grade(lambda m, s: True)


def test_checkpoint_interval(capsys):
    assert ex.checkpoint_interval.grade(lambda c, m: math.sqrt(2 * c * m))
    for wrong, says in ((lambda c, m: math.sqrt(c * m), "factor 2"),
                        (lambda c, m: 2 * c * m, "square root"),
                        (lambda c, m: math.sqrt(2 * c / m), "square root"),
                        (lambda c, m: m / 2, "square root")):
        capsys.readouterr()
        assert not ex.checkpoint_interval.grade(wrong)
        assert says in capsys.readouterr().out
    assert not ex.checkpoint_interval.grade(lambda c, m: None)
    assert torch.__version__  # torch imported: the checkers need it anyway
