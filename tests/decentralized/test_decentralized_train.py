"""Lesson 12's strategies through train.run, and streaming DiLoCo against torchft's DiLoCo."""

import pytest
import torch

from syncedu import sim, train
from syncedu.decentralized import StreamingConfig, StreamingDiLoCo
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


def _sent_per_sync(comm, fragments, steps=12):
    """Bytes the comm's ledger saw this rank send for each fragment sync, then at `finish`
    (read when a sync completes: its allreduce, started `delay` steps before, is charged by
    then, at whichever step the simulator resolved it)."""
    model = train.models.make("mlp")
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    algo = StreamingDiLoCo(model, comm, inner, inner_steps=6, fragments=fragments,
                           config=StreamingConfig(delay=1 if fragments > 1 else 0))
    g, out, last = torch.Generator().manual_seed(comm.rank), [], comm.ledger.sent  # past broadcast
    for step in range(steps + 1):
        if step == steps:
            algo.finish()
        else:
            model(torch.randn(8, 64, generator=g)).square().mean().backward()
            inner.step()
            inner.zero_grad()
            if not algo.after_step():
                continue
        out.append(comm.ledger.sent - last)
        last = comm.ledger.sent
    return out


def test_streaming_bytes_per_sync_from_the_ledger():
    # 2 ranks: a ring allreduce sends 2(N-1)/N = 1 x the fragment; the MLP's layers in fp32
    s0, s1, s2 = (4 * (64 * 64 + 64),) * 2 + (4 * (64 * 10 + 10),)
    for rank in range(2):
        one, three = (sim.run(_sent_per_sync, 2, args=(f,))[rank] for f in (1, 3))
        assert one == [s0 + s1 + s2] * 2 + [0]  # every H = 6 steps; nothing left to finish
        # fragments in turn every H/F = 2 steps: a peak of the largest, the same total;
        # finish() syncs fragments 0 and 1, which hold local steps since their last sync
        assert three == [s0, s1, s2] * 2 + [s0 + s1]
    h = train.run("streaming_diloco", 2, inner_steps=6, fragments=3,
                  strategy_config=StreamingConfig(delay=1), **RUN)
    assert h.ledger.ops["all_reduce"].sent == [sum(three)] * 2  # the harness's own ledger


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
