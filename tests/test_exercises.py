"""The exercise checkers accept right answers, reject wrong ones, and excuse stubs."""

from __future__ import annotations

import pytest
import torch

from syncedu.ui import exercises as ex

pytestmark = pytest.mark.real


def good_sum(comm):
    t = torch.tensor([float((comm.rank + 1) ** 2)])
    comm.all_reduce(t)
    return t.item()


def wrong_sum(comm):
    return float(comm.rank)


def stub(comm):
    raise NotImplementedError


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


def test_sum_of_squares_checker(capsys):
    assert ex.sum_of_squares.grade(good_sum)
    assert not ex.sum_of_squares.grade(wrong_sum)
    assert not ex.sum_of_squares.grade(stub)
    assert "not attempted yet" in capsys.readouterr().out


def test_ring_bytes_checker():
    assert ex.ring_bytes.grade(6000)
    assert not ex.ring_bytes.grade(8000)


def test_token_checker():
    assert ex.pass_the_token.grade(good_token)
    assert not ex.pass_the_token.grade(wrong_sum)


def test_checkers_print_and_return_none(capsys):
    assert ex.ring_bytes(6000) is None
    assert "correct" in capsys.readouterr().out
