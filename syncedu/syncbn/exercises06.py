"""Checkers for notebooks/06_sync_batchnorm's exercises (simulated ranks: quick, exact)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from syncedu.comm import sim
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.ui.checkers import answered, checker, verdict

_SIZES = (3, 1, 0, 5)  # uneven, with a single-sample rank and an empty one


def _case(channels: int = 4, seed: int = 0, offset: float = 7.0, scale: float = 2.0,
          dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, channels, generator=g, dtype=torch.float64) * scale + offset)
            .to(dtype) for n in _SIZES]


def _calls(ledger) -> int:
    return sum(op.calls[0] for op in ledger.ops.values())


def _check_stats(name, worker, xs, atol_mean, atol_var, what):
    """The result if every rank returned the global (mean, var) of `xs`, else None (the
    verdict printed); an unanswered or raising `worker` ends the grading (`answered`)."""
    res = answered(name, lambda: sim.run(lambda comm: worker(comm, xs[comm.rank]), len(xs)))
    var, mean = torch.var_mean(torch.cat(xs).double(), dim=0, correction=0)
    for r, out in enumerate(res):
        if not (isinstance(out, tuple) and len(out) == 2):
            return verdict(name, False, f"rank {r} returned {type(out).__name__}; "
                            "return a (mean, var) pair") or None
        got_mean, got_var = (torch.as_tensor(t).double() for t in out)
        if not (torch.allclose(got_mean, mean, rtol=0, atol=atol_mean)
                and torch.allclose(got_var, var, rtol=0, atol=atol_var)):
            err = (got_var - var).abs().max().item()
            return verdict(name, False, f"{what}: rank {r} (batch of {_SIZES[r]}) got mean "
                            f"{got_mean.tolist()} and var {got_var.tolist()}; expected "
                            f"{mean.tolist()} and {var.tolist()} (var off by {err:.3g})"
                            + _mean_of_means(xs, got_mean)) or None
    return res


def _mean_of_means(xs, got_mean) -> str:
    """The named mistake, if `got_mean` is a mean of the ranks' means (section 3's warning)."""
    means = [x.double().mean(0) for x in xs if len(x)]
    if torch.isnan(got_mean).any() or any(torch.allclose(got_mean, sum(means) / k, atol=1e-9)
                                          for k in (len(means), len(xs))):
        return (f" - that is a mean of the ranks' means (op='avg'?), but the ranks hold "
                f"{list(_SIZES)} samples: all_reduce the sums and the count, then divide")
    return ""


@checker
def global_mean_var(worker) -> bool:
    """Exercise 06.1: `worker(comm, x)` -> global (mean, biased var), with one all_reduce."""
    name = "Exercise 1 (global statistics)"
    if (res := _check_stats(name, worker, _case(), 1e-9, 1e-9, "float64 data")) is None:
        return False
    if (calls := _calls(res.ledger)) != 1:
        return verdict(name, False, f"rank 0 made {calls} communication calls; pack sum, "
                        "sum of squares and count into ONE all_reduce")
    # float32 values near 3000 with spread 1: sum(x^2)/N - mean^2 in float32 loses
    # every digit of the variance (section 3's warning); float64 sums keep it.
    if _check_stats(name, worker, _case(offset=3000.0, scale=1.0, dtype=torch.float32),
                    1e-3, 1e-3, "float32 data with mean 3000 and std 1 (the right "
                    "answer on float64 data)") is None:
        print("  hint: compute the sums in float64 (x.double()), or each rank's mean and "
              "squared deviations first (torch.var_mean), as section 3 describes")
        return False
    return verdict(name, True)


def _backward_case(sizes=(3, 1, 5), channels: int = 3, eps: float = 1e-5, seed: int = 6):
    """Per-rank (dy, xhat), global invstd, weight and count, and BatchNorm's true gradients."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, channels, 2, generator=g, dtype=torch.float64) * 1.5 + 0.5
          for n in sizes]
    dys = [torch.randn(n, channels, 2, generator=g, dtype=torch.float64) for n in sizes]
    weight = torch.rand(channels, generator=g, dtype=torch.float64) + 0.5
    x = torch.cat(xs).requires_grad_()
    var, mean = torch.var_mean(x.detach(), dim=(0, 2), correction=0)
    invstd = torch.rsqrt(var + eps)
    y = F.batch_norm(x, None, None, weight, torch.zeros_like(weight), True, 0.0, eps)
    (y * torch.cat(dys)).sum().backward()
    xhats = [(xr - mean.view(1, -1, 1)) * invstd.view(1, -1, 1) for xr in xs]
    return {"dys": dys, "xhats": xhats, "invstd": invstd, "weight": weight,
            "count": x.shape[0] * x.shape[2], "dx": list(x.grad.split(list(sizes))),
            "sizes": sizes}


def _dx(dy, xhat, scale, s_dy, s_dyx, count):
    v = lambda t: t.view(1, -1, *([1] * (dy.dim() - 2)))  # noqa: E731
    return v(scale) * (dy - v(s_dy) / count - xhat * v(s_dyx) / count)


def _diagnose_dx(case, r, got) -> str:
    """Which classic mistake (if any) gives rank r's `got` dx."""
    dy, xhat, w, inv = case["dys"][r], case["xhats"][r], case["weight"], case["invstd"]
    loc = (dy.sum((0, 2)), (dy * xhat).sum((0, 2)))
    glob = [sum(t) for t in zip(*[(d.sum((0, 2)), (d * x).sum((0, 2)))
                                  for d, x in zip(case["dys"], case["xhats"])])]
    n_local, n = dy.shape[0] * dy.shape[2], case["count"]
    mistakes = [(_dx(dy, xhat, w * inv, *loc, max(n_local, 1)), "it is BatchNorm's gradient "
                 "on this rank's samples alone: all_reduce the two sums over the ranks"),
                (_dx(dy, xhat, w * inv, *glob, max(n_local, 1)), "the sums are global but you "
                 f"divided by this rank's count ({n_local}); divide by the global count {n}"),
                (_dx(dy, xhat, w * inv, *glob, n * len(case["sizes"])), "divided by count * "
                 "world_size: the all_reduce already sums over the ranks, and count is "
                 "already global"),
                (_dx(dy, xhat, inv, *glob, n), "the weight (gamma) is missing: dx = weight * "
                 "invstd * (...)"),
                (_dx(dy, xhat, w * inv, glob[0], torch.zeros_like(glob[1]), n), "the "
                 "xhat * sum(dy * xhat) / N term is missing")]
    for want, why in mistakes:
        if got.shape == want.shape and torch.allclose(got, want, atol=1e-9):
            return why
    err = (got - case["dx"][r]).abs().max().item() if got.shape == case["dx"][r].shape else None
    return f"largest error {err:.3g}" if err is not None else \
        f"shape {tuple(got.shape)}, expected {tuple(case['dx'][r].shape)}"


@checker
def syncbn_backward(backward) -> bool:
    """Exercise 06.2: `backward(comm, dy, xhat, invstd, weight, count) -> (dx, dweight, dbias)`."""
    name = "Exercise 2 (the SyncBN backward)"
    case = _backward_case()

    def rank(comm):
        r = comm.rank
        return backward(comm, case["dys"][r].clone(), case["xhats"][r].clone(),
                        case["invstd"].clone(), case["weight"].clone(), case["count"])

    res = answered(name, lambda: sim.run(rank, len(case["sizes"])))
    for r, out in enumerate(res):
        if not (isinstance(out, (tuple, list)) and len(out) == 3):
            return verdict(name, False, f"rank {r} returned {type(out).__name__}; return "
                            "(dx, dweight, dbias)")
        dx, dw, db = (torch.as_tensor(t).double() for t in out)
        where = f"rank {r} (batch of {case['sizes'][r]})"
        if dx.shape != case["dx"][r].shape or not torch.allclose(dx, case["dx"][r], atol=1e-9):
            return verdict(name, False, f"{where}: dx is wrong: {_diagnose_dx(case, r, dx)}")
        dy, xhat = case["dys"][r], case["xhats"][r]
        want_w, want_b = (dy * xhat).sum((0, 2)), dy.sum((0, 2))
        if not (torch.allclose(dw, want_w, atol=1e-9) and torch.allclose(db, want_b, atol=1e-9)):
            all_b = sum(d.sum((0, 2)) for d in case["dys"])
            why = ("you returned the sum over all ranks: leave dweight and dbias LOCAL (the "
                   "data-parallel wrapper averages them like every other gradient)"
                   if torch.allclose(db, all_b, atol=1e-9) else
                   "you averaged them over the ranks: leave dweight and dbias LOCAL (the "
                   "data-parallel wrapper averages them; averaging here too divides twice)"
                   if torch.allclose(db, all_b / len(case["sizes"]), atol=1e-9) else
                   "dweight = sum(dy * xhat) and dbias = sum(dy) over this rank's samples, "
                   "per channel")
            return verdict(name, False, f"{where}: dx is right, dweight/dbias are not: {why}")
    if (calls := _calls(res.ledger)) != 1:
        return verdict(name, False, f"the gradients are right, but rank 0 made {calls} "
                        "communication calls: stack sum(dy) and sum(dy * xhat) into ONE "
                        "all_reduce (each call costs a latency on the critical path)")
    return verdict(name, True)


@checker
def step_bytes(answer, channels=(16, 32, 64), world_size: int = 8) -> bool:
    """Quick check: SyncBN bytes rank 0 sends per step (16, 32, 64 channels; 8 ranks)."""
    name = "Quick check (SyncBN bytes per step)"
    value = answered(name, answer if callable(answer) else (lambda: answer))
    want = 8 * sum(ring_allreduce_elements(2 * c + k, world_size, 0)[0]   # fwd 2C+1, bwd 2C
                   for c in channels for k in (1, 0))
    return verdict(name, value == want, "" if value == want else
                    f"{value!r} is not it: two all_reduces per layer, of 2C + 1 and 2C float64 "
                    "numbers, each charged as a ring")


def _bn_model(rank: int) -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.BatchNorm1d(4))
    with torch.no_grad():
        for i, m in enumerate(m for m in model if isinstance(m, nn.BatchNorm1d)):
            m.running_mean.copy_(torch.arange(4.0) * (rank + 1) + i)
            m.running_var.copy_(torch.ones(4) * (rank + 2) + i)
    return model


@checker
def average_running_stats(worker, world_size: int = 3) -> bool:
    """Exercise 06.3: `worker(comm, model)` makes every rank's BN running stats the ranks' mean."""
    name = "Exercise 3 (agree on running statistics)"

    def run(comm):
        model = _bn_model(comm.rank)
        worker(comm, model)
        return [b.clone() for n, b in model.named_buffers() if "running" in n]

    res = answered(name, lambda: sim.run(run, world_size))
    models = [_bn_model(r) for r in range(world_size)]
    want = [torch.stack(bs).mean(0) for bs in zip(*[[b for n, b in m.named_buffers()
                                                     if "running" in n] for m in models])]
    for r, got in enumerate(res):
        if len(got) != len(want) or not all(torch.allclose(a, b) for a, b in zip(got, want)):
            wrong = sorted({("mean" if i % 2 == 0 else "var") for i, (a, b)
                            in enumerate(zip(got, want)) if not torch.allclose(a, b)})
            summed = len(got) == len(want) and all(torch.allclose(a, world_size * b)
                                                   for a, b in zip(got, want))
            why = (f"they are the sum over the {world_size} ranks: divide by world_size (or "
                   "all_reduce with op='avg')" if summed else
                   f"running_{' and running_'.join(wrong)} differ" if len(got) == len(want)
                   else f"{len(got)} running buffers, expected {len(want)}")
            return verdict(name, False, f"rank {r}'s running statistics are not the average "
                            f"over ranks (every BatchNorm layer, mean and var): {why}")
    return verdict(name, True)
