"""Lesson 12's strategies through train.run, and streaming DiLoCo against torchft's DiLoCo."""

import pytest
import torch

from syncedu import Network, sim, train
from syncedu.decentralized import StreamingConfig
from syncedu.faults.torchft_run import available
from syncedu.tuning.diloco import DiLoCoConfig

RUN = dict(steps=12, global_batch=64, simulate=True)


def test_dpsgd_trains_and_gossips_only_with_neighbours():
    h = train.run("dpsgd", 8, topology="exponential", **RUN)
    assert h.loss[-1] < h.loss[0] and len(h.loss) == 12
    numel = sum(p.numel() for p in h.params.values())
    gossip = h.ledger.ops["send"].sent
    assert gossip == [12 * 3 * numel * 4] * 8  # 3 = log2(8) peers per round, 12 rounds
    ring = train.run("dpsgd", 8, topology="ring", **RUN)
    assert ring.ledger.ops["send"].sent == [12 * 2 * numel * 4] * 8


def test_dpsgd_complete_graph_equals_data_parallel():
    # complete W = exact mean after every step: with plain SGD that is DP on the global batch
    a = train.run("dpsgd", 4, topology="complete", **RUN)
    b = train.run("flat", 4, **RUN)
    assert a.max_param_diff(b) < 1e-5


def test_streaming_with_one_fragment_is_diloco():
    cfg = DiLoCoConfig(inner_steps=4)
    opt = dict(optimizer="adamw", lr=cfg.inner_lr, weight_decay=cfg.weight_decay)
    for steps in (16, 18):  # 18: the cut-short round is closed alike
        a = train.run("diloco", 2, strategy_config=cfg, **{**RUN, "steps": steps}, **opt)
        b = train.run("streaming_diloco", 2, inner_steps=4, fragments=1,
                      **{**RUN, "steps": steps}, **opt)
        assert a.max_param_diff(b) == 0.0


def test_streaming_peak_bytes_shrink_with_fragments():
    net = Network(latency=1e-3, bandwidth=1e8)
    one = train.run("streaming_diloco", 2, inner_steps=6, fragments=1, network=net, **RUN)
    three = train.run("streaming_diloco", 2, inner_steps=6, fragments=3, network=net,
                      strategy_config=StreamingConfig(delay=1), **RUN)
    peak = [max(b for _, _, b in h.extra["syncs"]) for h in (one, three)]
    assert peak[1] < peak[0] / 2  # the largest fragment of the 3 layers vs the whole model
    # the same bytes over the 12 steps (each fragment once per H steps); then the closing syncs
    assert sum(b for _, _, b in three.extra["syncs"][:6]) == sum(
        b for _, _, b in one.extra["syncs"][:2])
    assert [f for _, f, _ in three.extra["syncs"]] == [0, 1, 2, 0, 1, 2, 0, 1]


def test_bad_values_name_the_parameter():
    with pytest.raises(ValueError, match="topology='star'"):
        train.run("dpsgd", 4, topology="star", **RUN)
    with pytest.raises(ValueError, match="topology='torus'.*prime"):
        train.run("dpsgd", 7, topology="torus", steps=2, global_batch=14, simulate=True)
    with pytest.raises(ValueError, match="fragments=4 must be <= the model's 3 layers"):
        train.run("streaming_diloco", 2, inner_steps=4, fragments=4, **RUN)
    with pytest.raises(ValueError, match="inner_steps=0"):
        train.run("streaming_diloco", 2, inner_steps=0, **RUN)
    with pytest.raises(ValueError, match="delay=2"):
        train.run("streaming_diloco", 2, inner_steps=4, fragments=2,
                  strategy_config=StreamingConfig(delay=2), **RUN)
    with pytest.raises(ValueError, match="alpha"):
        StreamingConfig(alpha=1.5)


def test_dpsgd_real_ranks(pool4):
    h = train.run("dpsgd", 4, topology="ring", steps=6, global_batch=64, pool=pool4)
    s = train.run("dpsgd", 4, topology="ring", steps=6, global_batch=64, simulate=True)
    assert h.max_param_diff(s) < 1e-5  # the same gossip on real and simulated ranks


@pytest.mark.skipif(available() is not None, reason="torchft is not importable here")
def test_streaming_matches_torchft_bit_for_bit():
    from syncedu.decentralized import torchft_check

    r = torchft_check.compare()  # 2 fragments, H = 4, delay 1, alpha 0.5, 24 steps
    assert r["equal"] and r["max_diff"] == 0.0
    assert not r["control_equal"] and r["control_max_diff"] > 1e-3  # pseudo-gradient too late
    assert not all(torch.equal(x[k], y[k]) for x, y in [r["ours"]] for k in x)  # ranks differ
    simulated = sim.run(torchft_check.ours, 2, args=(torchft_check.JOB,))  # the notebook's
    assert all(torch.equal(a[k], b[k]) for a, b in zip(simulated, r["ours"]) for k in a)
