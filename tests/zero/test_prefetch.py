"""zero.FullyShard's `prefetch` (issue 45 item 5): the same parameters with it on and off
(simulated ranks bit for bit, real Gloo ranks at N = 2 and 3), the trace showing the next
unit's all-gather leave before the current unit's compute ends (forward, and backward in the
reverse of the forward's order), `prefetch` validated. Step time and peak memory against
lesson 10's model: tests/zero/test_lesson10.py."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from syncedu.comm import launch, sim
from syncedu.comm.network import Network
from syncedu.train import models
from syncedu.train.layer_compute import LayerCompute
from syncedu.zero.fully_shard import FullyShard
from syncedu.zero.hsdp import HybridShard


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Net(nn.Module):  # test_fully_shard's: odd row counts, a norm in the root's unit, a scalar
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.norm, self.fc2 = nn.Linear(6, 5), RMSNorm(5), nn.Linear(5, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x)))) * self.scale


def _batch(step, rank, size=4):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def _encoder():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), *(nn.TransformerEncoderLayer(
        16, 2, 32, dropout=0.0, batch_first=True) for _ in range(2)), nn.Linear(16, 3))


def _train(comm, prefetch, shard=(nn.Linear, RMSNorm), compute_dtype=None, micro=1,
           make=Net, nodes=None, steps=3):
    """`steps` AdamW steps (micro-batches through no_sync): full parameters and the last grads."""
    kwargs = dict(shard=shard, compute_dtype=compute_dtype, prefetch=prefetch)
    fs = HybridShard(make(), comm, nodes=nodes, **kwargs) if nodes else FullyShard(make(), comm,
                                                                                     **kwargs)
    opt = torch.optim.AdamW(fs.module.parameters(), lr=1e-2)
    for step in range(steps):
        opt.zero_grad()
        x, y = _batch(step, comm.rank, size=4)
        for k, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
            with fs.no_sync() if k < micro - 1 else torch.enable_grad():
                (F.cross_entropy(fs(xm).float(), ym) / micro).backward()
        fs.clip_grad_norm_(1.0)
        grads = [p.grad.clone() for p in fs.module.parameters()]
        opt.step()
    return fs.full_parameters(), grads, fs.gathered_bytes


def _equal(a, b):
    assert a[0].keys() == b[0].keys()
    assert all(a[0][k].equal(b[0][k]) for k in a[0]), "parameters differ"
    assert all(x.equal(y) for x, y in zip(a[1], b[1])), "gradients differ"


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("case", [{}, {"shard": None}, {"compute_dtype": torch.bfloat16},
                                  {"micro": 2}, {"shard": (nn.Linear,)}])
def test_prefetch_on_equals_off_bit_for_bit_on_simulated_ranks(n, case):
    on, off = (sim.run(_train, n, args=(p,), kwargs=case) for p in (True, False))
    for r in range(n):
        _equal(on[r], off[r])
        assert on[r][2] == 0  # no gathered weights left alive after the step


def test_prefetch_on_equals_off_with_tied_weights_attention_and_hsdp():
    def gpt_train(comm, prefetch):  # tied embedding, nn.MultiheadAttention, LayerNorm
        fs = FullyShard(models.make("gpt"), comm, shard=(models.Block,), prefetch=prefetch)
        opt = torch.optim.AdamW(fs.module.parameters(), lr=1e-2)
        for step in range(2):
            opt.zero_grad()
            g = torch.Generator().manual_seed(10 * step + comm.rank)
            tokens = torch.randint(0, 512, (2, 9), generator=g)  # GPT: vocab 512
            out = fs(tokens[:, :-1])
            F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten()).backward()
            fs.clip_grad_norm_(1.0)
            opt.step()
        return fs.full_parameters(), [p.grad for p in fs.module.parameters()]

    on, off = (sim.run(gpt_train, 2, args=(p,)) for p in (True, False))
    _equal(on[0], off[0])
    for shard in (None, (nn.TransformerEncoderLayer,)):  # reads out_proj.weight directly
        on, off = (sim.run(_train, 3, args=(p,), kwargs={"make": _encoder, "shard": shard})
                   for p in (True, False))
        _equal(on[2], off[2])
    net = Network.cluster(nodes=2, gpus_per_node=2)
    on, off = (sim.run(_train, 4, args=(p,), kwargs={"nodes": 2}, network=net)
               for p in (True, False))
    for r in range(4):
        _equal(on[r], off[r])


@pytest.mark.real
@pytest.mark.parametrize("n", [2, 3])
def test_prefetch_on_equals_off_on_real_gloo_ranks(n):
    runs = [launch.run(_train, n, args=(p,), output="quiet", timeout=120) for p in (True, False)]
    for r in range(n):
        _equal(runs[0][r], runs[1][r])


def _timed(comm, prefetch):
    """Two steps of four Linear(64, 64) units with modeled compute; the second step's compute
    intervals (forward, then backward: LayerCompute charges it as the gradient reaches a
    layer) and its start."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    charge = LayerCompute(model, comm, 3e-3)
    fs = FullyShard(model, comm, shard=(nn.Linear,), prefetch=prefetch)
    charge.attach()
    log, compute = [], comm.compute
    comm.compute = lambda s: log.append((comm.now(), comm.now() + s)) or compute(s)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(comm.rank), requires_grad=True)
    for _ in range(2):
        comm.barrier()
        start, log[:] = comm.now(), []
        fs(x).square().mean().backward()
        fs.finish_gradient_synchronization()
    return start, log


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_trace_shows_the_next_gather_leave_during_the_current_compute(prefetch):
    # A fast link, so a message leaves when it is issued (on a slow one it queues behind the
    # reduce-scatter before it on the port: comm-bound, as lesson 10's model has it).
    res = sim.run(_timed, 2, args=(prefetch,), network=Network(latency=1e-6, bandwidth=1e10))
    start, log = res[0]
    t = res.trace
    mine = (t.src == 0) & (t.op == "all_gather") & (t.start >= start)
    gathers = sorted(t.start[mine].tolist())  # N = 2: one message per all-gather
    assert len(gathers) == 8 and len(log) == 8  # 4 units forward, 4 again backward
    fwd, bwd = log[:4], log[4:]  # bwd: units 3, 2, 1, 0
    for unit in range(3):  # forward: unit u+1's gather vs unit u's compute
        assert (gathers[unit + 1] <= fwd[unit][0]) == prefetch  # leaves as it starts
        assert (gathers[unit + 1] >= fwd[unit][1]) == (not prefetch)
    for k in range(1, 4):  # backward: the k-th unit's gather vs the compute charged for it
        assert (gathers[4 + k] <= bwd[k][0]) == prefetch  # left during the unit before's
        assert (gathers[4 + k] >= bwd[k][1]) == (not prefetch)


def test_prefetch_must_be_a_bool():
    for bad in (None, 1, "yes"):
        with pytest.raises(ValueError, match="prefetch"):
            FullyShard(Net(), object(), prefetch=bad)
