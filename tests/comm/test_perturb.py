"""SYNCEDU_PERTURB: the test run's other thread counts and arrival orders (comm/perturb.py)."""

from __future__ import annotations

import pytest
import torch

from syncedu import launch
from syncedu.comm import perturb


def test_off_by_default(monkeypatch):
    monkeypatch.delenv(perturb.ENV, raising=False)
    assert perturb.seed() is None and perturb.threads(3, rank=1) == 3
    monkeypatch.setenv(perturb.ENV, "0")
    assert perturb.seed() is None


def test_bad_seed_names_the_variable(monkeypatch):
    monkeypatch.setenv(perturb.ENV, "yes")
    with pytest.raises(ValueError, match="SYNCEDU_PERTURB"):
        perturb.seed()


def test_threads_are_seeded_per_rank(monkeypatch):
    monkeypatch.setenv(perturb.ENV, "1")
    picks = [perturb.threads(8, rank=r) for r in range(16)]
    assert set(picks) == {1, 2}  # not the default, and not the same for every rank
    assert picks == [perturb.threads(8, rank=r) for r in range(16)]  # seeded


@pytest.mark.real
def test_real_ranks_are_perturbed_and_still_correct(monkeypatch):
    monkeypatch.setenv(perturb.ENV, "3")

    def worker(comm):
        t = torch.full((5,), float(comm.rank + 1))
        comm.all_reduce(t)
        wrapped = getattr(comm._all_reduce, "__wrapped__", None) is not None
        return torch.get_num_threads(), wrapped, t.tolist()

    res = launch.run(worker, 3, timeout=60, output="quiet")
    assert [r[0] for r in res] == [perturb.threads(1, r) for r in range(3)]
    assert all(r[1] for r in res)  # every rank waits a seeded moment before it sends
    assert all(r[2] == [6.0] * 5 for r in res)


@pytest.mark.real
def test_threads_asked_for_are_not_perturbed(monkeypatch):
    # Lesson 03 times real ranks on the wall clock; with the seeded 2 threads on one rank of a
    # loaded 2-core machine, its bucketed-vs-flat ratio swung from 0.66 to 1.08 within one run.
    monkeypatch.setenv(perturb.ENV, "1")
    assert [perturb.threads(1, r) for r in range(2)] == [2, 1]  # rank 0 would get 2

    def worker(comm):
        wrapped = getattr(comm._all_reduce, "__wrapped__", None) is not None
        return torch.get_num_threads(), wrapped

    with launch.Pool(2, threads=1, output="quiet") as pool:
        assert list(pool.run(worker, timeout=60)) == [(1, True), (1, True)]  # sends still wait
    assert [n for n, _ in launch.run(worker, 2, timeout=60, output="quiet")] == [2, 1]
