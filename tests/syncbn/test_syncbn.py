"""SyncBatchNorm (syncedu.syncbn) == BatchNorm on the concatenated batch, on any Comm.

Checked on simulated ranks (world sizes 2, 3, 5, uneven batches including a
rank with one sample and one with none), on real Gloo ranks (one shared pool),
and against `torch.nn.SyncBatchNorm` on GPUs (skipped without CUDA).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from syncedu import launch, sim, syncbn
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.train import models

TOL = {"atol": 1e-10, "rtol": 1e-10}


def make_case(sizes, channels=3, spatial=(2, 3), seed=0, dtype=torch.float64):
    """Per-rank inputs (offset, so a naive E[x^2] - E[x]^2 would lose digits) and upstream grads."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, channels, *spatial, generator=g, dtype=dtype) * 2 + 3 for n in sizes]
    gs = [torch.randn(n, channels, *spatial, generator=g, dtype=dtype) for n in sizes]
    return xs, gs


def _init(bn, channels):
    with torch.no_grad():
        if bn.weight is not None:
            bn.weight.copy_(torch.linspace(0.5, 2.0, channels))
            bn.bias.copy_(torch.linspace(-1.0, 1.0, channels))
    return bn


def run_bn(bn, xs, gs, steps):
    """`steps` training steps of forward + backward, then an eval forward."""
    x = xs.clone().requires_grad_()
    for _ in range(steps):
        y = bn(x)
        (y * gs).sum().backward()
    bn.eval()
    y_eval = bn(x).detach()
    grads = [None if p is None else p.grad for p in (bn.weight, bn.bias)]
    return {"y": y.detach(), "dx": x.grad, "dw": grads[0], "db": grads[1],
            "rm": bn.running_mean, "rv": bn.running_var, "eval": y_eval}


def sync_worker(comm, xs, gs, steps=2, kwargs=None):
    kwargs = dict(kwargs or {})
    c = xs[0].shape[1]
    bn = _init(syncbn.SyncBatchNorm(c, comm=comm, **kwargs).to(xs[0].dtype), c)
    return run_bn(bn, xs[comm.rank], gs[comm.rank], steps)


def reference(xs, gs, steps=2, kwargs=None):
    c, dim = xs[0].shape[1], xs[0].dim()
    cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[dim]
    bn = _init(cls(c, **dict(kwargs or {})).double(), c)
    return run_bn(bn, torch.cat(xs), torch.cat(gs), steps)


def assert_matches(res, ref, local_eval=False):
    """Outputs and input grads match per sample; weight/bias grads sum to the reference."""
    for key in ("y", "dx") + (() if local_eval else ("eval",)):
        torch.testing.assert_close(torch.cat([r[key] for r in res]), ref[key], **TOL)
    if ref["dw"] is not None:
        for key in ("dw", "db"):
            torch.testing.assert_close(sum(r[key] for r in res), ref[key], **TOL)
    if ref["rm"] is not None:
        for r in res:
            torch.testing.assert_close(r["rm"], ref["rm"], **TOL)
            torch.testing.assert_close(r["rv"], ref["rv"], **TOL)


# ---------------------------------------------------------------- simulated ranks
@pytest.mark.parametrize("sizes,spatial", [
    ([3, 5], ()),                 # (N, C)
    ([4, 1, 2], (5,)),            # (N, C, L), a rank with a single sample
    ([2, 0, 3, 1, 6], (2, 3)),    # (N, C, H, W), a rank with no samples
    ([1, 1, 1], (2, 2, 2)),       # (N, C, D, H, W), one sample per rank
])
def test_equals_batchnorm_on_simulated_ranks(sizes, spatial):
    xs, gs = make_case(sizes, spatial=spatial)
    res = sim.run(sync_worker, len(sizes), args=(xs, gs))
    assert_matches(res, reference(xs, gs))


@pytest.mark.parametrize("kwargs", [
    {"momentum": None}, {"momentum": 0.5, "eps": 1e-3}, {"affine": False},
])
def test_options_match_batchnorm(kwargs):
    xs, gs = make_case([2, 3, 4], spatial=(3,), seed=1)
    res = sim.run(sync_worker, 3, args=(xs, gs, 3, kwargs))
    assert_matches(res, reference(xs, gs, 3, kwargs))


def test_without_running_stats_eval_is_local():
    xs, gs = make_case([3, 4], seed=2)
    kwargs = {"track_running_stats": False}
    res = sim.run(sync_worker, 2, args=(xs, gs, 1, kwargs))
    assert_matches(res, reference(xs, gs, 1, kwargs), local_eval=True)
    for r, x in zip(res, xs):  # eval normalizes each rank's own batch, like torch
        local = _init(nn.BatchNorm2d(3, track_running_stats=False).double(), 3).eval()
        torch.testing.assert_close(r["eval"], local(x).detach(), **TOL)


def test_world_size_one_is_batchnorm():
    xs, gs = make_case([5], seed=3)
    assert_matches(sim.run(sync_worker, 1, args=(xs, gs)), reference(xs, gs))


def test_float32_is_numerically_sensible():
    """Mean 1000 x std: float32 sums of squares would cancel; our formulation does not."""
    xs, gs = make_case([64, 64, 64], spatial=(4,), seed=4, dtype=torch.float32)
    xs = [x * 0.5 + 1000.0 for x in xs]
    res = sim.run(sync_worker, 3, args=(xs, gs, 1))
    ref = reference([x.double() for x in xs], [g.double() for g in gs], 1)
    y = torch.cat([r["y"] for r in res]).double()
    torch.testing.assert_close(y, ref["y"], atol=2e-3, rtol=0)


# ------------------------------------------------------------------- the ledger
def ledger_worker(comm, x, steps):
    bn = syncbn.SyncBatchNorm(x.shape[1], comm=comm).double()
    xin = x.clone().requires_grad_()
    for _ in range(steps):
        bn(xin).sum().backward()
    bn.eval()
    bn(xin)  # eval: no communication
    return None


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_one_allreduce_per_forward_and_backward(world_size):
    c, steps = 6, 3
    x = torch.randn(2, c, 3, dtype=torch.float64)
    led = sim.run(ledger_worker, world_size, args=(x, steps)).ledger
    assert set(led.ops) == {syncbn.FORWARD_OP, syncbn.BACKWARD_OP, syncbn.CHECK_OP}
    for op, numel, calls in ((syncbn.FORWARD_OP, 2 * c + 1, steps),
                             (syncbn.BACKWARD_OP, 2 * c, steps), (syncbn.CHECK_OP, 2, 1)):
        assert led.ops[op].calls == [calls] * world_size
        for r in range(world_size):
            sent, _ = ring_allreduce_elements(numel, world_size, r)
            assert led.ops[op].sent[r] == calls * sent * 8  # float64 payloads
            assert led.ops[op].msgs_sent[r] == calls * 2 * (world_size - 1)


# ----------------------------------------------------------------- convert
def convert_worker(comm, xs, ys):
    torch.manual_seed(0)
    model = models.make("cnn", seed=0).double()
    model = syncbn.convert(model, comm)
    n_sync = sum(isinstance(m, syncbn.SyncBatchNorm) for m in model.modules())
    loss = nn.functional.cross_entropy(model(xs[comm.rank]), ys[comm.rank], reduction="sum")
    loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    return n_sync, grads, buffers


def test_convert_makes_a_cnn_train_like_one_process():
    g = torch.Generator().manual_seed(5)
    sizes = [3, 1, 4]
    xs = [torch.rand(n, 1, 8, 8, generator=g, dtype=torch.float64) for n in sizes]
    ys = [torch.randint(0, 10, (n,), generator=g) for n in sizes]
    res = sim.run(convert_worker, 3, args=(xs, ys))
    ref = models.make("cnn", seed=0).double()
    nn.functional.cross_entropy(ref(torch.cat(xs)), torch.cat(ys), reduction="sum").backward()
    assert all(r[0] == 2 for r in res)
    for k, p in ref.named_parameters():  # summed over ranks = the one-process gradient
        torch.testing.assert_close(sum(r[1][k] for r in res), p.grad, atol=1e-9, rtol=1e-9)
    for k, b in ref.named_buffers():
        for r in res:
            torch.testing.assert_close(r[2][k], b, **TOL)


def test_convert_shares_parameters_and_buffers():
    def fn(comm):
        bn = nn.BatchNorm2d(4, momentum=0.2).double()
        seq = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.BatchNorm1d(2), bn))
        seq.eval()
        new = syncbn.convert(seq, comm)
        inner = new[1][1]
        return (type(new[1][0]).__name__, type(inner).__name__, inner.weight is bn.weight,
                inner.running_var is bn.running_var, inner.momentum, inner.training,
                type(syncbn.convert(nn.BatchNorm3d(3), comm)).__name__)

    assert sim.run(fn, 1)[0] == ("SyncBatchNorm", "SyncBatchNorm", True, True, 0.2, False,
                                 "SyncBatchNorm")


# ------------------------------------------------------------------- errors
def test_bad_arguments():
    def fn(comm):
        errors = []
        for match, kwargs in (("num_features", {"num_features": 0}),
                              ("eps", {"num_features": 2, "eps": 0.0}),
                              ("momentum", {"num_features": 2, "momentum": 1.5})):
            with pytest.raises(ValueError, match=match):
                syncbn.SyncBatchNorm(comm=comm, **kwargs)
        bn = syncbn.SyncBatchNorm(3, comm=comm)
        for x, match in ((torch.zeros(4), "shape"), (torch.zeros(4, 2, 5), "channels")):
            with pytest.raises(ValueError, match=match):
                bn(x)
            errors.append(match)
        with pytest.raises(TypeError, match="comm"):
            syncbn.SyncBatchNorm(3)
        return errors

    assert sim.run(fn, 1)[0] == ["shape", "channels"]


def test_channel_mismatch_across_ranks_is_a_clear_error():
    def fn(comm):
        c = 3 + comm.rank % 2
        syncbn.SyncBatchNorm(c, comm=comm)(torch.randn(2, c))

    with pytest.raises(sim.WorkerError, match="num_features differ across ranks"):
        sim.run(fn, 3)


def test_a_single_value_in_the_global_batch_is_an_error():
    def fn(comm):
        n = 1 if comm.rank == 0 else 0
        syncbn.SyncBatchNorm(2, comm=comm)(torch.randn(n, 2))

    with pytest.raises(sim.WorkerError, match="more than 1 value per channel"):
        sim.run(fn, 2)


# --------------------------------------------------------------- real ranks
@pytest.fixture(scope="module")
def pool3():
    with launch.Pool(3, output="quiet") as pool:
        yield pool


@pytest.mark.real
def test_equals_batchnorm_on_real_ranks(pool3):
    xs, gs = make_case([4, 1, 2], spatial=(3, 3), seed=6)
    res = pool3.run(sync_worker, args=(xs, gs, 2))
    assert_matches(res, reference(xs, gs, 2))


@pytest.mark.real
def test_real_ledger_equals_simulated(pool3):
    x = torch.randn(2, 5, dtype=torch.float64)
    real = pool3.run(ledger_worker, args=(x, 2)).ledger
    simulated = sim.run(ledger_worker, 3, args=(x, 2)).ledger
    assert real.rows() == simulated.rows()


# ---------------------------------------------------------------------- GPUs
def gpu_worker(comm, xs, gs):
    """Ours and torch.nn.SyncBatchNorm on the same CUDA tensors (float64)."""
    dev = comm.device if comm.device.type == "cuda" else torch.device("cuda", 0)
    out = []
    for bn in (syncbn.SyncBatchNorm(xs[0].shape[1], comm=comm),
               nn.SyncBatchNorm(xs[0].shape[1])):
        bn = _init(bn.double(), xs[0].shape[1]).to(dev)
        res = run_bn(bn, xs[comm.rank].to(dev), gs[comm.rank].to(dev), 2)
        out.append({k: None if v is None else v.cpu() for k, v in res.items()})
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_equals_torch_syncbatchnorm_on_gpus():
    gpus = torch.cuda.device_count()
    # One rank per GPU over NCCL; with a single GPU, two Gloo ranks share it.
    world, backend = (min(gpus, 4), "nccl") if gpus >= 2 else (2, "gloo")
    xs, gs = make_case([3, 1, 4, 2][:world], spatial=(4, 4), seed=7)
    res = launch.run(gpu_worker, world, args=(xs, gs), backend=backend, output="quiet")
    for ours, theirs in res:
        for key, value in ours.items():
            torch.testing.assert_close(value, theirs[key], atol=1e-9, rtol=1e-9)
    assert_matches([ours for ours, _ in res], reference(xs, gs, 2))


@pytest.mark.real
def test_experiment_on_real_ranks_sends_what_the_simulated_run_counts(pool3):
    """The BatchNorm experiment on 3 real ranks (a warm pool): the same bytes per rank and
    op as on simulated ranks, and the same losses within float rounding."""
    from syncedu.syncbn import experiment as bx

    cfg = dict(steps=4, channels=4, test_size=100)
    real = bx.run("syncbn", 3, simulate=False, pool=pool3, **cfg)
    simulated = bx.run("syncbn", 3, simulate=True, **cfg)
    assert real.ledger.sent == simulated.ledger.sent
    assert real.ledger.ops["syncbn_forward"].calls == simulated.ledger.ops["syncbn_forward"].calls
    assert real.loss == pytest.approx(simulated.loss, rel=1e-5) and real.seconds > 0


# ------------------------------------------- the lesson's experiment and checkers
def test_experiment_syncbn_equals_one_process_and_plain_ranks_disagree():
    from syncedu.syncbn import experiment as bx

    out = bx.compare(per_rank_batch=2, world_size=3, steps=12, channels=4, test_size=100,
                     simulate=True)
    sync, single, plain = out["syncbn"], out["single"], out["plain"]
    for k, v in single.params.items():
        torch.testing.assert_close(sync.params[k], v, atol=1e-4, rtol=1e-4)
    assert sync.spread() == {"mean": 0.0, "var": 0.0} and plain.spread()["var"] > 0
    assert len(sync.loss) == 12 and sync.ledger.ops["syncbn_forward"].calls == [24] * 3
    with pytest.raises(ValueError, match="mode"):
        bx.run("nope")
    with pytest.raises(ValueError, match="world_size"):
        bx.run("plain", 0)
    with pytest.raises(TypeError, match="stepz"):
        bx.run("plain", 2, stepz=3)
    with pytest.raises(ValueError, match="pool"):
        bx.run("single", 1, pool=object())  # one process: nothing to run on a pool
    noise = bx.stat_noise((2, 8), draws=50)
    assert noise[2][1] > noise[8][1]
