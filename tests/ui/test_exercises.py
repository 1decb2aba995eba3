"""Lessons 04 and 06: the exercise checkers accept right answers, reject wrong ones, excuse stubs.

Lessons 00-02's checker tests are in tests/ui/test_exercises00.py and tests/collectives/.
"""

from __future__ import annotations

import torch


def stub_any(*args):
    raise NotImplementedError


# ------------------------------------------------ lesson 06 (simulated ranks)
def _bc(t, ref):
    return t.view(1, -1, *([1] * (ref.dim() - 2)))


def _syncbn_backward(comm, dy, xhat, invstd, weight, count, *, local=False, calls=1,
                     global_w=False, mean_w=False):
    """A learner's SyncBN backward, right by default, or with one classic mistake."""
    dims = [d for d in range(dy.dim()) if d != 1]
    c = dy.shape[1]
    sums = torch.cat([dy.sum(dims), (dy * xhat).sum(dims)])
    mine = sums.clone()
    if not local and calls == 1:
        comm.all_reduce(sums)
    elif not local:
        comm.all_reduce(sums[:c])
        comm.all_reduce(sums[c:])
    n = dy.numel() // c if local else count
    dx = _bc(weight * invstd, dy) * (dy - _bc(sums[:c], dy) / n - xhat * _bc(sums[c:], dy) / n)
    kept = sums / comm.world_size if mean_w else sums if global_w else mine
    return dx, kept[c:], kept[:c]


def test_lesson06_syncbn_backward_checker_names_the_mistake(capsys):
    from functools import partial

    from syncedu.syncbn import exercises06 as ex6

    assert ex6.syncbn_backward.grade(_syncbn_backward)
    assert "correct" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(partial(_syncbn_backward, local=True))
    assert "this rank's samples alone: all_reduce the two sums" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(partial(_syncbn_backward, calls=2))
    assert "2 communication calls" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(partial(_syncbn_backward, global_w=True))
    assert "leave dweight and dbias LOCAL" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(partial(_syncbn_backward, mean_w=True))
    assert "you averaged them over the ranks" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out


def test_lesson06_checkers(capsys):
    from syncedu.comm.ledger import ring_allreduce_elements as ring
    from syncedu.syncbn import exercises06 as ex6

    def stats(comm, x, wide=True):
        x = x.double() if wide else x
        c = x.shape[1]
        t = torch.cat([x.sum(0), (x * x).sum(0), torch.tensor([float(len(x))], dtype=x.dtype)])
        comm.all_reduce(t)
        mean = t[:c] / t[-1]
        return mean, t[c:2 * c] / t[-1] - mean * mean

    def local_stats(comm, x):  # no communication: each rank's own sums, wrong
        return x.sum(0), (x * x).sum(0)

    def good_avg(comm, model):
        for name, b in model.named_buffers():
            if "running" in name:
                comm.all_reduce(b, op="avg")

    bytes_ = 8 * sum(ring(2 * c + 1, 8, 0)[0] + ring(2 * c, 8, 0)[0] for c in (16, 32, 64))
    assert ex6.global_mean_var.grade(stats) and not ex6.global_mean_var.grade(local_stats)
    capsys.readouterr()
    assert not ex6.global_mean_var.grade(lambda comm, x: stats(comm, x, wide=False))
    assert "float32 data with mean 3000" in capsys.readouterr().out  # the cancellation
    assert ex6.step_bytes.grade(bytes_) and not ex6.step_bytes.grade(bytes_ // 2)
    def summed(comm, model):  # forgot to divide by the world size
        for name, b in model.named_buffers():
            if "running" in name:
                comm.all_reduce(b)

    def mean_only(comm, model):  # averaged running_mean, forgot running_var
        for name, b in model.named_buffers():
            if "running_mean" in name:
                comm.all_reduce(b, op="avg")

    def mean_of_means(comm, x):  # section 3's warning: the ranks hold different counts
        m = x.double().mean(0) if len(x) else torch.zeros(x.shape[1], dtype=torch.float64)
        v = x.double().var(0, unbiased=False) if len(x) else torch.zeros_like(m)
        t = torch.cat([m, v])
        comm.all_reduce(t, op="avg")
        return t[:len(m)], t[len(m):]

    assert ex6.average_running_stats.grade(good_avg)
    capsys.readouterr()
    assert not ex6.average_running_stats.grade(lambda comm, model: None)
    assert not ex6.average_running_stats.grade(summed)
    assert "sum over the 3 ranks: divide by world_size" in capsys.readouterr().out
    assert not ex6.average_running_stats.grade(mean_only)
    assert "running_var differ" in capsys.readouterr().out
    assert not ex6.global_mean_var.grade(mean_of_means)
    assert "a mean of the ranks' means" in capsys.readouterr().out
    assert not ex6.global_mean_var.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out


# ------------------------------------------------ lesson 04
def test_lesson04_checkers(capsys):
    from syncedu.ps import exercises04 as ex4

    assert ex4.ssp_rule.grade(lambda c, clocks, tau: c - min(clocks) <= tau)
    assert "Exercise 2 (the bounded-staleness rule): correct" in capsys.readouterr().out
    assert not ex4.ssp_rule.grade(lambda c, clocks, tau: c - min(clocks) < tau)
    assert "next_step=0, clocks=[0, 0, 1], tau=0: got False, expected True" \
        in capsys.readouterr().out
    assert ex4.server_ingress.grade(lambda w, s, n: w * (-(-n // s) + 1) * 4)
    assert not ex4.server_ingress.grade(lambda w, s, n: w * n * 4 // s)
    assert ex4.sync_update.grade(lambda s, g, lr: s - lr * sum(g) / len(g))
    capsys.readouterr()
    assert not ex4.sync_update.grade(lambda s, g, lr: s - lr * sum(g))
    assert "Quick check (the synchronous update): not yet right" in capsys.readouterr().out
    assert not ex4.ssp_rule.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out


# ------------------------------------------------ the shared helpers (ui/checkers.py)
def test_helpers_end_the_grading_with_false(capsys):
    """`answered`, `answered_number`, `refuse` and `not_attempted` end a `checker` with False
    after their message (issue 44: no `if not ok: return False` in each checker)."""
    from syncedu.ui.checkers import (
        answered,
        answered_number,
        checker,
        not_attempted,
        refuse,
        verdict,
    )

    @checker
    def grade(answer, then=None) -> bool:
        got = answered("Q", answer)
        if then is not None:
            then("Q")
        return verdict("Q", got == 3)

    assert grade.grade(lambda: 3) and "Q: correct" in capsys.readouterr().out
    assert grade(lambda: 3) is None  # the notebook form prints and returns None
    capsys.readouterr()
    assert not grade.grade(stub_any)
    assert "Q: not attempted yet" in capsys.readouterr().out
    assert not grade.grade(lambda: 3, then=lambda name: refuse(name, "a named mistake"))
    assert capsys.readouterr().out == "Q: not yet right - a named mistake\n"
    assert not grade.grade(lambda: 3, then=not_attempted)
    assert "not attempted yet" in capsys.readouterr().out
    assert checker(lambda a: answered_number("N", a) == 2).grade(2)
    assert not checker(lambda a: answered_number("N", a) == 2).grade("two")
    assert "answer with a number, got 'two'" in capsys.readouterr().out
    assert not checker(lambda a: answered_number("N", a) == 2).grade(None)
    assert "N: not attempted yet" in capsys.readouterr().out
