"""train.run: every strategy, with and without accumulation, trains to "single"'s parameters."""

from dataclasses import replace

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from syncedu import Network, launch, train
from syncedu.train import data, models, sampling

JOB = dict(steps=12, global_batch=48, lr=0.2, seed=3)
SHORT = dict(JOB, steps=4)
SIM = dict(simulate=True, network=Network(latency=1e-5, bandwidth=1e9))


@pytest.fixture(scope="module")
def ref():
    return train.run("single", 1, **JOB)


@pytest.fixture(scope="module")
def ref_short():
    """The reference of `SHORT`: the byte-counting tests need few steps to count."""
    return train.run("single", 1, **SHORT)


@pytest.fixture(scope="module")
def pool():
    with launch.Pool(2, output="quiet") as p:
        yield p


# ------------------------------------------------------------------ sampling
def test_global_batches_are_deterministic_and_cross_epochs():
    a = list(sampling.global_batches(100, 7, 30, seed=5))
    b = list(sampling.global_batches(100, 7, 30, seed=5))
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == 7
    assert torch.equal(torch.cat(a[:3]).sort().values, torch.cat(a[:3]).unique())  # epoch 0
    assert not torch.equal(a[0], a[3])  # epoch 1 has a new order...
    stale = list(sampling.global_batches(100, 7, 30, seed=5, set_epoch=False))
    assert torch.equal(stale[0], stale[3])  # ...unless set_epoch is forgotten


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_distributed_sampler(world_size):
    ds = data.digits()
    b = 16
    ours = list(sampling.global_batches(ds, 2 * (len(ds) // (b * world_size)), b * world_size,
                                        seed=7))
    for rank in range(world_size):
        sampler = DistributedSampler(ds, world_size, rank, shuffle=True, seed=7)
        theirs = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            theirs += list(DataLoader(list(range(len(ds))), b, sampler=sampler, drop_last=True))
        assert len(theirs) == len(ours)
        for g, t in zip(ours, theirs):
            assert torch.equal(sampling.shard(g, rank, world_size), t)


def test_sampling_errors():
    with pytest.raises(ValueError, match="global_batch"):
        list(sampling.global_batches(10, 1, 11))
    with pytest.raises(ValueError, match="world_size=3"):
        sampling.shard(torch.arange(10), 0, 3)
    with pytest.raises(ValueError, match="accumulation=3"):
        sampling.micro_batches(torch.arange(10), 3)


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("kwargs, match", [
    (dict(strategy="magic"), "strategy"),
    (dict(strategy="single", world_size=2), "world_size"),
    (dict(global_batch=50, accumulation=4), "multiple"),
    (dict(lr=0.0), "lr"),
    (dict(mistake="oops"), "mistake"),
    (dict(steps=0), "steps"),
    (dict(optimizer="lamb"), "optimizer"),
    (dict(optimizer="adam", momentum=0.9), "momentum"),
    (dict(sync_every=0, strategy="local_sgd"), "sync_every"),
    (dict(sync_every=4), "sync_every"),
    (dict(strategy="single", world_size=1, compression="fp16"), "compression"),
    (dict(compression="zip"), "compression"),
    (dict(dtype="float16"), "dtype"),
    (dict(dtype="float64"), r"dtype='float64' applies to strategy in \('single', 'naive'"),
    (dict(dtype="float64", strategy="naive", compression="fp16"), "compression='fp16'"),
    (dict(holdout=-1), "holdout"),
    (dict(holdout=1790), "global_batch=8 must be <= the training set's size 7"),
    (dict(broadcast_buffers=1), "broadcast_buffers"),
])
def test_config_errors(kwargs, match):
    args = dict(strategy="flat", world_size=2, steps=1, global_batch=8) | kwargs
    with pytest.raises(ValueError, match=match):
        train.TrainConfig(**args)


def test_unknown_strategy_lists_the_allowed_ones():
    # The registry's order (registration order), whatever it is: every topic's names.
    every = r"choose one of (?=.*'local_sgd')(?=.*'zero1')(?=.*'horovod')"
    with pytest.raises(ValueError, match=every):
        train.TrainConfig("fancy", 2, steps=1, global_batch=8)


def test_every_strategy_has_a_factory():
    from syncedu.train import strategies as ts

    assert set(train.STRATEGIES) <= set(ts.FACTORIES)


def test_a_registered_strategy_plugs_in(monkeypatch):
    from syncedu.train import strategies as ts

    calls = []

    def plain(module, comm, cfg):  # "zero1" stands in for any registered name
        calls.append(comm.rank)
        return ts.FACTORIES["flat"](module, comm, replace(cfg, strategy="flat"))

    monkeypatch.setitem(ts.FACTORIES, "zero1", plain)
    h = train.run("zero1", 2, **SIM, **JOB)
    assert calls == [0, 1] and h.loss == train.run("flat", 2, **SIM, **JOB).loss


def test_single_runs_on_a_world_size_one_comm():
    from syncedu.comm.base import Comm
    from syncedu.comm.local import LocalComm

    comm = LocalComm()
    assert isinstance(comm, Comm) and (comm.rank, comm.world_size) == (0, 1)
    t = torch.arange(4.0)
    assert torch.equal(comm.all_reduce(t, op="avg"), torch.arange(4.0))
    comm.barrier()
    with pytest.raises(ValueError, match="dst"):
        comm.send(t, 1)
    assert comm.ledger.sent == 0


def test_single_is_seeded(ref):
    again = train.run("single", 1, **JOB)
    assert again.loss == ref.loss and again.max_param_diff(ref) == 0
    assert ref.loss[-1] < ref.loss[0]
    assert ref.ledger.sent == [0]


def test_warmup_schedule():
    cfg = train.TrainConfig("single", 1, steps=10, global_batch=8, lr=0.4, warmup_steps=4)
    assert [cfg.lr_at(s) for s in range(6)] == [0.1, 0.2, 0.30000000000000004, 0.4, 0.4, 0.4]


# ------------------------------------------------------------------ equal to single
@pytest.mark.parametrize("strategy", ["naive", "flat", "bucketed"])
def test_simulated_three_ranks_equal_single(strategy, ref):
    job = dict(JOB, global_batch=54)
    ref3 = train.run("single", 1, **job)
    for k in (1, 3):
        h = train.run(strategy, 3, accumulation=k, simulate=True, bucket_cap_mb=0.01,
                      network=Network(latency=1e-5, bandwidth=1e9), **job)
        assert h.max_param_diff(ref3) < 1e-5, (strategy, k)
        assert max(abs(a - b) for a, b in zip(h.loss, ref3.loss)) < 1e-5
        assert h.sim_seconds > 0


# ------------------------------------------------------------------ local SGD


@pytest.mark.parametrize("opt", [dict(), dict(momentum=0.9)])
def test_local_sgd_every_step_is_flat(opt):
    flat = train.run("flat", 2, **SIM, **JOB, **opt)
    local = train.run("local_sgd", 2, sync_every=1, **SIM, **JOB, **opt)
    # SGD's update is linear in each rank's state (gradient, momentum buffer), so
    # averaging parameters after the step equals averaging gradients before it.
    assert local.max_param_diff(flat) < 1e-5
    assert local.ledger.sent == flat.ledger.sent


def test_local_sgd_adam_every_step_is_not_flat():
    job = dict(JOB, lr=0.01, optimizer="adam")
    flat = train.run("flat", 2, **SIM, **job)
    local = train.run("local_sgd", 2, sync_every=1, **SIM, **job)
    assert local.max_param_diff(flat) > 1e-3  # Adam divides by sqrt(v): not linear


def test_local_sgd_sends_one_hth_of_the_parameters():
    h = 4
    flat = train.run("flat", 2, **SIM, **JOB)
    local = train.run("local_sgd", 2, sync_every=h, **SIM, **JOB)
    assert JOB["steps"] % h == 0
    for r in range(2):
        assert local.ledger.sent[r] * h == flat.ledger.sent[r]
        assert local.ledger.ops["all_reduce"].calls[r] * h == JOB["steps"]
    assert local.max_param_diff(flat) > 1e-4  # the copies drifted between averages
    assert local.loss[-1] < local.loss[0]
    odd = train.run("local_sgd", 2, sync_every=5, **SIM, **JOB)  # 12 = 5 + 5 + 2 local steps
    assert odd.ledger.ops["all_reduce"].calls == [3, 3]  # the last partial period is averaged


# ------------------------------------------------------------------ compression
@pytest.mark.parametrize("strategy", ["naive", "flat", "bucketed"])
def test_fp16_halves_the_gradient_bytes(strategy):
    plain = train.run(strategy, 2, bucket_cap_mb=0.01, **SIM, **JOB)
    half = train.run(strategy, 2, bucket_cap_mb=0.01, compression="fp16", **SIM, **JOB)
    assert [2 * b for b in half.ledger.sent] == plain.ledger.sent
    assert half.max_param_diff(plain) < 1e-2 and half.loss[-1] < half.loss[0]


@pytest.mark.real
def test_fp16_halves_ddp_bytes(pool):
    plain = train.run("ddp", 2, pool=pool, **SHORT)
    half = train.run("ddp", 2, pool=pool, compression="fp16", **SHORT)
    assert plain.grad_bytes > 0 and 2 * half.grad_bytes == plain.grad_bytes
    assert half.max_param_diff(plain) < 1e-2
    # DDP's buckets bypass the comm: charged by the ring formula ("modeled"), never "counted"
    assert plain.ledger.counted.sent == [0, 0] and plain.ledger.modeled.sent == plain.ledger.sent


def _post_local(comm):
    from syncedu.tuning.local_sgd import LocalSGD

    local = LocalSGD(torch.nn.Linear(2, 2), comm, sync_every=4, start_local_at=3)
    return [local.after_step() for _ in range(10)], local.averages


def test_post_local_sgd_averages_every_step_first():
    from syncedu.comm import sim
    from syncedu.tuning.local_sgd import LocalSGD

    did, averages = sim.run(_post_local, 2)[0]
    assert did == [True, True, True, True, False, False, False, True, False, False]
    assert averages == 5
    for bad in (dict(sync_every=0), dict(start_local_at=-1), dict(sync_every=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LocalSGD(torch.nn.Linear(2, 2), None, **bad)


@pytest.mark.real
def test_local_sgd_real_ranks(pool):
    flat = train.run("flat", 2, pool=pool, **JOB)
    local = train.run("local_sgd", 2, sync_every=1, pool=pool, **JOB)
    assert local.max_param_diff(flat) < 1e-5


@pytest.mark.real
@pytest.mark.parametrize("strategy", ["naive", "flat", "bucketed", "ddp"])
def test_real_ranks_equal_single(strategy, ref, pool):
    for k in (1, 3):
        h = train.run(strategy, 2, accumulation=k, pool=pool, bucket_cap_mb=0.01, **JOB)
        assert h.max_param_diff(ref) < 1e-5, (strategy, k)
        assert max(abs(a - b) for a, b in zip(h.loss, ref.loss)) < 1e-5
        assert h.train_seconds > 0 and len(h.step_seconds) == JOB["steps"]
        assert set(h.params) == set(ref.params)  # plain names, no "module." prefix


@pytest.mark.real
def test_accumulation_bytes_and_mistakes(pool, ref_short):
    k, ref = 4, ref_short
    one = train.run("ddp", 2, pool=pool, **SHORT).grad_bytes
    right = {s: train.run(s, 2, accumulation=k, pool=pool, **SHORT) for s in ("bucketed", "ddp")}
    for s, h in right.items():
        assert h.grad_bytes == one, s  # no_sync: one sync per optimizer step
        assert h.max_param_diff(ref) < 1e-5
        for mistake in ("sync_every", "partial_no_sync"):
            bad = train.run(s, 2, accumulation=k, pool=pool, mistake=mistake, **SHORT)
            assert bad.grad_bytes == k * one, (s, mistake)  # K syncs: (K-1)/K wasted
            assert bad.max_param_diff(ref) < 1e-5  # same result, only slower
    wrong = train.run("bucketed", 2, accumulation=k, pool=pool, mistake="unscaled_loss", **SHORT)
    assert wrong.max_param_diff(ref) > 1e-3


@pytest.mark.real
def test_progress_chunks_and_network(pool, ref):
    h = train.run("bucketed", 2, pool=pool, progress=True, timeline_steps=2, **JOB)
    assert h.max_param_diff(ref) < 1e-5
    assert {k for k, _, _ in h.timeline} >= {"compute", "step", "comm"}
    with pytest.raises(ValueError, match="pool"):
        train.run("bucketed", 2, pool=pool, network=Network(latency=1e-3, bandwidth=1e9), **JOB)
    with pytest.raises(ValueError, match="simulated"):
        train.run("ddp", 2, simulate=True, **JOB)


def test_timeline_model():
    from syncedu.dp import timeline

    net = Network(latency=1e-4, bandwidth=1e9)
    buckets = timeline.bucket_sizes(10_000_000, 3_000_000)
    assert buckets == [3_000_000] * 3 + [1_000_000]
    over = timeline.schedule(buckets, 4, net, forward=0.01, backward=0.02)
    serial = timeline.schedule(buckets, 4, net, forward=0.01, backward=0.02, overlap=False)
    assert over.seconds < serial.seconds and over.comm == pytest.approx(serial.comm)
    assert serial.seconds == pytest.approx(0.03 + serial.comm)
    assert timeline.accumulation_time(4, 2, net, 1000, micro_compute=0.01, sync_every=True) > \
        timeline.accumulation_time(4, 2, net, 1000, micro_compute=0.01)


def test_digits_read_from_the_bundled_file_equal_scikit_learns_loader():
    """`data.digits()` reads sklearn's csv without importing sklearn: the same bits as
    `load_digits()`, scaled by 1/16, in both shapes."""
    from sklearn.datasets import load_digits

    from syncedu.train import data

    bunch = load_digits()
    x, y = data.digits().tensors
    assert x.shape == (1797, 64) and y.dtype == torch.int64
    assert torch.equal(x, torch.tensor(bunch.data, dtype=torch.float32) / 16.0)
    assert torch.equal(y, torch.tensor(bunch.target))
    assert torch.equal(data.digits(images=True).tensors[0], x.view(-1, 1, 8, 8))


def test_float64_runs_widen_the_same_start_and_agree_with_float32_early():
    """`dtype="float64"` trains the same float32 initial weights and data, widened: the first
    loss is the same to float32's precision, and the final parameters are float64."""
    f32 = train.run("single", 1, steps=3, global_batch=32, lr=0.1)
    f64 = train.run("single", 1, steps=3, global_batch=32, lr=0.1, dtype="float64")
    assert all(p.dtype == torch.float64 for p in f64.params.values())
    assert f64.loss[0] == pytest.approx(f32.loss[0], rel=1e-6) and f64.loss[0] != f32.loss[0]


# ------------------------------------------------------------------ held-out data, own buffers
def test_holdout_trains_on_the_rest_and_measures_on_the_held_out():
    whole = data.digits()
    train_part, test_part = data.holdout_split(whole, 300, seed=3)
    assert (len(train_part), len(test_part)) == (1497, 300)
    # What a rank trains on (its Session's data) holds none of the held-out samples:
    from syncedu.comm import sim
    from syncedu.train.train_rank import Session

    cfg = train.TrainConfig("naive", 2, steps=1, global_batch=32, seed=3, holdout=300)
    trained = sim.run(lambda comm: Session(comm, cfg).x, 2)[0]
    seen = {tuple(r.tolist()) for r in trained}
    assert len(trained) == 1497 and not any(tuple(r.tolist()) in seen
                                            for r in test_part.tensors[0])
    h = train.run("single", 1, steps=5, global_batch=32, seed=3, holdout=300)
    model = models.make("mlp", seed=3)
    model.load_state_dict(h.params)
    with torch.no_grad():
        want = (model(test_part.tensors[0]).argmax(1) == test_part.tensors[1]).float().mean()
    assert h.accuracy == pytest.approx(want.item()) and h.rank_accuracy == [h.accuracy]
    with pytest.raises(ValueError, match="holdout"):
        data.holdout_split(whole, len(whole))


def test_without_broadcast_buffers_each_rank_keeps_its_own_batchnorm_statistics():
    job = dict(steps=6, global_batch=8, model="cnn", model_kwargs={"channels": 4},
               simulate=True, lr=0.05)
    spread = {}
    for broadcast in (True, False):
        h = train.run("naive", 4, broadcast_buffers=broadcast, **job)
        var = torch.stack([b["features.1.running_var"] for b in h.rank_buffers])
        spread[broadcast] = (var.max(0).values - var.min(0).values).max().item()
        assert len(h.rank_accuracy) == 4
    # DDP's default re-sends rank 0's buffers every forward: they differ by one step's update
    assert 0 < spread[True] < spread[False]
