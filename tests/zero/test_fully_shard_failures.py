"""Issue 45, "nothing hangs": a rank that fails in the middle of a FullyShard step (the other
rank already waiting in that unit's all-gather) surfaces as the launcher's error naming it,
on simulated and on real (Gloo) ranks, well within the run's timeout."""

import time

import pytest
import torch
from torch import nn

from syncedu import launch
from syncedu.comm import sim
from syncedu.comm.errors import WorkerError
from syncedu.zero.fully_shard import FullyShard


def _fails_mid_gather(comm):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))

    def die(module, args):  # rank 1, before the second unit's gather: rank 0 is already in it
        if comm.rank == 1:
            raise RuntimeError("injected failure before the all-gather of unit 2")
    model[2].register_forward_pre_hook(die)  # before FullyShard's own pre-hook, so it runs first
    fs = FullyShard(model, comm, shard=(nn.Linear,), prefetch=False)
    fs(torch.ones(2, 6)).sum().backward()


def _check(err):
    assert isinstance(err, WorkerError) and err.rank == 1, err
    assert "rank 1 failed" in str(err) and "injected failure" in str(err)


def test_a_rank_failing_mid_gather_is_named_on_simulated_ranks():
    with pytest.raises(WorkerError) as info:
        sim.run(_fails_mid_gather, 2, output="quiet")
    _check(info.value)


@pytest.mark.real
def test_a_rank_failing_mid_gather_is_named_on_real_ranks():
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch.run(_fails_mid_gather, 2, timeout=60, output="quiet")
    _check(info.value)
    assert time.monotonic() - start < 55  # the failure, not the timeout, ended the run
