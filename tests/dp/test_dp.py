"""DataParallel strategies (naive, flat, bucketed) against one process and against DDP."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from syncedu import dp
from syncedu.comm import sim
from syncedu.dp.buckets import build_buckets

STRATS = ("naive", "flat", "bucketed")


class Odd(nn.Module):
    """Odd sizes, a tied weight used twice, a frozen layer, a buffer."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(7, 13)
        self.frozen = nn.Linear(13, 13)
        self.frozen.requires_grad_(False)
        self.b = nn.Linear(13, 13)
        self.c = nn.Linear(13, 5)
        self.c2 = self.c  # tied: the same module twice
        self.register_buffer("scale", torch.full((1,), 1.0 + seed))

    def forward(self, x):
        h = torch.tanh(self.b(self.frozen(torch.tanh(self.a(x)))))
        return self.c(h) + self.c2(h) * self.scale


def _batch(rank, n=4):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, 7, generator=g), torch.randint(0, 5, (n,), generator=g)


def _worker(comm, strategy, cap=0.0005, micro=1):
    model = Odd(seed=comm.rank)  # different on every rank: the broadcast must fix that
    wrapped = dp.DataParallel(model, comm, strategy, bucket_cap_mb=cap)
    comm.ledger.reset()
    x, y = _batch(comm.rank)
    for k, (xs, ys) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
        ctx = wrapped.no_sync() if k < micro - 1 else torch.enable_grad()
        with ctx:
            F.cross_entropy(wrapped(xs), ys).div(micro).backward()
        wrapped.finish_gradient_synchronization()
    grads = {k: (p.grad.clone() if p.grad is not None else None)
             for k, p in model.named_parameters()}
    wrapped.close()
    return grads, {k: v.clone() for k, v in model.state_dict().items()}


def _reference(world_size):
    model = Odd(seed=0)
    xs, ys = zip(*[_batch(r) for r in range(world_size)])
    F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
    return {k: p.grad for k, p in model.named_parameters()}


def _close(grads, ref):
    assert grads.keys() == ref.keys()
    for k in ref:
        if ref[k] is None:
            assert grads[k] is None, k
        else:
            torch.testing.assert_close(grads[k], ref[k], atol=1e-6, rtol=1e-5)


def _trainable_bytes():
    return sum(p.numel() * 4 for p in dp.trainable_parameters(Odd(0)))


@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("world_size", [1, 3])
def test_equal_to_one_process_on_sim(strategy, world_size):
    res = sim.run(_worker, world_size, args=(strategy,))
    ref = _reference(world_size)
    for grads, state in res:
        _close(grads, ref)
        torch.testing.assert_close(state["scale"], torch.ones(1))  # rank 0's buffer
    # frozen never sent, tied sent once: exactly the trainable bytes go through allreduce
    # (a ring sends every element 2(N-1) times in all, whatever the chunking)
    assert sum(res.ledger.ops["all_reduce"].sent) == _trainable_bytes() * 2 * (world_size - 1)


@pytest.mark.parametrize("strategy", STRATS)
def test_no_sync_accumulation_sends_once(strategy):
    res = sim.run(_worker, 3, args=(strategy, 0.0005, 2))
    for grads, _ in res:
        _close(grads, _reference(3))
    once = sim.run(_worker, 3, args=(strategy, 0.0005, 1)).ledger.ops["all_reduce"].sent
    assert res.ledger.ops["all_reduce"].sent == once


def _partial(comm, strategy):
    model = Odd(seed=0)
    wrapped = dp.DataParallel(model, comm, strategy)
    comm.ledger.reset()
    x, y = _batch(comm.rank)
    loss = F.cross_entropy(wrapped(x), y)  # forward outside no_sync: it will sync
    with wrapped.no_sync():
        loss.backward()
    wrapped.finish_gradient_synchronization()
    with wrapped.no_sync():  # both inside: nothing sent
        F.cross_entropy(wrapped(x), y).backward()
    wrapped.finish_gradient_synchronization()
    wrapped.close()
    return comm.ledger.ops["all_reduce"].calls if "all_reduce" in comm.ledger.ops else 0


@pytest.mark.parametrize("strategy", STRATS)
def test_partial_no_sync_still_syncs(strategy):
    calls = sim.run(_partial, 2, args=(strategy,))
    assert calls[0] >= 1  # only the first backward was synchronized...
    single = sim.run(_worker, 2, args=(strategy, 25.0)).ledger.ops["all_reduce"].calls[0]
    assert calls[0] == single  # ...and only once


def _compressed_worker(comm, strategy):
    model = Odd(seed=comm.rank)
    wrapped = dp.DataParallel(model, comm, strategy, bucket_cap_mb=0.0005, compression="fp16")
    comm.ledger.reset()
    x, y = _batch(comm.rank)
    F.cross_entropy(wrapped(x), y).backward()
    wrapped.finish_gradient_synchronization()
    return {k: (p.grad.clone() if p.grad is not None else None)
            for k, p in model.named_parameters()}


@pytest.mark.parametrize("strategy", STRATS)
def test_fp16_compression_halves_bytes(strategy):
    res = sim.run(_compressed_worker, 2, args=(strategy,))
    ref = _reference(2)
    for k in ref:
        if ref[k] is not None:  # 16 bits on the wire: about 3 decimal digits
            torch.testing.assert_close(res[0][k], ref[k], atol=1e-3, rtol=1e-2)
    plain = sim.run(_worker, 2, args=(strategy,)).ledger.ops["all_reduce"].sent
    assert [2 * b for b in res.ledger.ops["all_reduce"].sent] == plain  # buffers aside


def _steps_worker(comm, strategy, set_to_none):
    model = Odd(seed=0)
    wrapped = dp.DataParallel(model, comm, strategy, bucket_cap_mb=0.0005)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = []
    for step in range(3):
        opt.zero_grad(set_to_none=set_to_none)
        x, y = _batch(comm.rank + 10 * step)
        F.cross_entropy(wrapped(x), y).backward()
        wrapped.finish_gradient_synchronization()
        grads.append(torch.cat([p.grad.reshape(-1) for p in dp.trainable_parameters(model)]))
        opt.step()
    return grads


@pytest.mark.parametrize("set_to_none", [True, False])
def test_bucketed_gradients_across_steps_equal_flat(set_to_none):
    # bucketed leaves .grad as views of its buckets: zeroing them in place or
    # dropping them must both give flat's gradients at every step.
    flat = sim.run(_steps_worker, 2, args=("flat", set_to_none))[0]
    bucketed = sim.run(_steps_worker, 2, args=("bucketed", set_to_none))[0]
    for a, b in zip(flat, bucketed):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)


def test_buckets_reverse_order_and_cap():
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 20, 30, 5)]
    # DDP's rule: a bucket closes once it holds the cap or more.
    buckets = build_buckets(params, cap_bytes=100)
    assert [[p.numel() for p in b.params] for b in buckets] == [[5, 30], [20, 10]]
    buckets = build_buckets(params, cap_bytes=200)
    assert [[p.numel() for p in b.params] for b in buckets] == [[5, 30, 20], [10]]
    assert [b.buffer.numel() for b in buckets] == [55, 10]
    assert len(build_buckets(params, cap_bytes=1)) == 4  # one parameter each
    with pytest.raises(ValueError, match="bucket"):
        build_buckets(params, 0)


def test_registry_and_errors():
    assert set(STRATS) <= set(dp.STRATEGIES)
    with pytest.raises(ValueError, match="strategy='magic'"):
        dp.DataParallel(nn.Linear(2, 2), None, "magic")


def test_timeline_records_forward_backward_and_wait_per_micro_batch():
    from syncedu import train

    h = train.run("flat", 2, simulate=True, steps=2, global_batch=16, accumulation=2,
                  timeline_steps=1)
    kinds = [k for k, _, _ in h.timeline]
    assert kinds.count("forward") == kinds.count("backward") == kinds.count("wait") == 2
    (span,) = [(s, e) for k, s, e in h.timeline if k == "compute"]
    phases = [(s, e) for k, s, e in h.timeline if k in ("forward", "backward", "wait")]
    assert phases[0][0] >= span[0] and phases[-1][1] <= span[1] + 1e-6  # inside the span
    assert all(b[0] >= a[1] - 1e-9 for a, b in zip(phases, phases[1:]))  # in order, no overlap


# ------------------------------------------------------------------ real ranks
def _ddp_worker(comm):
    from torch.nn.parallel import DistributedDataParallel

    model = Odd(seed=comm.rank)
    ddp = DistributedDataParallel(model)
    x, y = _batch(comm.rank)
    F.cross_entropy(ddp(x), y).backward()
    return {k: (p.grad.clone() if p.grad is not None else None)
            for k, p in model.named_parameters()}


@pytest.mark.real
def test_equal_to_ddp_on_real_ranks(pool):
    ddp_grads = pool.run(_ddp_worker)[0]
    _close(ddp_grads, _reference(2))
    for strategy in STRATS:
        res = pool.run(_worker, (strategy, 0.0005, 2))
        for grads, _ in res:
            _close(grads, ddp_grads)


def _default_group_worker(comm):
    from syncedu.comm import TorchComm

    own = TorchComm()  # a script that set up torch.distributed itself
    grads, _ = _worker(own, "bucketed", 0.0002)
    return grads


@pytest.mark.real
def test_torchcomm_over_default_group(pool):
    res = pool.run(_default_group_worker)
    _close(res[0], _reference(2))
    _close(res[1], _reference(2))
