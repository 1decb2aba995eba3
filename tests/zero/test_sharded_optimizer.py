"""zero.ShardedOptimizer (ZeRO-1 as an optimizer): equal to the unsharded AdamW on tied
and frozen parameters, with parameter groups, on simulated ranks (2 and 3) and real
ones, with and without clipping by the global norm; optimizer state for the shard only;
reduce_scatter=True sends 1x DP's bytes; the state consolidated on one rank only;
non-element-wise optimizers and late parameter groups refused."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from syncedu import dp
from syncedu.comm import sim
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.zero.sharded_optimizer import ShardedOptimizer

STEPS = 10
KW = {"lr": 0.1, "weight_decay": 0.1}


class Tied(nn.Module):
    """An input layer whose weight the head reuses (tied), and a frozen layer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(7, 5)
        self.hidden = nn.Linear(5, 5)
        self.frozen = nn.Linear(5, 5)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        h = torch.tanh(self.hidden(self.inp(x)))
        return F.linear(self.frozen(h), self.inp.weight.t())  # the tied head


def _batch(step, rank, size=4):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(size, 7, generator=g), torch.randint(0, 7, (size,), generator=g)


def _groups(model):
    """Two groups with different lr and weight decay (the frozen layer included, as users do)."""
    return [{"params": [model.inp.weight, model.hidden.weight, model.frozen.weight]},
            {"params": [model.inp.bias, model.hidden.bias, model.frozen.bias], "lr": 0.05,
             "weight_decay": 0.0}]


def _reference(world_size, clip=None):
    model = Tied()
    opt = torch.optim.AdamW(_groups(model), **KW)
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        xs, ys = zip(*[_batch(step, r) for r in range(world_size)])
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), *clip)))
        opt.step()
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return (params, norms) if clip else (params, opt.state_dict())


def _worker(comm, reduce_scatter, use_default_group=False, ddp=False, clip=None, to=0):
    model = Tied()
    forward, finish = model, (lambda: None)
    if ddp:  # torch's DDP averages the gradients
        from torch.nn.parallel import DistributedDataParallel
        forward = DistributedDataParallel(model)
    elif not reduce_scatter:  # DP averages the gradients, the optimizer only shards the state
        wrapped = dp.DataParallel(model, comm, "flat")
        forward, finish = wrapped, wrapped.finish_gradient_synchronization
    opt = ShardedOptimizer(_groups(model), torch.optim.AdamW, None if use_default_group else comm,
                           reduce_scatter=reduce_scatter, **KW)
    comm.ledger.reset()
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(step, comm.rank)
        F.cross_entropy(forward(x), y).backward()
        finish()
        if clip is not None:
            norms.append(float(opt.clip_grad_norm_(*clip)))
        opt.step()
    sent = sum(c.sent for c in comm.ledger.ops.values())
    opt.consolidate_state_dict(to=to)
    state = opt.state_dict() if comm.rank == to else None
    return ({k: p.detach().clone() for k, p in model.named_parameters()}, opt.state_bytes, sent,
            state if clip is None else norms)


def _close(got, want, atol=1e-6):
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=atol, rtol=0, msg=k)


TRAINABLE = 5 * 7 + 5 + 5 * 5 + 5  # inp (tied: once) + hidden; the frozen layer has none


@pytest.mark.parametrize("reduce_scatter", [False, True])
@pytest.mark.parametrize("n", [2, 3])
def test_equal_to_unsharded_adamw_on_simulated_ranks(n, reduce_scatter):
    want, want_state = _reference(n)
    res = sim.run(_worker, n, args=(reduce_scatter,))
    for params, state_bytes, *_ in res:
        _close(params, want)
        assert params["frozen.weight"].equal(Tied().frozen.weight)  # never stepped
        # Two moments for ~Psi/N elements each (fp32), plus a 4-byte step per piece.
        assert 2 * 4 * (TRAINABLE // n) <= state_bytes <= 2 * 4 * (-(-TRAINABLE // n)) + 4 * 6
    for state in (res[0][3],):  # consolidated on rank 0 only: the unsharded optimizer's state
        assert state["state"].keys() == want_state["state"].keys()
        for i, st in want_state["state"].items():
            for key, v in st.items():
                torch.testing.assert_close(state["state"][i][key], v, atol=1e-6, rtol=0)
        assert [g["lr"] for g in state["param_groups"]] == [0.1, 0.05]
    if reduce_scatter:  # reduce-scatter + all-gather: exactly one ring allreduce per step
        for r, (_, _, sent, _) in enumerate(res):
            assert sent == STEPS * 4 * sum(ring_allreduce_elements(TRAINABLE, n, r)[:1])


def test_dp_then_sharded_sends_twice_dp_is_just_the_all_gather():
    n = 2
    res = sim.run(_worker, n, args=(False,))
    for r, (_, _, sent, _) in enumerate(res):
        dp_bytes = 4 * ring_allreduce_elements(TRAINABLE, n, r)[0]
        assert sent == STEPS * (dp_bytes + dp_bytes // 2)  # DP's allreduce + an all-gather


@pytest.mark.real
def test_equal_to_unsharded_adamw_on_real_ranks(pool2):
    want, _ = _reference(2)
    for reduce_scatter, ddp in ((True, False), (False, False), (False, True)):
        for params, *_ in pool2.run(_worker, (reduce_scatter, True, ddp)):
            _close(params, want)


def test_load_state_dict_round_trip_and_lr_change():
    def worker(comm):
        torch.manual_seed(0)
        lin = nn.Linear(3, 4)
        opt = ShardedOptimizer(lin.parameters(), torch.optim.Adam, comm, reduce_scatter=True,
                               lr=0.1)
        lin(torch.ones(2, 3)).sum().backward()
        opt.step()
        opt.consolidate_state_dict(to=2)
        return opt.state_dict() if comm.rank == 2 else None
    sd = sim.run(worker, 3)[2]

    def reload(comm):
        torch.manual_seed(0)
        lin = nn.Linear(3, 4)
        opt = ShardedOptimizer(lin.parameters(), torch.optim.Adam, comm, reduce_scatter=True,
                               lr=0.1)
        opt.load_state_dict(sd)  # the whole state, given to every rank (as torch's ZeRO)
        opt.param_groups[0]["lr"] = 0.0  # as a scheduler would: the next step moves nothing
        before = lin.weight.detach().clone()
        lin(torch.ones(2, 3)).sum().backward()
        opt.step()
        opt.consolidate_state_dict()
        return before.equal(lin.weight), opt.state_dict()["state"][0]["exp_avg"] \
            if comm.rank == 0 else None
    res = sim.run(reload, 3)
    assert all(same for same, _ in res)
    # The loaded moment went on (0.9 m + 0.1 g, g = 2): a fresh one would be 0.2 again.
    torch.testing.assert_close(res[0][1], 0.9 * sd["state"][0]["exp_avg"] + 0.1 * 2.0)
    assert res[0][1].shape == (4, 3) and res[1][1] is None


def test_a_scheduler_drives_the_local_optimizer():
    def worker(comm):
        torch.manual_seed(0)
        lin = nn.Linear(3, 4)
        opt = ShardedOptimizer(lin.parameters(), torch.optim.SGD, comm, reduce_scatter=True,
                               lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
        for _ in range(3):
            opt.zero_grad()
            lin(torch.ones(2, 3)).sum().backward()
            opt.step()
            sched.step()
        return opt.optim.param_groups[0]["lr"], lin.weight.detach().clone()
    res = sim.run(worker, 2)
    assert res[0][0] == 0.1 * 0.5 ** 2  # the lr of the last step, passed to the shard's SGD
    torch.manual_seed(0)
    lin = nn.Linear(3, 4)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    for _ in range(3):
        opt.zero_grad()
        lin(torch.ones(2, 3)).sum().backward()
        opt.step()
        sched.step()
    assert res[0][1].equal(lin.weight) and res[1][1].equal(lin.weight)


def test_bad_arguments_name_the_parameter():
    lin = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="optimizer_cls"):
        ShardedOptimizer(lin.parameters(), torch.optim.AdamW(lin.parameters()), comm=object())
    with pytest.raises(ValueError, match="optimizer_cls"):
        ShardedOptimizer(lin.parameters(), nn.Linear, comm=object())
    with pytest.raises(ValueError, match="reduce_scatter"):
        ShardedOptimizer(lin.parameters(), torch.optim.SGD, comm=object(), reduce_scatter="yes")
    with pytest.raises(ValueError, match="reduce_scatter"):  # before any process group is needed
        ShardedOptimizer(lin.parameters(), torch.optim.SGD, reduce_scatter=1)
    with pytest.raises(ValueError, match="params is empty"):
        ShardedOptimizer([], torch.optim.SGD, comm=object())
    with pytest.raises(ValueError, match="params must be tensors or parameter-group dicts"):
        ShardedOptimizer([lin.weight, {"params": [lin.bias]}], torch.optim.SGD, comm=object())


def test_a_tensor_given_twice_in_a_group_is_optimized_once_without_a_warning():
    import warnings

    def worker(comm):
        lin = nn.Linear(3, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch warns of a repeated tensor: never reached
            opt = ShardedOptimizer([lin.weight, lin.weight, lin.bias], torch.optim.SGD, comm,
                                   lr=0.1)
        return [len(g["params"]) for g in opt.param_groups]

    assert sim.run(worker, 2)[0] == [2]


def test_state_dict_of_sgd_with_and_without_momentum():
    """The state's names come from the optimizer class itself: SGD with momentum has a
    per-element `momentum_buffer`, without momentum no state at all (as torch's)."""
    def worker(comm, momentum):
        torch.manual_seed(0)
        lin = nn.Linear(3, 4)
        opt = ShardedOptimizer(lin.parameters(), torch.optim.SGD, comm, reduce_scatter=True,
                               lr=0.1, momentum=momentum)
        for _ in range(2):
            opt.zero_grad()
            lin(torch.ones(2, 3)).sum().backward()
            opt.step()
        opt.consolidate_state_dict(to=1)
        return opt.state_dict()["state"] if comm.rank == 1 else None

    torch.manual_seed(0)
    lin = nn.Linear(3, 4)
    ref = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        ref.zero_grad()
        lin(torch.ones(2, 3)).sum().backward()
        ref.step()
    state = sim.run(worker, 3, args=(0.9,))[1]
    assert state.keys() == ref.state_dict()["state"].keys() == {0, 1}
    for i, st in ref.state_dict()["state"].items():
        torch.testing.assert_close(state[i]["momentum_buffer"], st["momentum_buffer"])
    assert sim.run(worker, 3, args=(0.0,))[1] == {}


@pytest.mark.parametrize("reduce_scatter", [False, True])
@pytest.mark.parametrize("clip", [(0.05, 2.0), (0.01, float("inf")), (100.0, 1.0)])
def test_clip_grad_norm_equals_torchs_on_the_averaged_gradients(reduce_scatter, clip):
    """With reduce_scatter=True the averaged gradients exist only as shards: the norm is
    summed over ranks. (0.05, 2) and (0.01, inf) clip every step; 100 never does."""
    want, want_norms = _reference(3, clip)
    for params, _, _, norms in sim.run(_worker, 3, args=(reduce_scatter,),
                                       kwargs={"clip": clip}):
        _close(params, want)
        assert norms == pytest.approx(want_norms, rel=1e-6)
    assert (min(want_norms) > clip[0]) == (clip[0] < 1)


def test_state_is_consolidated_on_one_rank_only():
    """Every rank sends its shard's moments to rank `to`, and only `to` can answer."""
    def worker(comm, to):
        model = Tied()
        opt = ShardedOptimizer(_groups(model), torch.optim.AdamW, comm, reduce_scatter=True, **KW)
        F.cross_entropy(model(_batch(0, comm.rank)[0]), _batch(0, comm.rank)[1]).backward()
        opt.step()
        comm.ledger.reset()
        opt.consolidate_state_dict(to=to)
        try:
            answer = opt.state_dict()["state"].keys()
        except RuntimeError as e:
            answer = str(e)
        return answer, comm.ledger.ops["consolidate"].sent, len(opt.layout.pieces(
            torch.zeros(opt.layout.numel))[comm.rank])
    for to in (0, 2):
        res = sim.run(worker, 3, args=(to,))
        for r, (answer, sent, shard) in enumerate(res):
            if r == to:
                assert answer == {0, 1, 3, 4} and sent == 0  # the tied weight once, frozen: none
            else:
                assert "consolidate_state_dict(to=...)" in answer
                assert sent == 2 * 4 * shard  # exp_avg and exp_avg_sq of my shard, fp32


def test_non_element_wise_optimizers_and_late_groups_are_refused():
    lin = nn.Linear(2, 2)
    for cls in (torch.optim.Adafactor, torch.optim.LBFGS, torch.optim.SparseAdam,
                type("MyAdafactor", (torch.optim.Adafactor,), {})):
        with pytest.raises(ValueError, match="optimizer_cls=.*not element-wise"):
            ShardedOptimizer(lin.parameters(), cls, comm=object())
    if hasattr(torch.optim, "Muon"):
        with pytest.raises(ValueError, match="optimizer_cls=Muon"):
            ShardedOptimizer(lin.parameters(), torch.optim.Muon, comm=object())

    def worker(comm):
        opt = ShardedOptimizer([lin.weight], torch.optim.SGD, comm, lr=0.1)
        with pytest.raises(NotImplementedError, match="add_param_group"):
            opt.add_param_group({"params": [lin.bias]})
        with pytest.raises(ValueError, match="to=3"):
            opt.consolidate_state_dict(to=3)
        return len(opt.param_groups)
    assert sim.run(worker, 2)[0] == 1
