"""Uneven inputs: the hang, DDP's join, and our Join from scratch (syncedu/faults).

One `launch.Pool` of 3 ranks runs the hang and then the joins: the same
processes, so the test also shows that the hang broke only its own group.
"""

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


def test_hang_then_our_join_equals_ddps_join_on_the_same_ranks():
    before = _children()
    with launch.Pool(3, timeout=120, output="quiet") as pool:
        pids = pool.pids
        hung = pool.run(uneven.hang)
        assert hung[0]["what"] == "finished its 4 batches"
        for r in (1, 2):  # both wait in the 5th backward() for rank 0, for the 2 s timeout
            assert hung[r]["what"] == "backward() of batch 5 failed: Timed out waiting 2000ms"
            assert 1.9 < hung[r]["waited"] < 30
            assert "Timed out waiting 2000ms" in hung[r]["said"]
            assert "rank" not in hung[r]["said"].lower()  # Gloo's whole first line names nobody
        res = pool.run(uneven.joined)
        by = {flag: pool.run(uneven.join_gradient_norms, args=(flag,)) for flag in (True, False)}
        assert pool.pids == pids  # the same processes: the hang broke only its own group
    for r in range(3):
        out = res[r]
        assert out["steps"] == 7  # every rank leaves after the longest rank's batches
        for k, v in out["Join"].items():
            assert torch.equal(out["ours"][k], res[0]["ours"][k])  # equal copies everywhere
            torch.testing.assert_close(out["ours"][k], v, rtol=0, atol=1e-6)
            assert not torch.equal(v, out["init"][k])  # training moved every weight
        assert "after 4 batches" in out["thrown"]
    # divide_by_initial_world_size=True divides by 3 where False divides by the ranks still in:
    # rank 1 trains 7 steps, with 3, 3, 3, 3, 2, 1, 1 ranks in
    ratios = [a / b for a, b in zip(by[True][1], by[False][1])]
    assert len(ratios) == 7 and all(abs(q - n / 3) < 1e-5 for q, n in zip(ratios, (3, 3, 3, 3, 2, 1, 1)))
    assert _children() <= before  # no rank left behind


def test_distributed_sampler_shards_evenly():
    assert uneven.shards(10, 3, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    padded = uneven.shards(10, 3, drop_last=False)
    assert [len(s) for s in padded] == [4, 4, 4]
    assert sorted(i for s in padded for i in s) == [0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9]
