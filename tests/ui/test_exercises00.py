"""Lesson 00's checkers reject the wrong answers a learner would plausibly write.

Each wrong answer is named with the words the checker's message must contain.
"""

from __future__ import annotations

import pytest
import torch

from syncedu.ui import exercises00 as ex


def good_sum(comm):
    t = torch.tensor([float((comm.rank + 1) ** 2)])
    comm.all_reduce(t)
    return t.item()


def closed_form_dummy(comm):
    """Wrong: the formula, with the collective called on a dummy."""
    n = comm.world_size
    comm.all_reduce(torch.zeros(1))
    return float(n * (n + 1) * (2 * n + 1) // 6)


def closed_form_unused(comm):
    """Wrong: the right contribution all-reduced, but the answer computed by formula."""
    n = comm.world_size
    comm.all_reduce(torch.tensor([float((comm.rank + 1) ** 2)]))
    return float(n * (n + 1) * (2 * n + 1) // 6)


def two_reduces(comm):
    """Wrong: two all_reduces (sum of r+1, then of squares)."""
    comm.all_reduce(torch.ones(1))
    return good_sum(comm)


@pytest.mark.real
def test_sum_of_squares_rejects_closed_forms(capsys):
    assert ex.sum_of_squares.grade(good_sum)
    assert "correct" in capsys.readouterr().out
    for answer, words in [(closed_form_dummy, "let the collective do the sum"),
                          (closed_form_unused, "not a closed formula"),
                          (two_reduces, "exactly one comm.all_reduce")]:
        assert not ex.sum_of_squares.grade(answer), answer.__name__
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)


def good_token(comm):
    t = torch.zeros(1)
    n, r = comm.world_size, comm.rank
    if r == 0:
        comm.send(t, dst=1)
        comm.recv(t, src=n - 1)
    else:
        comm.recv(t, src=r - 1)
        t += r
        comm.send(t, dst=(r + 1) % n)
    return t.item()


def token_rank0_formula(comm):
    """Wrong: rank 0 returns the total by formula instead of receiving the token back."""
    t = torch.zeros(1)
    n, r = comm.world_size, comm.rank
    if r == 0:
        comm.send(t, dst=1)
        return float(n * (n - 1) // 2)
    comm.recv(t, src=r - 1)
    t += r
    if r < n - 1:
        comm.send(t, dst=r + 1)
    else:
        comm.send(t, dst=0)
    return t.item()


def token_backwards_formula(comm):
    """Wrong: one message in and one out per rank, but backwards, and the values by formula."""
    n, r = comm.world_size, comm.rank
    t = torch.zeros(1)
    if r == 0:
        comm.send(t, dst=n - 1)
        comm.recv(t, src=1)
        return float(n * (n - 1) // 2)
    comm.recv(t, src=(r + 1) % n)
    comm.send(t, dst=r - 1)
    return float(r * (r + 1) // 2)


def test_token_checker_rejects_shortcuts(capsys):
    assert ex.pass_the_token.grade(good_token)
    assert "correct" in capsys.readouterr().out
    for answer, words in [(token_rank0_formula, "each rank receives exactly one"),
                          (token_backwards_formula, "the token goes round the ring")]:
        assert not ex.pass_the_token.grade(answer), answer.__name__
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)
