"""ZeRO stages 1-3 (zero/stages.py): equal to one process and to "flat" data
parallelism, 1x/1x/1.5x of its bytes, optimizer state 1/N per rank; torch's
ZeroRedundancyOptimizer and FSDP2 equal to DDP; train.run's "zero1".."zero3",
"zero_redundancy" and "fsdp2"."""

import pytest
import torch
import torch.nn.functional as F

from syncedu import train
from syncedu.comm import sim
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.dp import data_parallel as dp
from syncedu.train import models
from syncedu.train.memory import held_bytes
from syncedu.zero.shards import Layout, layer_units
from syncedu.zero.stages import ZeroConfig, ZeroDataParallel

STEPS, LR = 3, 0.05
OPTS = {"sgd": {"optimizer": "sgd", "momentum": 0.9}, "adam": {"optimizer": "adam"}}


def _model(**kwargs) -> torch.nn.Module:
    """Lesson 10's small MLP: 64 -> 13 -> 13 -> 10, 1,167 parameters (4 does not divide it)."""
    return models.make("mlp", seed=0, **{"hidden": 13, **kwargs})


def _batch(step: int, rank: int, size: int = 8):
    """Rank `rank`'s seeded batch for step `step` (64 features, 10 classes)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, 64, generator=g), torch.randint(0, 10, (size,), generator=g)


def _torch_optimizer(params, optimizer: str):
    """SGD with momentum 0.9 or Adam, at `LR` (as `OPTS` configures ours)."""
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=LR)
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def _simulate_step(stage: int, network, depth: int = 4, steps: int = 2) -> float:
    """Lesson 10's `simulate_step`: one step (the slowest rank's mean) of "zero{stage}" (0:
    "flat") on 4 simulated ranks, the MLP as `depth` Linear(64, 64) layers, 1 ms of forward."""
    h = train.run("flat" if stage == 0 else f"zero{stage}", 4, steps=steps, global_batch=16,
                  lr=0.01, simulate=True, network=network, compute_seconds=3e-3,
                  model_kwargs={"hidden": 64, "classes": 64, "depth": depth - 1})
    return max(sum(seconds) for seconds in h.rank_step_seconds) / steps


P = sum(p.numel() for p in _model().parameters())  # 1,167: 4 does not divide it


def _sent(comm) -> int:
    return sum(c.sent for c in comm.ledger.ops.values())


def _loop(comm, forward, opt, finish=lambda: None) -> None:
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(step, comm.rank)
        F.cross_entropy(forward(x), y).backward()
        finish()
        opt.step()


def _zero_worker(comm, stage, opt, **kw):
    z = ZeroDataParallel(_model(**kw), comm, stage=stage, lr=LR, **OPTS[opt])
    comm.ledger.reset()  # the start-up broadcast is not a training step's traffic
    _loop(comm, z, z, z.finish_gradient_synchronization)
    sent = _sent(comm)
    return z.full_parameters(), sent, dict(z.memory.peak)


def _flat_worker(comm, opt):
    net = _model()
    wrapped = dp.DataParallel(net, comm, "flat")
    comm.ledger.reset()
    _loop(comm, wrapped, _torch_optimizer(net.parameters(), opt),
          wrapped.finish_gradient_synchronization)
    return {k: p.detach().clone() for k, p in net.named_parameters()}, _sent(comm)


def _one_process(n, opt):
    net = _model()
    optim = _torch_optimizer(net.parameters(), opt)
    for step in range(STEPS):
        optim.zero_grad()
        xs, ys = zip(*[_batch(step, r) for r in range(n)])
        F.cross_entropy(net(torch.cat(xs)), torch.cat(ys)).backward()
        optim.step()
    return dict(net.named_parameters())


# ---------------------------------------------------------------- layout
def test_layout_cuts_as_the_ring_does():
    layout = Layout(10, 4)
    assert layout.sizes == [3, 3, 2, 2]
    # A layer at [2, 7) of the buffer: its pieces on ranks 0..3 (rank 3's is empty).
    assert layout.ranges(2, 7) == [(2, 3), (3, 6), (6, 7), (8, 8)]
    assert [p.tolist() for p in layout.pieces(torch.arange(2.0, 7.0), 2)] == \
        [[2.0], [3.0, 4.0, 5.0], [6.0], []]
    buf = torch.arange(12.0)
    assert held_bytes([buf[:3], buf[3:], buf, None, torch.empty(0)]) == 48  # one storage


# ---------------------------------------------------------- correctness
@pytest.mark.parametrize("opt", ["sgd", "adam"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_stage_equals_one_process_and_flat_simulated(stage, opt):
    for n in (2, 3):
        want = _one_process(n, opt)
        flat = sim.run(_flat_worker, n, args=(opt,))
        res = sim.run(_zero_worker, n, args=(stage, opt))
        for r in range(n):
            assert _max_diff(res[r][0], want) < 1e-5
            assert _max_diff(res[r][0], flat[0][0]) < 1e-5


def test_world_size_one_and_four():
    for n in (1, 4):
        flat = sim.run(_flat_worker, n, args=("adam",))
        for stage in (1, 2, 3):
            res = sim.run(_zero_worker, n, args=(stage, "adam"))
            # The same sums in the same order as "flat": equal to the last bit.
            assert _max_diff(res[0][0], flat[0][0]) == 0.0
            # Adam divides by sqrt(v): gradients that nearly cancel magnify the rounding
            # of a different summation order (one process on the whole batch).
            assert _max_diff(res[0][0], _one_process(n, "adam")) < 1e-4


def test_stages_on_two_real_ranks(pool2):
    for opt, stages in (("sgd", [2]), ("adam", [1, 3])):
        want = _one_process(2, opt)
        for stage in stages:
            res = pool2.run(_zero_worker, args=(stage, opt), timeout=60)
            assert _max_diff(res[0][0], want) < 1e-5, (stage, opt)
            assert torch.equal(res[0][0]["net.0.weight"], res[1][0]["net.0.weight"])


# ---------------------------------------------------------------- bytes
def test_bytes_are_1x_1x_1_5x_of_data_parallelism():
    for n in (2, 3, 4):
        dp_sent = sim.run(_flat_worker, n, args=("sgd",)).ledger.sent
        # "flat" sends one ring allreduce of all P floats per step, as the ledger charges it.
        assert dp_sent == [4 * STEPS * ring_allreduce_elements(P, n, r)[0] for r in range(n)]
        sent = {s: [res[1] for res in sim.run(_zero_worker, n, args=(s, "sgd"))]
                for s in (1, 2, 3)}
        assert sent[1] == dp_sent  # one unit, no padding: exactly the allreduce's bytes per rank
        assert sum(sent[2]) == sum(dp_sent)  # per layer: the same total, split differently
        assert 2 * sum(sent[3]) == 3 * sum(dp_sent)  # a second all-gather: 1.5x


# --------------------------------------------------------------- memory
def test_optimizer_state_falls_as_one_over_n():
    for opt, per_param, extra in (("sgd", 4, 0), ("adam", 8, 4)):  # Adam: m, v and a step
        for stage in (1, 2, 3):
            for n in (1, 2, 4):
                res = sim.run(_zero_worker, n, args=(stage, opt))
                most = max(r[2]["optimizer"] for r in res)
                assert most == per_param * -(-P // n) + extra, (opt, stage, n)


def test_stages_shrink_gradients_then_parameters():
    kw = {"hidden": 64, "depth": 6}  # seven layers, six of 4,160 parameters: each a small part
    peak = {s: sim.run(_zero_worker, 4, args=(s, "adam"), kwargs=kw)[0][2]
            for s in (1, 2, 3)}
    whole = 4 * sum(p.numel() for p in _model(**kw).parameters())
    assert peak[1]["params"] == peak[2]["params"] == whole
    assert peak[1]["grads"] == whole
    assert peak[2]["grads"] < 0.5 * whole  # a quarter, plus the layer in flight
    assert peak[3]["params"] < 0.5 * whole
    assert peak[1]["optimizer"] == peak[2]["optimizer"] == peak[3]["optimizer"]


def _saved_bytes(comm, stage):
    """Bytes of the distinct storages autograd keeps after one forward (our stage 3, or the
    plain model without its parameters' storages), and stage 3's gradients with every
    all-gather after the forward (the backward's) filled with NaN."""
    model = _model(hidden=64, depth=3)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    wrapped = model if stage == 0 else ZeroDataParallel(model, comm, stage=stage)
    saved = []
    x, y = _batch(0, comm.rank)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss = F.cross_entropy(wrapped(x), y)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved
                if stage or t.untyped_storage().data_ptr() not in weights}
    if stage == 0:
        return sum(storages.values()), None
    real, poisoned = wrapped.gather, []

    def poison(u):  # the backward's gathers: are they what autograd reads?
        if not u.gathered:
            real(u)
            u.flat.fill_(float("nan"))
            poisoned.append(u.name)

    wrapped.gather = poison  # this rank's wrapper only (simulated ranks share the module)
    loss.backward()
    return sum(storages.values()), (len(poisoned), wrapped.shard.grad.isnan().any().item())


def test_stage3_frees_what_autograd_saved_and_backward_reads_its_gathers():
    # After forward, stage 3 holds no whole weight, not even the views autograd saved:
    # what autograd keeps is the activations, as for the plain model without its weights.
    plain = sim.run(_saved_bytes, 2, args=(0,))[0][0]
    res = sim.run(_saved_bytes, 2, args=(3,))
    assert [r[0] for r in res] == [plain, plain]
    # The backward re-gathers every layer, and its gradients come from those gathers.
    layers = len(layer_units(_model(hidden=64, depth=3)))
    assert layers == 4 and [r[1] for r in res] == [(layers, True)] * 2


# ------------------------------------------------------------ bad input
@pytest.mark.parametrize("field,value", [("stage", 4), ("optimizer", "lamb"),
                                         ("momentum", 1.5), ("lr", 0.0)])
def test_bad_config_names_the_parameter(field, value):
    with pytest.raises(ValueError, match=f"{field}="):
        ZeroConfig(**{field: value})


def test_train_run_rejects_unknown_stage_and_optimizer():
    with pytest.raises(ValueError, match="strategy="):
        train.run("zero4", 2, steps=1, global_batch=8, simulate=True)
    with pytest.raises(ValueError, match="optimizer="):
        train.run("zero2", 2, steps=1, global_batch=8, simulate=True, optimizer="lamb")


# ------------------------------------------------------------- train.run
@pytest.mark.parametrize("opt,momentum,acc", [("sgd", 0.9, 2), ("adam", 0.0, 1)])
def test_train_run_zero_equals_flat_simulated(opt, momentum, acc):
    kw = dict(steps=4, global_batch=48, optimizer=opt, momentum=momentum, lr=0.05,
              simulate=True, accumulation=acc)
    flat = train.run("flat", 3, **kw)
    for stage in ("zero1", "zero2", "zero3"):
        h = train.run(stage, 3, **kw)
        assert h.max_param_diff(flat) < 1e-5, stage
        assert abs(h.loss[-1] - flat.loss[-1]) < 1e-5


def test_train_run_charges_modeled_compute_at_every_stage():
    # Stage 3 frees the parameters as it wraps: the compute must still be charged per layer.
    kw = dict(steps=2, global_batch=16, simulate=True, compute_seconds=0.01)
    assert train.run("flat", 2, **kw).sim_seconds == pytest.approx(0.02)
    for stage in ("zero1", "zero2", "zero3"):
        assert train.run(stage, 2, **kw).sim_seconds >= 0.02, stage


def test_train_run_zero3_cnn_with_batchnorm_equals_flat():
    kw = dict(steps=2, global_batch=24, model="cnn", optimizer="adam", simulate=True)
    flat = train.run("flat", 3, **kw)
    assert train.run("zero3", 3, **kw).max_param_diff(flat) == 0.0


def test_train_run_history_reports_model_state_per_rank():
    kw = dict(steps=2, global_batch=32, optimizer="adam", simulate=True)
    flat = train.run("flat", 4, **kw).model_state_bytes
    peaks = {s: train.run(s, 4, **kw).model_state_bytes for s in ("zero1", "zero2", "zero3")}
    assert len(flat) == 4 and all(len(p) == 4 for p in peaks.values())
    for r in range(4):  # Adam's m and v: a quarter per rank (plus one step counter)
        assert peaks["zero1"][r]["optimizer"] <= (flat[r]["optimizer"] - 4 * 6) / 4 + 8
        assert peaks["zero3"][r]["total"] < peaks["zero2"][r]["total"] < \
            peaks["zero1"][r]["total"] < flat[r]["total"]


def test_train_run_zero_on_two_real_ranks(pool2):
    kw = dict(steps=3, global_batch=32, optimizer="adam", lr=0.05)
    flat = train.run("flat", 2, pool=pool2, **kw)
    for stage in ("zero1", "zero3"):
        assert train.run(stage, 2, pool=pool2, **kw).max_param_diff(flat) < 1e-5


# ------------------------------------------------------- torch's versions
def test_zero_redundancy_optimizer_and_fsdp2_equal_ddp(pool2):
    kw = dict(steps=STEPS, global_batch=16, lr=LR, model_kwargs={"hidden": 13})
    for opt, extra in (("sgd", {"momentum": 0.9}), ("adam", {})):
        runs = {s: train.run(s, 2, pool=pool2, optimizer=opt, **extra, **kw)
                for s in ("ddp", "zero_redundancy", "fsdp2")}
        # With SGD a Gloo that sums instead of averaging (pytorch#162338) would show here.
        for s in ("zero_redundancy", "fsdp2"):
            assert runs[s].max_param_diff(runs["ddp"]) < 1e-5, (opt, s)
        state = {s: [m["optimizer"] for m in h.model_state_bytes] for s, h in runs.items()}
        per, counters = (4, 0) if opt == "sgd" else (8, 4 * 6)  # Adam: a step per tensor
        assert state["ddp"] == [per * P + counters] * 2
        # Whole tensors per rank: the two shares add up to all of it, unevenly.
        assert sum(state["zero_redundancy"]) == state["ddp"][0]
        assert max(state["zero_redundancy"]) > 0.6 * state["ddp"][0]
        # Rows of every tensor per rank (each rank its own step counters).
        assert sum(state["fsdp2"]) == per * P + 2 * counters
        ddp_params = runs["ddp"].model_state_bytes[0]["params"]
        assert all(m["params"] < 0.6 * ddp_params for m in runs["fsdp2"].model_state_bytes)


def test_torch_strategies_refuse_simulated_ranks():
    for strategy in ("zero_redundancy", "fsdp2", "ddp", "horovod"):  # before any rank starts
        with pytest.raises(ValueError, match=f"strategy='{strategy}' needs torch.distributed"):
            train.run(strategy, 2, steps=1, global_batch=8, simulate=True)


# ------------------------------------------- formulas, time model, checkers
def test_paper_figures_from_the_formulas():
    from syncedu.train import memory
    p = memory.PAPER
    assert memory.bytes_per_rank(p["psi"], 1, 0)["total"] / memory.GB == p["baseline_gb"]
    for stage, gb in p["figure1_gb"].items():
        ours = memory.bytes_per_rank(p["psi"], p["n"], stage)["total"] / memory.GB
        assert round(ours, 2 if gb < 10 else 1) == gb, (stage, ours)
    with pytest.raises(ValueError, match="stage="):
        memory.bytes_per_rank(1e9, 8, 4)


def test_measured_model_state_is_the_fp32_formula():
    from syncedu.train import memory
    net = _model()
    opt = _torch_optimizer(net.parameters(), "adam")
    x, y = _batch(0, 0)
    F.cross_entropy(net(x), y).backward()
    opt.step()
    got = memory.model_state_bytes(net, opt)
    want = memory.bytes_per_rank(P, 1, 0, memory.FP32["adam"])
    assert got["params"] == want["params"] and got["grads"] == want["grads"]
    assert got["optimizer"] == want["optimizer"] + 4 * 6  # plus a step counter per tensor
    assert memory.activation_bytes(net, x) > 0


def test_simulated_step_time_matches_the_model():
    from syncedu import Network
    from syncedu.dp import timeline
    net = Network(latency=10e-6, bandwidth=1e10)  # latency-bound: 16.6 KB a layer, 1.7 us
    psi = 4 * (64 * 64 + 64)
    for stage, mode in ((0, "dp"), (1, "zero1"), (3, "zero3")):
        simulated = _simulate_step(stage, net)
        model = timeline.zero_step_time(mode, psi, 4, 4, net, 1e-3, itemsize=4)
        assert simulated == pytest.approx(model, rel=0.02), mode
    assert timeline.zero_step_time("zero3_prefetch", psi, 4, 4, net, 1e-3, itemsize=4) < \
        timeline.zero_step_time("zero3", psi, 4, 4, net, 1e-3, itemsize=4)


def test_time_model_is_a_lower_bound_for_flat_shards_on_a_slow_link():
    # The model assumes an even split per layer; our flat shards put each of these layers on
    # one rank, so the simulator lies between the model and a one-owner bound (lesson 10).
    from torch import nn

    from syncedu import Network
    from syncedu.dp import timeline
    link = Network(latency=1e-5, bandwidth=3e7)
    units = layer_units(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]))
    layout = Layout(units[-1].b, 4)
    most = [max(hi - lo for lo, hi in layout.ranges(u.a, u.b)) for u in units]
    assert most == [4160] * 4  # each layer wholly on one rank
    bound = 3e-3 + sum(3 * 3 * (link.latency + 4 * m / link.bandwidth) for m in most)
    model = timeline.zero_step_time("zero3", 4 * (64 * 64 + 64), 4, 4, link, 1e-3, itemsize=4)
    simulated = _simulate_step(3, link)
    assert model < simulated < bound and simulated > 2 * model
