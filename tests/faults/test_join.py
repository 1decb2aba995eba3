"""Uneven inputs: the hang, DDP's join, and our Join from scratch (syncedu/faults)."""

from __future__ import annotations

import psutil
import pytest
import torch

from syncedu import launch
from syncedu.faults import uneven

pytestmark = pytest.mark.timeout(240)


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


def test_plain_ddp_hangs_on_uneven_inputs_and_fails_after_the_timeout():
    before = _children()
    res = launch.run(uneven.hang, 3, timeout=60, output="quiet")
    assert res[0] == "finished its 4 batches"
    for r in (1, 2):  # both wait in the 5th backward() for rank 0, for the 2 s timeout
        assert res[r].startswith("backward() of batch 5 failed after")
        assert "Timed out waiting 2000ms" in res[r] and "rank 0" not in res[r].lower()
    assert _children() <= before  # no rank left behind


def test_the_ranks_live_on_after_the_hang():
    with launch.Pool(3, timeout=60, output="quiet") as pool:
        pids = pool.pids
        pool.run(uneven.hang)
        res = pool.run(uneven.joined)
        assert pool.pids == pids  # the same processes: the hang broke only its own group
        assert all(r["steps"] == 7 for r in res)


def test_our_join_equals_ddps_join_on_4_7_5_batches():
    res = launch.run(uneven.joined, 3, timeout=120, output="quiet")
    for r in range(3):
        out = res[r]
        assert out["steps"] == 7  # every rank leaves after the longest rank's batches
        for k, v in out["Join"].items():
            assert torch.equal(v, out["model.join"][k])
            assert torch.equal(out["ours"][k], res[0]["ours"][k])  # equal copies everywhere
            torch.testing.assert_close(out["ours"][k], v, rtol=0, atol=1e-6)
        assert "after 4 batches" in out["thrown"]


def test_distributed_sampler_shards_evenly():
    assert uneven.shards(10, 3, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    padded = uneven.shards(10, 3, drop_last=False)
    assert [len(s) for s in padded] == [4, 4, 4]
    assert sorted(i for s in padded for i in s) == [0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9]
