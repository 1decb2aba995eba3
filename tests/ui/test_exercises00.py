"""Lesson 00's checkers reject the wrong answers a learner would plausibly write.

Each wrong answer is named with the words the checker's message must contain.
"""

from __future__ import annotations

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


def wrong_value(comm):
    """Wrong: returns its rank, no communication."""
    return float(comm.rank)


def hard_coded_three(comm):
    """Wrong: the answer for 3 ranks, whatever the world size (the all_reduce made)."""
    comm.all_reduce(torch.tensor([float((comm.rank + 1) ** 2)]))
    return 14.0


def stub(comm):
    raise NotImplementedError


def test_sum_of_squares_rejects_closed_forms(capsys):
    assert ex.sum_of_squares.grade(good_sum)
    assert "correct" in capsys.readouterr().out
    for answer, words in [(closed_form_dummy, "let the collective do the sum"),
                          (closed_form_unused, "not a closed formula"),
                          (two_reduces, "exactly one comm.all_reduce"),
                          (wrong_value, "expected 1 on each"),
                          (hard_coded_three, "with 1 ranks got [14.0], expected 1"),
                          (stub, "not attempted yet")]:
        assert not ex.sum_of_squares.grade(answer), answer.__name__
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)


def good_token(comm, t=None):
    t = torch.zeros(1) if t is None else t
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
    for answer, words in [(token_rank0_formula, "send to rank 0 (tag 0, 4 bytes > eager_limit 0)"),
                          (token_backwards_formula, "the token goes round the ring")]:
        assert not ex.pass_the_token.grade(answer), answer.__name__
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)


def token_before_adding(comm):
    """Wrong: each rank returns the token as it arrived, before adding its rank."""
    t = torch.zeros(1)
    n, r = comm.world_size, comm.rank
    if r == 0:
        comm.send(t, dst=1)
        comm.recv(t, src=n - 1)
        return t.item()
    comm.recv(t, src=r - 1)
    seen = t.item()
    t += r
    comm.send(t, dst=(r + 1) % n)
    return seen


def token_everyone_waits(comm):
    """Wrong: every rank receives first, rank 0 too: nobody ever sends."""
    t = torch.zeros(1)
    comm.recv(t, src=(comm.rank - 1) % comm.world_size)
    comm.send(t + comm.rank, dst=(comm.rank + 1) % comm.world_size)
    return t.item()


def token_twice(comm):
    """Wrong: right values, but rank 0 sends an extra message (one per rank is the rule)."""
    value = good_token(comm)
    if comm.rank == 0:
        comm.send(torch.zeros(1), dst=1)
    elif comm.rank == 1:
        comm.recv(torch.zeros(1), src=0)
    return value


def token_by_formula(comm):
    """Wrong: the ring pass made, but each rank ignores the token's value and sends (and
    returns) the r(r+1)/2 it computes itself; rank 0 returns n(n-1)/2."""
    n, r = comm.world_size, comm.rank
    t = torch.zeros(1)
    if r == 0:
        comm.send(t, dst=1)
        comm.recv(t, src=n - 1)
        return float(n * (n - 1) // 2)
    comm.recv(t, src=r - 1)
    comm.send(torch.tensor([float(r * (r + 1) // 2)]), dst=(r + 1) % n)
    return float(r * (r + 1) // 2)


def good_token_posted(comm):
    """Right: the same ring with irecv/isend and wait (the marked run must accept it)."""
    t = torch.zeros(1)
    n, r = comm.world_size, comm.rank
    if r == 0:
        comm.isend(t, dst=1).wait()
        comm.irecv(t, src=n - 1).wait()
    else:
        comm.irecv(t, src=r - 1).wait()
        t += r
        comm.isend(t, dst=(r + 1) % n).wait()
    return t.item()


def test_token_checker_rejects_a_formula_that_ignores_the_token(capsys):
    assert ex.pass_the_token.grade(good_token_posted)
    assert not ex.pass_the_token.grade(token_by_formula)
    out = capsys.readouterr().out
    assert "when rank 1's recv adds 1000" in out and "do not compute r(r+1)/2" in out, out


def test_token_checker_names_the_mistake(capsys):
    cases = [(token_before_adding, "rank 1 returned 0, expected 1: it returned the token before"),
             (token_everyone_waits, "the ranks deadlock (rank 0: recv from rank 1"),
             (token_twice, "each rank sends exactly one"),
             (wrong_value, "with 2 ranks rank 0 returned 0, expected 1"),
             (stub, "not attempted yet")]
    for answer, words in cases:
        assert not ex.pass_the_token.grade(answer), answer.__name__
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)


def test_ring_bytes_quick_check(capsys):
    assert ex.ring_bytes(6000) is None  # a checker prints its verdict and returns None
    assert "correct" in capsys.readouterr().out
    for wrong in (8000, 4000, 1500):  # the whole tensor twice; one phase; chunks, not bytes
        assert not ex.ring_bytes.grade(wrong)
        assert "count the chunks" in capsys.readouterr().out


def int_sum(comm):
    """Right: the sum of squares in an int64 tensor (the checker's mark must not refuse it)."""
    t = torch.tensor([(comm.rank + 1) ** 2])
    comm.all_reduce(t)
    return t.item()


def int_token(comm):
    """Right: the token as `torch.tensor([0])`, an int64 tensor holding 0."""
    return good_token(comm, torch.tensor([0]))


def int_closed_form(comm):
    """Wrong: int64 contribution all-reduced, the answer by formula."""
    n = comm.world_size
    comm.all_reduce(torch.tensor([(comm.rank + 1) ** 2]))
    return n * (n + 1) * (2 * n + 1) // 6


def int_token_by_formula(comm):
    """Wrong: int64 ring pass made, values computed as r(r+1)/2."""
    n, r = comm.world_size, comm.rank
    t = torch.tensor([0])
    if r == 0:
        comm.send(t, dst=1)
        comm.recv(t, src=n - 1)
        return n * (n - 1) // 2
    comm.recv(t, src=r - 1)
    comm.send(torch.tensor([r * (r + 1) // 2]), dst=(r + 1) % n)
    return r * (r + 1) // 2


def test_integer_tensor_answers(capsys):
    """r0002 item 8: int64 answers are graded like float ones, right and wrong alike."""
    assert ex.sum_of_squares.grade(int_sum)
    assert ex.pass_the_token.grade(int_token)
    assert "correct" in capsys.readouterr().out
    assert not ex.sum_of_squares.grade(int_closed_form)
    assert "not a closed formula" in capsys.readouterr().out
    assert not ex.pass_the_token.grade(int_token_by_formula)
    assert "do not compute r(r+1)/2" in capsys.readouterr().out
