"""Lesson 10's helpers: the explorer's time model against DDP and a simulated FullyShard, and
the working set at scale (review-09-10, items 1-3); the DP row of the time model against
bucketed DDP simulated (issue 43 c, review 09-10 item 6)."""

import matplotlib
import pytest
import torch
from torch import nn

from syncedu import Network, sim, train
from syncedu.dp import timeline
from syncedu.train import memory
from syncedu.train.layer_compute import LayerCompute
from syncedu.zero import lesson10
from syncedu.zero.fully_shard import FullyShard

matplotlib.use("Agg")


def test_explorer_defaults_show_ddp_hiding_its_allreduce():
    # The old explorer had DP without overlap: 1.5x the bytes looked 1.6x faster than DDP.
    kwargs = lesson10.zero_explorer().values()
    _, _, out = lesson10._view(**kwargs)
    t, compute = out["times"], 3 * 2 * kwargs["params_b"] * 1e9 * kwargs["tokens"] / lesson10.FLOPS
    assert compute < t["dp"] < 1.02 * compute  # DDP: all but the last layer's allreduce hidden
    assert t["dp"] <= t["zero3_prefetch"] < t["zero3"] and t["zero1"] == t["zero2"] > t["dp"]
    assert out["working_gb"] == pytest.approx(1.40625)  # 3 fp16 layers of 7.5B / 32


def test_overlapped_dp_is_the_closed_form_of_a_per_layer_bucket_chain():
    # Layer l's allreduce c starts at max(ready_l, previous end): the chain ends at
    # F + max(2F + c, 2F/L + L c), derived by hand against `schedule`'s event loop.
    net, psi, n = Network.preset("ethernet_100g"), 7.5e9, 64
    for layers, fwd in ((32, 0.3), (8, 0.05), (64, 2.0)):
        c = timeline.collective_time("all_reduce", 2 * psi / layers, n, net, itemsize=2)
        want = fwd + max(2 * fwd + c, 2 * fwd / layers + layers * c)
        got = timeline.zero_step_time("dp", psi, layers, n, net, fwd, overlap=True)
        assert got == pytest.approx(want, rel=1e-12)
        assert got <= timeline.zero_step_time("dp", psi, layers, n, net, fwd)


@pytest.mark.parametrize("link", [Network(latency=1e-6, bandwidth=1e10),
                                  Network(latency=1e-5, bandwidth=3e7)])
def test_simulated_bucketed_ddp_is_the_dp_overlap_model(link):
    # Lesson 10's witness of its DDP baseline: one 16,640-byte bucket per Linear(64, 64) layer,
    # each allreduce started as its gradients are ready, against zero_step_time("dp", overlap).
    psi = 4 * (64 * 64 + 64)  # the four layers' parameters, also one layer's fp32 bytes
    h = train.run("bucketed", 4, steps=2, global_batch=16, lr=0.01, simulate=True, network=link,
                  model_kwargs={"hidden": 64, "classes": 64, "depth": 3}, compute_seconds=3e-3,
                  bucket_cap_mb=(64 * 64 + 64) * 4 / 2**20)
    seconds = max(sum(s) for s in h.rank_step_seconds) / 2
    model = timeline.zero_step_time("dp", psi, 4, 4, link, 1e-3, itemsize=4, overlap=True)
    assert seconds == pytest.approx(model, rel=1e-9)
    assert seconds <= timeline.zero_step_time("dp", psi, 4, 4, link, 1e-3, itemsize=4)


def _fully_shard_step(comm, depth, forward_seconds, prefetch):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(depth)])
    charge = LayerCompute(model, comm, 3 * forward_seconds)  # built before sharding
    fs = FullyShard(model, comm, shard=(nn.Linear,), prefetch=prefetch)
    charge.attach()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(comm.rank), requires_grad=True)
    seconds = []
    for _ in range(2):  # the first forward records the order the second prefetches in
        comm.barrier()
        start = comm.now()
        fs(x).square().mean().backward()
        fs.finish_gradient_synchronization()
        seconds.append(comm.now() - start)
    return seconds, fs.peak_gathered_bytes


@pytest.mark.parametrize("n", [2, 4, 8])
def test_simulated_fully_shard_is_the_zero3_model_with_and_without_prefetch(n):
    # Per-parameter shards split every layer N ways: the model's even split, as in lesson 10;
    # prefetching, the model's max(compute, communication) per layer and one more layer held.
    layer = 4 * (64 * 64 + 64)
    for link in (Network(latency=10e-6, bandwidth=1e10), Network(latency=1e-5, bandwidth=3e7)):
        for prefetch, mode in ((False, "zero3"), (True, "zero3_prefetch")):
            res = sim.run(_fully_shard_step, n, args=(4, 1e-3, prefetch), network=link,
                          output="quiet")
            model = timeline.zero_step_time(mode, 4 * (64 * 64 + 64), 4, n, link, 1e-3, itemsize=4)
            assert max(r[0][1] for r in res) == pytest.approx(model, rel=1e-9)
            assert {r[1] for r in res} == {(1 + prefetch) * layer}
            no_order = timeline.zero_step_time("zero3", 4 * (64 * 64 + 64), 4, n, link, 1e-3,
                                               itemsize=4)
            assert max(r[0][0] for r in res) <= no_order * (1 + 1e-9)  # the first step: not worse


def test_working_set_does_not_shrink_with_n_and_names_its_parameter():
    ws = memory.working_set_bytes(7.5e9, 32, 3)
    assert ws == 3 * 2 * 7.5e9 / 32 and memory.working_set_bytes(7.5e9, 32, 1) == 0
    assert memory.working_set_bytes(7.5e9, 32, 3, prefetch=False) == 2 * 2 * 7.5e9 / 32
    assert ws > memory.bytes_per_rank(7.5e9, 256, 3)["total"]
    # Equal at N = 85.3: the working set outweighs the sharded state from N = 86 on (lesson 10
    # cell 7 once said 85, where the state, 1.412 GB, is still the larger).
    state = [memory.bytes_per_rank(7.5e9, n, 3)["total"] for n in (85, 86)]
    assert state[1] < ws < state[0]
    with pytest.raises(ValueError, match="layers"):
        memory.working_set_bytes(7.5e9, 0, 3)
