"""zero.FullyShard (ZeRO-3, per-parameter dim-0 shards as FSDP2): an external SGD over
`.parameters()` matches one process on the whole batch (fp32: 1e-6; fp16 compute: 1e-4
against a one-process run that casts the same way); replicated RMSNorm-like weights get
bitwise-equal gradients; dim 0 not divisible by N; no_sync; bytes; bad arguments."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from syncedu.comm import sim
from syncedu.train.memory import model_state_bytes
from syncedu.zero.fully_shard import FullyShard

STEPS, LR = 4, 0.1


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class CastLinear(nn.Linear):
    """The one-process reference for compute_dtype: weights and input cast, as FullyShard does."""

    dtype = torch.float16

    def forward(self, x):
        return F.linear(x.to(self.dtype), self.weight.to(self.dtype), self.bias.to(self.dtype))


class Net(nn.Module):
    def __init__(self, linear=nn.Linear):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.norm, self.fc2 = linear(6, 5), RMSNorm(5), linear(5, 3)  # 5, 3 rows: odd

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


def _batch(step, rank, size=4):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def _reference(n, linear=nn.Linear):
    net = Net(linear)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        xs, ys = zip(*[_batch(step, r) for r in range(n)])
        F.cross_entropy(net(torch.cat(xs)).float(), torch.cat(ys)).backward()
        opt.step()
    return {k: p.detach().clone() for k, p in net.named_parameters()}


def _worker(comm, shard=(nn.Linear,), compute_dtype=None, reshard=True, micro=1, default=False):
    fs = FullyShard(Net(), None if default else comm, compute_dtype=compute_dtype, shard=shard,
                    reshard_after_forward=reshard)
    opt = torch.optim.SGD(fs.module.parameters(), lr=LR)
    comm.ledger.reset()
    norm_grads, kinds = [], set()
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(step, comm.rank)
        for k, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
            ctx = fs.no_sync() if k < micro - 1 else torch.enable_grad()
            with ctx:
                (F.cross_entropy(fs(xm).float(), ym) / micro).backward()
        fs.finish_gradient_synchronization()
        kinds |= {(tuple(p.grad.shape) == tuple(p.shape), p.grad.dtype)
                  for p in fs.module.parameters()}
        norm_grads.append(fs.module.norm.weight.grad.clone())
        opt.step()
    shapes = {k: tuple(p.shape) for k, p in fs.module.named_parameters()}
    ops = {k: v.sent for k, v in comm.ledger.ops.items()}
    return fs.full_parameters(), norm_grads, kinds, shapes, ops


def _close(got, want, atol):
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=atol, rtol=0, msg=k)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_external_sgd_matches_one_process_fp32(n):
    want = _reference(n)
    res = sim.run(_worker, n)
    for params, _, kinds, shapes, _ in res:
        _close(params, want, 1e-6)
        assert kinds == {(True, torch.float32)}  # every .grad: its parameter's shape, fp32
        c = -(-5 // n)  # fc1's 5 rows: ceil(5/n) per rank, the tail shorter (n=4: one rank none)
        assert shapes["norm.weight"] == (5,)  # replicated
    assert [s["fc1.weight"][0] for *_, s, _ in res] == [max(0, min(c, 5 - r * c))
                                                         for r in range(n)]
    for r in range(1, n):  # replicated gradients: the same bits on every rank
        assert all(a.equal(b) for a, b in zip(res[0][1], res[r][1]))


def test_fp16_compute_matches_one_process_that_casts_the_same_way():
    want = _reference(2, CastLinear)
    res = sim.run(_worker, 2, kwargs={"compute_dtype": torch.float16})
    for params, _, kinds, *_ in res:
        _close(params, want, 1e-4)
        assert kinds == {(True, torch.float32)}  # masters and gradients stay fp32
    assert all(a.equal(b) for a, b in zip(res[0][1], res[1][1]))


def test_bytes_reshard_gathers_twice_and_no_sync_skips_reduce_scatters():
    n = 2
    every = sim.run(_worker, n, kwargs={"shard": None})[0][4]
    kept = sim.run(_worker, n, kwargs={"shard": None, "reshard": False})[0][4]
    assert set(every) == {"all_gather", "reduce_scatter"}  # all sharded: nothing replicated
    # Padded per-rank pieces: fc1 3x6 + 3, norm 3, fc2 2x5 + 2 = 36 elements. Backward
    # gathers again only the units autograd saved a weight of: norm and fc2 (15), not fc1
    # (its input needs no gradient, so its weight is not needed: FSDP would gather it too).
    assert every["all_gather"] * 36 == every["reduce_scatter"] * (36 + 15)
    assert kept["all_gather"] == kept["reduce_scatter"]
    accum = sim.run(_worker, n, kwargs={"micro": 2})
    _close(accum[0][0], _reference(n), 1e-6)
    one = sim.run(_worker, n)[0][4]
    assert accum[0][4]["reduce_scatter"] == one["reduce_scatter"]  # once per step
    assert accum[0][4]["all_gather"] == 2 * one["all_gather"]  # two micro-batches' forwards


def test_resharding_holds_one_unit_of_full_weights_at_a_time():
    def worker(comm, reshard):
        fs = FullyShard(Net(), comm, reshard_after_forward=reshard)  # every layer sharded
        for _ in range(2):
            F.cross_entropy(fs(_batch(0, comm.rank)[0]), _batch(0, comm.rank)[1]).backward()
            fs.finish_gradient_synchronization()
        return fs.peak_gathered_bytes, fs.gathered_bytes, model_state_bytes(fs.module)["params"]
    kept, resharded = (sim.run(worker, 2, args=(r,))[0] for r in (False, True))
    full = 4 * sum(p.numel() for p in Net().parameters())  # 4 * 58
    assert kept[0] == full and resharded[0] == 4 * (5 * 6 + 5)  # all vs the largest, fc1
    assert kept[1] == resharded[1] == 0  # nothing held between steps
    assert resharded[2] == 4 * (3 * 6 + 3 + 3 + 2 * 5 + 2) < full  # rank 0's shards only


def test_predicate_policy_and_no_gathers_left_behind():
    def worker(comm):
        fs = FullyShard(Net(), comm, shard=lambda m: m is not None and hasattr(m, "in_features")
                        and m.in_features == 6)
        fs.module(torch.ones(2, 6) * (1 + comm.rank)).sum().backward()  # .module directly
        fs.finish_gradient_synchronization()
        return ({k: tuple(p.shape) for k, p in fs.module.named_parameters()},
                "weight" in fs.module.fc1.__dict__, len(fs._live), fs.module.norm.weight.grad)
    (shapes, leftover, live, g0), (*_, g1) = sim.run(worker, 2)
    assert g0.equal(g1)  # replicated gradients averaged even without fs(...)
    assert shapes["fc1.weight"] == (3, 6) and shapes["fc2.weight"] == (3, 5)
    assert not leftover and live == 0


@pytest.mark.real
def test_matches_one_process_on_real_ranks(pool2):
    """The default process group (comm=None), fp32 and fp16 compute (Gloo moves fp16 too)."""
    for dtype, linear, atol in ((None, nn.Linear, 1e-6), (torch.float16, CastLinear, 1e-4)):
        want = _reference(2, linear)
        for params, *_ in pool2.run(_worker, kwargs={"default": True, "compute_dtype": dtype}):
            _close(params, want, atol)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="compute_dtype"):
        FullyShard(Net(), object(), compute_dtype=torch.int8)
    for bad in ("transformer", ("Linear",), (), 3):
        with pytest.raises(ValueError, match="shard"):
            FullyShard(Net(), object(), shard=bad)
    with pytest.raises(ValueError, match="reshard_after_forward"):
        FullyShard(Net(), object(), reshard_after_forward=None)


def test_per_parameter_spreads_each_layer_over_every_rank():
    # Lesson 10's table: elements of each layer per rank, flat shards vs rows (`rows`).
    from syncedu.train import models
    from syncedu.zero.fully_shard import rows
    from syncedu.zero.shards import Layout, layer_units

    units = layer_units(models.make("mlp", hidden=13))  # 64 -> 13 -> 13 -> 10: 1,167
    layout = Layout(units[-1].b, 4)
    flat = [[hi - lo for lo, hi in layout.ranges(u.a, u.b)] for u in units]
    per_param = [[sum((hi - lo) * s[1:].numel() for s in u.shapes for lo, hi in [rows(s[0], 4, r)])
                  for r in range(4)] for u in units]
    numel = [u.b - u.a for u in units]
    assert numel == [845, 182, 140]
    assert [sum(f) for f in flat] == [sum(p) for p in per_param] == numel
    assert flat[0] == [292, 292, 261, 0]  # flat: rank 3 sends none of layer 1 ...
    assert flat[2] == [0, 0, 0, 140]  # ... and all of layer 3
    assert per_param[0] == [260, 260, 260, 65]  # ceil(13/4) = 4 of 13 rows each
    assert all(max(p) <= 4 / 13 * n + 1e-9 for p, n in zip(per_param, numel))
    assert max(max(f) / n for f, n in zip(flat, numel)) == 1.0  # a layer on one rank alone
