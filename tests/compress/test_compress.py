"""Gradient compressors: error bounds, exact ledger bytes, training, DDP hooks."""

import math

import pytest
import torch

from syncedu import compress, launch
from syncedu.comm import sim
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.compress.ddp import TorchPowerSGD
from syncedu.compress.lesson07 import sent_per_step, trained

ALL = [compress.FP16(), compress.BF16(), compress.TopK(0.1), compress.SignSGD(),
       compress.PowerSGD(2)]


def _grads(rank, shapes=((16, 8), (8,))):
    g = torch.Generator().manual_seed(rank)
    return [torch.randn(*s, generator=g) for s in shapes]


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize("make, param", [
    (lambda: compress.TopK(0), "ratio"), (lambda: compress.TopK(1.5), "ratio"),
    (lambda: compress.TopK(-0.1), "ratio"), (lambda: compress.PowerSGD(0), "rank"),
    (lambda: compress.PowerSGD(1, start_iter=-1), "start_iter"),
    (lambda: TorchPowerSGD(start_iter=1), "start_iter"), (lambda: TorchPowerSGD(0), "rank"),
    (lambda: compress.SignSGD(error_feedback="yes"), "error_feedback"),
    (lambda: compress.resolve("zip"), "compression"), (lambda: compress.resolve(3), "compression"),
])
def test_bad_input_names_the_parameter(make, param):
    with pytest.raises(ValueError, match=param):
        make()


def test_resolve():
    assert compress.resolve(None) is None and compress.resolve("none") is None
    assert isinstance(compress.resolve("fp16"), compress.FP16)
    assert isinstance(compress.resolve("powersgd"), compress.PowerSGD)
    c = compress.TopK(0.5)
    assert compress.resolve(c) is c


class _FakeComm:
    rank, world_size, backend = 0, 2, "nccl"


def test_backend_refusal_comes_before_any_traffic(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="bf16.*NCCL"):
        compress.BF16().average_(_FakeComm(), [torch.ones(3)])  # a fake comm: no traffic at all
    compress.FP16().check(_FakeComm())  # fp16 is fine there


# ------------------------------------------------- one round trip, one rank
@pytest.mark.parametrize("cls", [compress.FP16, compress.BF16])
def test_cast_roundtrip_bound(cls):
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 100
    # The relative bound holds in the normal range (fp16 below 6.1e-5 is subnormal).
    x = x.sign() * x.abs().clamp(min=1e-3)
    err = (x - cls.decompress(cls().compress(x), x)).abs()
    assert (err <= cls.unit_roundoff * x.abs()).all()


@pytest.mark.parametrize("ratio", [0.01, 0.1, 0.5, 1.0])
def test_topk_roundtrip_is_a_contraction(ratio):
    c, x = compress.TopK(ratio), torch.randn(1000)
    y = c.decompress(*c.compress(x), x.numel())
    k = c.k(x.numel())
    assert (x - y).pow(2).sum() <= (1 - k / x.numel()) * x.pow(2).sum() + 1e-6
    assert (y != 0).sum() == k


@pytest.mark.parametrize("numel", [1, 7, 8, 1001])
def test_sign_roundtrip_bound(numel):
    x = torch.randn(numel) + 0.1
    x[numel // 2] = 0.0 if numel > 1 else x[0]  # a zero counts as +
    y = compress.SignSGD.decompress(*compress.SignSGD.compress(x), numel)
    bound = (1 - x.abs().sum() ** 2 / (numel * x.pow(2).sum())) * x.pow(2).sum()
    assert torch.isclose((x - y).pow(2).sum(), bound, rtol=1e-4, atol=1e-6)


def test_powersgd_roundtrip_bound_and_exact_low_rank():
    c = compress.PowerSGD(2)
    m = torch.randn(30, 20)
    p, q = c.compress(m, torch.randn(20, 2))
    assert torch.linalg.norm(m - c.decompress(p, q)) <= torch.linalg.norm(m)
    low = torch.randn(30, 2) @ torch.randn(2, 20)  # rank 2: recovered exactly
    p, q = c.compress(low, torch.randn(20, 2))
    assert torch.allclose(c.decompress(p, q), low, atol=1e-4)


# ------------------------------------------------------ average over ranks
def _average(comm, c, shapes=((16, 8), (8,)), rounds=1):
    ts = _grads(comm.rank, shapes)
    for _ in range(rounds):
        c.average_(comm, ts, "b")
    return ts


@pytest.mark.parametrize("c", [compress.FP16(), compress.TopK(1.0),
                               compress.PowerSGD(1, start_iter=5)], ids=str)
def test_lossless_settings_give_the_average(c):
    res = sim.run(_average, 3, args=(c,))
    want = [sum(_grads(r)[i] for r in range(3)) / 3 for i in range(2)]
    for got in res:
        for g, w in zip(got, want):
            assert torch.allclose(g, w, atol=2e-3)


def test_fp16_divides_before_the_allreduce():
    def worker(comm, c):
        t = torch.full((4,), 40_000.0)  # 2 x 40000 > 65504: inf if summed in fp16
        c.average_(comm, [t])
        return t
    assert torch.equal(sim.run(worker, 2, args=(compress.FP16(),))[0], torch.full((4,), 40_000.0))
    assert torch.isinf(sim.run(worker, 2, args=(compress.FP16(divide_first=False),))[0]).all()


def test_state_is_kept_per_rank():
    c = compress.TopK(0.1)
    sim.run(_average, 2, args=(c,))
    r0, r1 = (c._state[("b", r)] for r in (0, 1))
    assert not torch.equal(r0, r1)


# --------------------------------------------------------- exact ledger bytes
@pytest.mark.parametrize("n", [2, 3, 4])
def test_fp16_and_bf16_send_exactly_half(n):
    def plain(comm):  # the same bucket, one fp32 allreduce
        comm.all_reduce(torch.cat([x.reshape(-1) for x in _grads(comm.rank)]))
    fp32 = sim.run(plain, n).ledger.sent
    for c in (compress.FP16(), compress.BF16()):
        assert [2 * b for b in sim.run(_average, n, args=(c,)).ledger.sent] == fp32


@pytest.mark.parametrize("n", [2, 4])
def test_topk_and_sign_bytes_grow_with_n(n):
    d = 16 * 8 + 8
    k = compress.TopK(0.1).k(d)
    res = sim.run(_average, n, args=(compress.TopK(0.1),))
    assert res.ledger.ops["all_gather"].sent == [(n - 1) * k * (4 + 4)] * n
    res = sim.run(_average, n, args=(compress.SignSGD(),))
    assert res.ledger.ops["all_gather"].sent == [(n - 1) * (math.ceil(d / 8) + 4)] * n


def _steps(comm, c, d, steps):
    out = []
    for s in range(steps):
        out.append(torch.randn(d, generator=torch.Generator().manual_seed(100 * s + comm.rank)))
        c.average_(comm, [out[-1]])
    return out


@pytest.mark.parametrize("n", [2, 4, 8])
def test_compressed_allreduce_bytes_stay_flat_with_n(n):
    """1-bit Adam's allreduce: a reduce-scatter and an all-gather of N chunks of signs + a scale."""
    d = 8970
    res = sim.run(_steps, n, args=(compress.CompressedAllreduce(), d, 1))
    chunk_bytes = math.ceil(d / (8 * n)) + 4
    assert res.ledger.sent == [2 * (n - 1) * chunk_bytes] * n  # counted: p2p + ring all-gather
    assert res.ledger.ops["send"].sent == [(n - 1) * chunk_bytes] * n
    assert res.ledger.sent[0] < 2 * 4 * d / 32 * 1.05  # about 2 S/32 whatever N
    assert all(torch.equal(res[0][0], res[r][0]) for r in range(n))  # one result on every rank


def test_compressed_allreduce_error_feedback_tracks_the_sum():
    """Summed over 200 steps, the outputs track the true averages only with error feedback."""
    n, d, steps = 4, 1000, 200
    true = sum(sum(torch.randn(d, generator=torch.Generator().manual_seed(100 * s + r))
                   for r in range(n)) / n for s in range(steps))
    drift = {ef: (sum(sim.run(_steps, n, args=(compress.CompressedAllreduce(error_feedback=ef), d,
                                               steps))[0]) - true).norm() / true.norm()
             for ef in (True, False)}
    assert drift[True] < 0.15 < 0.5 < drift[False], drift


@pytest.mark.parametrize("rank", [1, 2])
def test_powersgd_bytes_are_r_times_n_plus_m_plus_the_rest(rank):
    c, n, rounds = compress.PowerSGD(rank, start_iter=1), 2, 3
    shapes = ((16, 8), (8,), (4, 3, 2), (2, 2))  # (4, 6) compresses at r=1 only; (2, 2) never
    res = sim.run(_average, n, args=(c, shapes, rounds))
    d = sum(torch.Size(s).numel() for s in shapes)
    per_step = (16 + 8) * rank + 8 + (((4 + 6) * 1) if rank == 1 else 24) + 4
    assert c.wire_elements(shapes) == per_step
    # Warm-up step: everything plainly; then P and Q (one allreduce each) + the rest.
    want_elems = [ring_allreduce_elements(d, n, r)[0] for r in range(n)]
    assert res.ledger.sent[0] > 0
    plain_rest = 8 + 4 + (0 if rank == 1 else 24)
    p_elems = 16 * rank + (4 * 1 if rank == 1 else 0)
    q_elems = 8 * rank + (6 * 1 if rank == 1 else 0)
    for r in range(n):
        step = sum(ring_allreduce_elements(e, n, r)[0] for e in (plain_rest, p_elems, q_elems))
        assert res.ledger.sent[r] == 4 * (want_elems[r] + (rounds - 1) * step)


# ---------------------------------------------------- training, error feedback
@pytest.fixture(scope="module")
def reference():
    return trained(None, steps=80, lr=0.1)


@pytest.mark.parametrize("c, tol", [
    ("fp16", 0.01), ("bf16", 0.05), (compress.TopK(0.1), 0.15), (compress.SignSGD(), 0.15),
    (compress.PowerSGD(2), 0.15), (compress.CompressedAllreduce(), 0.15)], ids=str)
def test_training_with_error_feedback_tracks_uncompressed(c, tol, reference):
    """Final loss (mean of the last 10 steps) within `tol` of uncompressed fp32 on digits."""
    h = trained(c, steps=80, lr=0.1)
    last = sum(h.loss[-10:]) / 10
    ref = sum(reference.loss[-10:]) / 10
    assert abs(last - ref) <= tol, (last, ref)
    assert sent_per_step(h) < sent_per_step(reference)


def test_error_feedback_is_what_makes_topk_train():
    """At 1% without error feedback the loss stalls near its start (ln 10 = 2.3)."""
    with_ef = trained(compress.TopK(0.01), steps=100, lr=0.3)  # lesson 07's run
    without = trained(compress.TopK(0.01, error_feedback=False), steps=100, lr=0.3)
    assert sum(with_ef.loss[-10:]) / 10 < sum(without.loss[-10:]) / 10 - 0.5


# ----------------------------------------------------------- DDP, 2 real ranks
def _ddp_worker(comm):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.functional import cross_entropy
    from torch.nn.parallel import DistributedDataParallel as DDP

    from syncedu.train import models

    def steps(ddp, k=4):
        g = torch.Generator().manual_seed(comm.rank)
        for _ in range(k):
            x, y = torch.rand(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
            ddp.zero_grad()
            cross_entropy(ddp(x), y).backward()
        return [p.grad.clone() for p in ddp.parameters()]

    theirs_fp16, ours_fp16 = DDP(models.make("mlp", seed=0)), DDP(models.make("mlp", seed=0))
    theirs_fp16.register_comm_hook(None, default_hooks.fp16_compress_hook)
    ours_fp16.register_comm_hook(*compress.FP16().ddp_hook(comm))
    a, b = steps(theirs_fp16, 1), steps(ours_fp16, 1)
    for c in (compress.TopK(0.1), compress.SignSGD()):  # residuals survive DDP's bucket rebuild
        sparse = DDP(models.make("mlp", seed=0), bucket_cap_mb=0.01)
        sparse.register_comm_hook(*c.ddp_hook(comm))
        steps(sparse, 3)
    return all(torch.allclose(x, y, atol=1e-4) for x, y in zip(a, b))


@pytest.mark.slow
def test_ddp_hooks_match_torch():
    """Our FP16 hook on DDP agrees with torch's fp16_compress_hook; sparse hooks run."""
    assert launch.run(_ddp_worker, 2, backend="gloo", timeout=60) == [True, True]


@pytest.fixture(scope="module")
def pool2():
    """One warm pair of real ranks for this file's DDP runs (process starts cost seconds)."""
    with launch.Pool(2, backend="gloo", output="quiet", timeout=120) as pool:
        yield pool


@pytest.fixture(scope="module")
def ddp_bytes(pool2):
    """compressor -> bytes per rank of 6 steps of train.run("ddp", 2, ...), on the warm pool."""
    from syncedu import train
    return lambda c: train.run("ddp", 2, steps=6, global_batch=64, lr=0.2, compression=c,
                               pool=pool2).ledger.ops["all_reduce"].sent


S, PSGD_R1 = 35_880, 4 * 468  # the MLP's fp32 gradient bytes; PowerSGD r=1's per step


@pytest.mark.slow
def test_torch_powersgd_hook_charges_the_bytes_of_ours(ddp_bytes):
    """torch's powerSGD_hook (every allreduce, also those in its callbacks) and our PowerSGD
    charge the same ledger bytes: 2 plain steps, then 4 compressed ones."""
    theirs = ddp_bytes(TorchPowerSGD(1, start_iter=2))
    assert theirs == ddp_bytes(compress.PowerSGD(1, start_iter=2)) == [2 * S + 4 * PSGD_R1] * 2


@pytest.mark.slow
def test_the_powersgd_witness_can_disagree(ddp_bytes):
    """Lesson 07's byte check fails if torch's hook starts later or keeps another rank."""
    assert ddp_bytes(TorchPowerSGD(1, start_iter=3)) == [3 * S + 3 * PSGD_R1] * 2
    assert ddp_bytes(TorchPowerSGD(2, start_iter=2)) == [2 * S + 4 * 4 * 798] * 2  # r=2: 798


def test_torch_powersgd_runs_only_under_ddp():
    with pytest.raises(ValueError, match=r'only under DDP, train.run\("ddp"'):
        TorchPowerSGD().average_(_FakeComm(), [torch.ones(3)])


@pytest.mark.parametrize("strategy, options, message", [
    ("naive", {}, r"TorchPowerSGD.* needs a strategy that sends gradients through it, one of "
                  r"\('ddp',\); got strategy='naive'"),
    ("ddp", {"bucket_cap_mb": 0.005}, r"bucket_cap_mb=0.005 splits DDP's gradients into several "
                                      r"buckets; .* bucket_cap_mb >= 0.0342 \(the mlp's 35,880"),
])
def test_torch_powersgd_misuse_is_refused_before_any_rank_starts(monkeypatch, strategy, options,
                                                                 message):
    """Two plausible wrong uses: torch's DDP hook under our strategies, and DDP cut into several
    buckets (on Gloo a rank died of SIGABRT). TrainConfig refuses both, naming the parameter."""
    from syncedu import train
    monkeypatch.setattr(launch, "Pool", None)  # starting ranks would be a TypeError
    with pytest.raises(ValueError, match=message):
        train.run(strategy, 2, steps=2, global_batch=64, compression=TorchPowerSGD(), **options)


def _torch_powersgd_steps(comm, bucket_cap_mb):
    """4 DDP steps with TorchPowerSGD's hook registered directly, past TrainConfig's check."""
    from torch.nn.functional import cross_entropy

    from syncedu.dp.ddp_hook import wrap_ddp
    from syncedu.train import models
    ddp, _ = wrap_ddp(models.make("mlp", seed=0), comm, bucket_cap_mb, compressor=TorchPowerSGD())
    g = torch.Generator().manual_seed(comm.rank)
    done = 0
    for _ in range(4):  # DDP rebuilds its buckets after step 0; PowerSGD starts at step 2
        x, y = torch.randn(8, 64, generator=g), torch.randint(0, 10, (8,), generator=g)
        ddp.zero_grad()
        cross_entropy(ddp(x), y).backward()
        done += 1
    return done


@pytest.mark.slow
def test_torch_powersgd_hook_refuses_a_second_bucket(pool2):
    """At bucket_cap_mb = the gradient bytes (TrainConfig's bound) DDP keeps one bucket: the
    hook, which refuses any second bucket, runs all 4 steps; below it, an error naming
    bucket_cap_mb from the hook, before that bucket's allreduce, instead of a SIGABRT."""
    assert pool2.run(_torch_powersgd_steps, (S / 2 ** 20,)) == [4, 4]
    # the pool's last use in this file: a failed run stops its ranks
    with pytest.raises(launch.WorkerError, match="TorchPowerSGD needs DDP to keep one bucket: "
                                                 "raise bucket_cap_mb"):
        pool2.run(_torch_powersgd_steps, (0.005,))


# ------------------------------------------------- train.run(..., compression=)
TRAIN_JOB = dict(steps=40, global_batch=64, lr=0.2, simulate=True)


@pytest.fixture(scope="module")
def train_reference():
    from syncedu import train
    return train.run("bucketed", 2, **TRAIN_JOB)


@pytest.mark.parametrize("c, tol", [("fp16", 0.01), (compress.TopK(0.1), 0.1),
                                    (compress.SignSGD(), 0.15), (compress.PowerSGD(2), 0.1)],
                         ids=str)
def test_train_run_with_compression_tracks_uncompressed(c, tol, train_reference):
    """Bucketed DP on simulated ranks: mean loss of the last 5 of 40 steps within `tol` of fp32."""
    from syncedu import train
    ref = train_reference
    h = train.run("bucketed", 2, compression=c, **TRAIN_JOB)
    assert abs(sum(h.loss[-5:]) / 5 - sum(ref.loss[-5:]) / 5) < tol
    assert sum(h.ledger.sent) < sum(ref.ledger.sent)
    if c == "fp16":
        assert 2 * sum(h.ledger.sent) == sum(ref.ledger.sent)


# ------------------------------------------------------------ lesson checkers
def test_lesson07_checkers():
    from syncedu.compress import exercises07 as ex
    assert ex.topk_compressor.grade(lambda: compress.TopK(0.1))
    assert not ex.topk_compressor.grade(lambda: compress.TopK(0.1, error_feedback=False))
    assert ex.topk_bytes.grade(lambda n, d, r: (n - 1) * math.ceil(r * d) * 8)
    assert not ex.topk_bytes.grade(lambda n, d, r: 2 * (n - 1) * d * 4 // n)
    assert ex.powersgd_elements.grade(lambda s, r: compress.PowerSGD(r).wire_elements([s]))
    def always(s, r):  # compresses even where it does not pay
        return r * (s[0] + math.prod(s[1:])) if len(s) > 1 else s[0]
    assert not ex.powersgd_elements.grade(always)


@pytest.mark.parametrize("c", [compress.TopK(0.1), compress.SignSGD(),
                               compress.PowerSGD(1, start_iter=0)], ids=str)
def test_a_bucket_that_changes_size_starts_afresh(c):
    """DDP rebuilds its buckets after step 0: the same key may come back with other contents."""
    def worker(comm):
        c.average_(comm, [torch.randn(8, 6)], "ddp0")
        c.average_(comm, [torch.randn(4, 6)], "ddp0")  # smaller now: no stale residual added
    sim.run(worker, 2)
