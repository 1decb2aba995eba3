"""The lesson 11 checkers accept the right answers and reject the plausible wrong ones."""

from __future__ import annotations

import math

import torch

from syncedu.faults import exercises as ex
from syncedu.faults import ft
from syncedu.faults import goodput as g
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


def _sum_only(comm, params, has_data):
    n = join_allreduce(comm, params, has_data)
    for p in params:
        if n and p.grad is not None:
            p.grad *= n  # forgot to divide
    return n


def _local_grads(comm, params, has_data):  # the collective carries only the count
    flag = torch.tensor([1.0 if has_data else 0.0])
    comm.all_reduce(flag)
    return int(flag.item())


def _done_rank_leaves_grad(comm, params, has_data):
    saved = [p.grad for p in params]
    n = join_allreduce(comm, params, has_data)
    if not has_data:
        for p, g in zip(params, saved):
            p.grad = g  # a done rank keeps no gradient: its copy drifts from the others
    return n


def _hardcoded_three(comm, params, has_data):  # counts the done ranks, assumes 3 ranks
    grads = [p.grad if has_data else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([0.0 if has_data else 1.0])])
    comm.all_reduce(flat)
    active = 3 - int(round(flat[-1].item()))
    if active:
        off = 0
        for p in params:
            p.grad = (flat[off:off + p.numel()] / active).view_as(p).clone()
            off += p.numel()
    return active


def _two_collectives(comm, params, has_data):  # right, in two all_reduces: accepted
    flag = torch.tensor([1.0 if has_data else 0.0])
    comm.all_reduce(flag)
    n = int(flag.item())
    for p in params:
        g = p.grad.clone() if has_data else torch.zeros_like(p)
        comm.all_reduce(g)
        if n:
            p.grad = g / n
    return n


def test_join_shadow_accepts_a_different_right_answer(capsys):
    assert ex.join_shadow.grade(_two_collectives)


def test_join_shadow_rejects_wrong_answers(capsys):
    for wrong, says in ((_divide_by_world, "divided by the world size"),
                        (_sum_only, "summed without dividing"),
                        (_skip_when_done, "deadlock"),
                        (_no_count, "active-rank counts"),
                        (_local_grads, "differ from Join's"),
                        (_done_rank_leaves_grad, "on every rank, done or not"),
                        (_hardcoded_three, "4 ranks with (3, 1, 4, 2) batches")):
        capsys.readouterr()
        assert not ex.join_shadow.grade(wrong), wrong.__name__
        assert says in capsys.readouterr().out, wrong.__name__


def test_join_shadow_not_attempted(capsys):
    def stub(comm, params, has_data):
        raise NotImplementedError
    assert not ex.join_shadow.grade(stub)
    assert "not attempted" in capsys.readouterr().out


def test_commit_rule(capsys):
    assert ex.commit_rule.grade(ft.should_commit)  # the rule ft.py's leader applies
    assert ex.commit_rule.grade(lambda m, s: len(m) > 0 and all(r in s for r in m))
    for wrong, says in ((lambda m, s: bool(s), "one failed member discards"),  # any success
                        (lambda m, s: len(s & set(m)) > len(m) / 2, "one failed member discards"),
                        (lambda m, s: set(m) <= s, "an empty quorum commits nothing"),
                        (lambda m, s: bool(m) and m[0] in s, "one failed member discards"),
                        (lambda m, s: True, "one failed member discards"),
                        (lambda m, s: False, "every member succeeded"),
                        # counts instead of membership: a non-member in `succeeded` fools it
                        (lambda m, s: len(m) > 0 and len(s) == len(m), "just dropped from the quorum"),
                        (lambda m, s: len(m) > 0 and len(s) >= len(m), "cannot stand in for it")):
        capsys.readouterr()
        assert not ex.commit_rule.grade(wrong)
        assert says in capsys.readouterr().out


def test_checkpoint_interval(capsys):
    assert ex.checkpoint_interval.grade(lambda c, m: math.sqrt(2 * c * m))
    for wrong, says in ((lambda c, m: math.sqrt(c * m), "factor 2"),
                        (lambda c, m: 2 * c * m, "square root"),
                        (lambda c, m: math.sqrt(2 * c / m), "square root"),
                        (lambda c, m: m / 2, "square root"),
                        (lambda c, m: math.sqrt(2 * c * m) / 60, "minutes"),
                        (g.daly_interval, "Daly")):
        capsys.readouterr()
        assert not ex.checkpoint_interval.grade(wrong)
        assert says in capsys.readouterr().out
    assert not ex.checkpoint_interval.grade(lambda c, m: None)
    assert torch.__version__  # torch imported: the checkers need it anyway


def test_checkpoint_interval_takes_any_real_but_no_nan_or_text(capsys):
    import numpy as np

    for right in (lambda c, m: np.float32(math.sqrt(2 * c * m)), lambda c, m: np.sqrt(2.0 * c * m),
                  lambda c, m: torch.tensor(2.0 * c * m, dtype=torch.float64).sqrt()):
        assert ex.checkpoint_interval.grade(right)
    for wrong in (lambda c, m: math.nan, lambda c, m: str(math.sqrt(2 * c * m)),
                  lambda c, m: True, lambda c, m: torch.ones(2),
                  lambda c, m: -math.sqrt(2 * c * m)):
        capsys.readouterr()
        assert not ex.checkpoint_interval.grade(wrong)
        assert "positive number of seconds" in capsys.readouterr().out
