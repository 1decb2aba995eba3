"""zero.FullyShard (ZeRO-3, per-parameter dim-0 shards as FSDP2): an external SGD over
`.parameters()` matches one process on the whole batch (fp32: 1e-6; fp16 compute: 1e-4
against a one-process run that casts the same way); units own subtrees, the root holds the
rest (RMSNorm's weight, sharded); a replicated scalar gets bitwise-equal gradients; dim 0 not
divisible by N; no_sync; bytes; mixed precision's bytes; clipping; bad arguments."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from syncedu.comm import sim
from syncedu.comm.network import Network
from syncedu.train.memory import model_state_bytes
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.hsdp import HybridShard

STEPS, LR = 4, 0.1


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.norm, self.fc2 = nn.Linear(6, 5), RMSNorm(5), nn.Linear(5, 3)  # odd rows
        self.scale = nn.Parameter(torch.tensor(1.5))  # 0-dim: the one replicated parameter

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x)))) * self.scale


def _batch(step, rank, size=4):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def _reference(n, dtype=None, clip=None, norms=None):
    """One process on the whole batch; with `dtype`, the weights (0-dim ones aside: replicated,
    never cast) and the input cast as compute_dtype casts them, through torch.func."""
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        xs, ys = zip(*[_batch(step, r) for r in range(n)])
        x = torch.cat(xs)
        out = net(x) if dtype is None else torch.func.functional_call(
            net, {k: p.to(dtype) if p.dim() else p for k, p in net.named_parameters()},
            (x.to(dtype),))
        F.cross_entropy(out.float(), torch.cat(ys)).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), *clip)))
        opt.step()
    return {k: p.detach().clone() for k, p in net.named_parameters()}


def _worker(comm, shard=(nn.Linear,), compute_dtype=None, reshard=True, micro=1, default=False,
            reduce_dtype=None, prefetch=True):
    fs = FullyShard(Net(), None if default else comm, compute_dtype=compute_dtype, shard=shard,
                    reshard_after_forward=reshard, reduce_dtype=reduce_dtype, prefetch=prefetch)
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
        norm_grads.append(fs.module.scale.grad.clone())
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
        assert shapes["scale"] == ()  # replicated
    for name in ("fc1.weight", "norm.weight"):  # norm: in the root's unit, sharded too
        assert [s[name][0] for *_, s, _ in res] == [max(0, min(c, 5 - r * c)) for r in range(n)]
    for r in range(1, n):  # replicated gradients: the same bits on every rank
        assert all(a.equal(b) for a, b in zip(res[0][1], res[r][1]))


# The reference rounds its whole-batch weight gradients to fp16 once, the ranks their halves:
# 1.1e-4 and 8.5e-5 apart after 4 steps (reduce in fp32 and in fp16).
@pytest.mark.parametrize("reduce_dtype", [torch.float32, None])
def test_fp16_compute_matches_one_process_that_casts_the_same_way(reduce_dtype):
    want = _reference(2, torch.float16)
    res = sim.run(_worker, 2, kwargs={"compute_dtype": torch.float16, "shard": None,
                                      "reduce_dtype": reduce_dtype})
    for params, _, kinds, *_ in res:
        _close(params, want, 3e-4)
        assert kinds == {(True, torch.float32)}  # masters and gradients stay fp32
    assert all(a.equal(b) for a, b in zip(res[0][1], res[1][1]))


def test_bytes_reshard_gathers_twice_and_no_sync_skips_reduce_scatters():
    n = 2
    units = (nn.Linear, RMSNorm)  # every layer a unit; the root holds only `scale`, replicated
    every = sim.run(_worker, n, kwargs={"shard": units, "prefetch": False})[0][4]
    ahead = sim.run(_worker, n, kwargs={"shard": units})[0][4]
    kept = sim.run(_worker, n, kwargs={"shard": units, "reshard": False})[0][4]
    assert set(every) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert every["all_reduce"] == STEPS * 4  # rank 0 sends the scalar's 4 bytes a step
    # Padded per-rank pieces: fc1 3x6 + 3, norm 3, fc2 2x5 + 2 = 36 elements. Backward
    # gathers again only the units autograd saved a weight of: norm and fc2 (15), not fc1
    # (its input needs no gradient, so its weight is not needed: FSDP would gather it too).
    assert every["all_gather"] * 36 == every["reduce_scatter"] * (36 + 15)
    # Prefetching moves no extra bytes: backward prefetches in the order the first backward
    # gathered the units, which never holds fc1 (FSDP2, prefetching by the post-forward
    # order, would gather fc1 in backward too: 2 x the reduce-scatter here).
    assert ahead["all_gather"] == every["all_gather"] < 2 * every["reduce_scatter"]
    assert ahead["reduce_scatter"] == every["reduce_scatter"]
    assert kept["all_gather"] == kept["reduce_scatter"]
    accum = sim.run(_worker, n, kwargs={"micro": 2})
    _close(accum[0][0], _reference(n), 1e-6)
    one = sim.run(_worker, n)[0][4]
    assert accum[0][4]["reduce_scatter"] == one["reduce_scatter"]  # once per step
    assert accum[0][4]["all_gather"] == 2 * one["all_gather"]  # two micro-batches' forwards


def test_resharding_holds_one_unit_of_full_weights_at_a_time():
    def worker(comm, reshard, prefetch=False):
        fs = FullyShard(Net(), comm, shard=(nn.Linear, RMSNorm), reshard_after_forward=reshard,
                        prefetch=prefetch)
        for _ in range(2):
            F.cross_entropy(fs(_batch(0, comm.rank)[0]), _batch(0, comm.rank)[1]).backward()
            fs.finish_gradient_synchronization()
        return fs.peak_gathered_bytes, fs.gathered_bytes, model_state_bytes(fs.module)["params"]
    kept, resharded = (sim.run(worker, 2, args=(r,))[0] for r in (False, True))
    full = 4 * (sum(p.numel() for p in Net().parameters()) - 1)  # 4 * 58 (the scale: not sharded)
    assert kept[0] == full and resharded[0] == 4 * (5 * 6 + 5)  # all vs the largest, fc1
    ahead = sim.run(worker, 2, args=(True, True))[0]  # + the next unit: fc1 and the norm's 5
    assert ahead[0] == 4 * (5 * 6 + 5 + 5) and ahead[1] == 0
    assert kept[1] == resharded[1] == 0  # nothing held between steps
    assert resharded[2] == 4 * (3 * 6 + 3 + 3 + 2 * 5 + 2 + 1) < full  # rank 0's shards, scale


def test_predicate_policy_and_no_gathers_left_behind():
    def worker(comm):
        fs = FullyShard(Net(), comm, shard=lambda m: m is not None and hasattr(m, "in_features")
                        and m.in_features == 6)
        fs.module(torch.ones(2, 6) * (1 + comm.rank)).sum().backward()  # .module directly
        fs.finish_gradient_synchronization()
        return ({k: tuple(p.shape) for k, p in fs.module.named_parameters()},
                "weight" in fs.module.fc1.__dict__, len(fs._live), fs.module.scale.grad)
    (shapes, leftover, live, g0), (*_, g1) = sim.run(worker, 2)
    assert g0.equal(g1)  # replicated gradients averaged even without fs(...)
    assert shapes["fc1.weight"] == (3, 6) and shapes["fc2.weight"] == (2, 5)  # fc2: the root's
    assert not leftover and live == 0


@pytest.mark.real
def test_matches_one_process_on_real_ranks(pool2):
    """The default process group (comm=None), fp32 and fp16 compute (Gloo moves fp16 too)."""
    for dtype, atol in ((None, 1e-6), (torch.float16, 3e-4)):  # fp16: as on simulated ranks
        want = _reference(2, dtype)
        kwargs = {"default": True, "compute_dtype": dtype, "reduce_dtype": torch.float32}
        for params, *_ in pool2.run(_worker, kwargs=kwargs):
            _close(params, want, atol)


def _clip_worker(comm, clip, nodes=None):
    fs = (HybridShard(Net(), comm, nodes=nodes, shard=(nn.Linear,)) if nodes
          else FullyShard(Net(), comm, shard=(nn.Linear,)))
    opt = torch.optim.SGD(fs.module.parameters(), lr=LR)
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(fs(_batch(step, comm.rank)[0]), _batch(step, comm.rank)[1]).backward()
        norms.append(float(fs.clip_grad_norm_(*clip)))  # also finishes the synchronization
        opt.step()
    return fs.full_parameters(), norms


@pytest.mark.parametrize("clip", [(0.05, 2.0), (0.05, float("inf")), (0.2, 1.0), (50.0, 2.0)])
def test_clip_grad_norm_equals_torchs_on_the_unsharded_model(clip):
    """Shards (their p-th powers summed over ranks) and the replicated scalar: the norm
    torch's clip_grad_norm_ returns on one process, and the same clipped training; HSDP
    (2 nodes x 2) counts each shard once, not once per replica. 50 never clips."""
    want_norms = []
    want = _reference(4, clip=clip, norms=want_norms)
    for nodes in (None, 2):
        res = sim.run(_clip_worker, 4, args=(clip, nodes), network=Network.cluster(2, 2))
        for params, norms in res:
            _close(params, want, 1e-6)
            assert norms == pytest.approx(want_norms, rel=1e-6)
    assert (min(want_norms) > clip[0]) == (clip[0] < 1)  # the small ones clip every step


def test_mixed_precision_bytes_and_a_frozen_layer():
    """bf16 gathers move half fp32's bytes; the reduce-scatter is bf16 too unless
    reduce_dtype=float32 (FSDP2's default: the compute dtype). A frozen Linear is gathered in
    bf16 like the rest (no dtype error) and never reduce-scattered."""
    def worker(comm, compute_dtype, reduce_dtype, frozen):
        net = Net()
        net.fc1.requires_grad_(not frozen)
        fs = FullyShard(net, comm, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype)
        comm.ledger.reset()
        F.cross_entropy(fs(_batch(0, comm.rank)[0]).float(), _batch(0, comm.rank)[1]).backward()
        fs.finish_gradient_synchronization()
        return ({k: v.sent for k, v in comm.ledger.ops.items()},
                {type(m).__name__ for m in fs.module.modules()}, fs.module.fc1.weight.grad)
    fp32, bf16, bf16_fp32 = (sim.run(worker, 2, args=(c, r, False))[0][0] for c, r in (
        (None, None), (torch.bfloat16, None), (torch.bfloat16, torch.float32)))
    assert bf16["all_gather"] * 2 == fp32["all_gather"] == bf16_fp32["all_gather"] * 2
    assert bf16["reduce_scatter"] * 2 == fp32["reduce_scatter"] == bf16_fp32["reduce_scatter"]
    frozen = sim.run(worker, 2, args=(torch.bfloat16, None, True))[0]
    assert frozen[2] is None  # the frozen layer has no gradient, and sends none:
    fc1 = 2 * (3 * 6 + 3)  # rank 0's padded rows of fc1, bf16
    assert frozen[0]["reduce_scatter"] == bf16["reduce_scatter"] - fc1
    assert frozen[0]["all_gather"] == bf16["all_gather"]


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="compute_dtype"):
        FullyShard(Net(), object(), compute_dtype=torch.int8)
    with pytest.raises(ValueError, match="reduce_dtype"):
        FullyShard(Net(), object(), reduce_dtype=torch.float64)

    def worker(comm, max_norm, norm_type):
        fs = FullyShard(Net(), comm)
        fs(torch.ones(1, 6)).sum().backward()
        fs.clip_grad_norm_(max_norm, norm_type)
    for max_norm, norm_type, name in ((-1.0, 2.0, "max_norm"), ("1", 2.0, "max_norm"),
                                      (1.0, "two", "norm_type"), (1.0, 0, "norm_type")):
        with pytest.raises(Exception, match=name):
            sim.run(worker, 2, args=(max_norm, norm_type))
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


# ------------------------------------------------------------ checkpoints at another world size
def _global_batch(step, n, rank, size=6):
    """The same 6 samples a step at any world size; rank `rank` of `n` gets its share."""
    x, y = _batch(step, 99, size)
    return x.chunk(n)[rank], y.chunk(n)[rank]


def _resume_worker(comm, steps, saved=None, with_optimizer=True):
    fs = FullyShard(Net(), comm, shard=(nn.Linear,))
    opt = torch.optim.AdamW(fs.module.parameters(), lr=0.05, weight_decay=0.1)
    if saved is not None:
        fs.load_sharded_state_dict(saved, opt if with_optimizer else None)
    for step in steps:
        opt.zero_grad()
        x, y = _global_batch(step, comm.world_size, comm.rank)
        F.cross_entropy(fs(x), y).backward()
        fs.finish_gradient_synchronization()
        opt.step()
    return fs.sharded_state_dict(opt), fs.full_parameters()


def test_a_sharded_checkpoint_saved_on_2_ranks_trains_on_at_3(tmp_path):
    """Each of 2 ranks saves only its rows (with their global shape and first row) to its own
    file; 3 ranks load them (torch.load with mmap) and train on: equal to an unbroken run
    (1e-6). Without the optimizer's state (AdamW's moments and step) the run is another one
    (the witness)."""
    unbroken = sim.run(_resume_worker, 2, args=(range(4),))[0][1]
    for r, (state, _) in enumerate(sim.run(_resume_worker, 2, args=(range(2),))):
        torch.save(state, tmp_path / f"rank{r}.pt")
    saved = [torch.load(tmp_path / f"rank{r}.pt", mmap=True) for r in range(2)]
    held = [sum(e["param"].numel() for e in state.values()) for state in saved]
    assert held == [3 * 6 + 3 + 3 + 2 * 5 + 2 + 1, 2 * 6 + 2 + 2 + 1 * 5 + 1 + 1]  # rows + scale
    assert saved[1]["fc1.weight"]["row"] == 3 and saved[1]["fc1.weight"]["param"].shape == (2, 6)
    assert saved[0]["scale"]["row"] is None  # replicated: whole on every rank
    resumed = sim.run(_resume_worker, 3, args=(range(2, 4), saved))
    for _, params in resumed:
        _close(params, unbroken, 1e-6)
    # the files in any order (sorted names put rank10 before rank2): the rows go by "row"
    for _, params in sim.run(_resume_worker, 3, args=(range(2, 4), saved[::-1])):
        _close(params, unbroken, 1e-6)
    fresh = sim.run(_resume_worker, 3, args=(range(2, 4), saved, False))[0][1]
    assert max((fresh[k] - unbroken[k]).abs().max() for k in unbroken) > 1e-3

    def other_model(comm):
        FullyShard(nn.Linear(6, 5), comm).load_sharded_state_dict(saved)
    with pytest.raises(Exception, match="another model"):
        sim.run(other_model, 3)
