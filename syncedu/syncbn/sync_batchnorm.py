"""SyncBatchNorm from scratch: BatchNorm over the global batch, on any `Comm`.

torch's and Horovod's are CUDA-only; this one runs on any backend with the
conventions of `torch.nn.SyncBatchNorm`: global statistics, running variance
unbiased over the global count, weight/bias gradients LOCAL (the data-parallel
wrapper averages them). Ioffe & Szegedy 2015; MegDet (Peng et al., CVPR 2018).

Forward in training mode (n_r values per channel on rank r, N = sum n_r):
1. local mean and squared deviations by a stable two-pass `var_mean`, as float64
   sums [sum x, sum x^2, n_r] per channel;
2. ONE all_reduce of that (2C + 1)-vector: the global mean and biased variance
   (normalization) and unbiased variance (running statistics);
3. update the running statistics; y = (x - mean) / sqrt(var + eps) * w + b.

Backward (custom autograd Function), with xhat = (x - mean) * invstd:
1. local sums [sum dy, sum dy * xhat] per channel (float64);
2. ONE all_reduce of that 2C-vector;
3. dx = w * invstd * (dy - sum_g(dy) / N - xhat * sum_g(dy * xhat) / N), BatchNorm's
   input gradient on the concatenated batch; dw and db are the LOCAL sums of step 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from syncedu.comm.base import Comm
from syncedu.comm.runs import check_int

FORWARD_OP, BACKWARD_OP, CHECK_OP = "syncbn_forward", "syncbn_backward", "syncbn_check"


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [d for d in range(x.dim()) if d != 1]


def _per_channel(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """View a (C,) vector so it broadcasts against x of shape (N, C, ...)."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


def global_stats(x: torch.Tensor, comm: Comm) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Global per-channel mean and M2 (sum of squared deviations) in float64, and N.

    Forward steps 1-2: the only communication is one all_reduce of 2C + 1 numbers.
    """
    c, dims = x.shape[1], _reduce_dims(x)
    n_local = x.numel() // c if c else 0
    payload = torch.zeros(2 * c + 1, dtype=torch.float64, device=x.device)
    if n_local > 0:
        # Step 1: a stable local two-pass variance, then sums in float64.
        var, mean = torch.var_mean(x.detach(), dim=dims, correction=0)
        mean, m2 = mean.double(), var.double() * n_local
        payload[:c] = mean * n_local
        payload[c:2 * c] = m2 + n_local * mean * mean
        payload[2 * c] = n_local
    # Step 2: one collective for sum, sum of squares and count.
    with comm.scope(FORWARD_OP):
        comm.all_reduce(payload)
    n = int(round(payload[2 * c].item()))
    mean = payload[:c] / max(n, 1)
    m2 = (payload[c:2 * c] - n * mean * mean).clamp_min(0.0)
    return mean, m2, n


class SyncBNFunction(torch.autograd.Function):
    """y = xhat * w + b with batch statistics given; backward all-reduces two sums."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, count, comm):
        xhat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count, ctx.comm = count, comm
        y = xhat
        if weight is not None:
            y = xhat * _per_channel(weight, x) + _per_channel(bias, x)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        c, dims = x.shape[1], _reduce_dims(x)
        xhat = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
        # Step 1: local per-channel sums (zeros on a rank with no samples).
        local = torch.zeros(2 * c, dtype=torch.float64, device=x.device)
        if x.numel() > 0:
            local[:c] = dy.sum(dims).double()
            local[c:] = (dy * xhat).sum(dims).double()
        sum_dy, sum_dy_xhat = local[:c].to(x.dtype), local[c:].to(x.dtype)
        # Step 2: one collective for both sums.
        total = local.clone()
        with ctx.comm.scope(BACKWARD_OP):
            ctx.comm.all_reduce(total)
        g_dy, g_dy_xhat = (total[:c] / ctx.count).to(x.dtype), (total[c:] / ctx.count).to(x.dtype)
        # Step 3: BatchNorm's input gradient with global sums; dw, db stay local.
        scale = invstd if weight is None else invstd * weight
        dx = _per_channel(scale, x) * (dy - _per_channel(g_dy, x)
                                       - xhat * _per_channel(g_dy_xhat, x))
        dw = db = None
        if weight is not None:
            dw, db = sum_dy_xhat.to(weight.dtype), sum_dy.to(weight.dtype)
        return dx, dw, db, None, None, None, None


class SyncBatchNorm(nn.Module):
    """BatchNorm over the batch of all ranks of `comm`; inputs (N, C) or (N, C, ...).

    Same parameters and buffers as `nn.BatchNorm*d`; in eval mode it sends nothing. Every
    rank must call forward and backward, also one with an empty (0, C, ...) batch (its loss
    still on the output: `out.sum() * 0`).
    """

    def __init__(self, num_features: int, comm: Comm, eps: float = 1e-5,
                 momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None):
        super().__init__()
        _check_args(num_features, comm, eps, momentum)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.comm, self._channels_checked = comm, False
        kw = {"device": device, "dtype": dtype}
        for name, fill in (("weight", torch.ones), ("bias", torch.zeros)):
            param = nn.Parameter(fill(num_features, **kw)) if affine else None
            self.register_parameter(name, param)
        track = track_running_stats
        for name, fill in (("running_mean", torch.zeros), ("running_var", torch.ones)):
            self.register_buffer(name, fill(num_features, **kw) if track else None)
        self.register_buffer("num_batches_tracked",
                             torch.tensor(0, dtype=torch.long, device=device) if track else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize `x` by the statistics of the global batch (one allreduce in training;
        none in eval, which uses the running statistics).
        """
        self._check_input(x)
        if not self.training:
            # Eval sends nothing: running statistics, or (without them, as torch) the LOCAL batch.
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                self.bias, not self.track_running_stats, 0.0, self.eps)
        if not self._channels_checked:
            self._check_channels(x.device)
        mean, m2, n = global_stats(x, self.comm)
        if n <= 1:
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel in the "
                             f"global batch when training, got {n} (input shape "
                             f"{tuple(x.shape)} on rank {self.comm.rank})")
        if self.track_running_stats:
            self._update_running(mean, m2, n)
        invstd = torch.rsqrt(m2 / n + self.eps)
        return SyncBNFunction.apply(x, self.weight, self.bias, mean.to(x.dtype),
                                     invstd.to(x.dtype), n, self.comm)

    def _update_running(self, mean: torch.Tensor, m2: torch.Tensor, n: int) -> None:
        """Step 3: exponential (or, with momentum=None, cumulative) moving averages."""
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
            unbiased = (m2 / (n - 1)).to(self.running_var.dtype)
            self.running_var.mul_(1 - m).add_(unbiased, alpha=m)

    def _check_input(self, x) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects input of shape (N, C) or (N, C, ...), "
                             f"got {x.dim()}D input of shape {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) got input with "
                             f"{x.shape[1]} channels (shape {tuple(x.shape)}); "
                             f"dimension 1 must be the {self.num_features} channels")

    def _check_channels(self, device) -> None:
        """Once per layer, all_reduce (max) [C, -C]: different C fail here, not in a collective."""
        c = float(self.num_features)
        t = torch.tensor([c, -c], dtype=torch.float64, device=device)
        with self.comm.scope(CHECK_OP):
            self.comm.all_reduce(t, op="max")
        high, low = int(t[0].item()), int(-t[1].item())
        if high != low:
            raise ValueError(f"SyncBatchNorm: num_features differ across ranks (this is rank "
                             f"{self.comm.rank} with {self.num_features}; the ranks have "
                             f"between {low} and {high}); build the same model on every rank")
        self._channels_checked = True

    def extra_repr(self) -> str:
        """What `print(module)` shows, as torch's BatchNorm, plus the world size."""
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}, "
                f"world_size={self.comm.world_size}")


def _check_args(num_features, comm, eps, momentum) -> None:
    check_int("num_features", num_features, 1)
    if not isinstance(comm, Comm):
        raise TypeError(f"comm must be a syncedu Comm (the `comm` a worker receives), "
                        f"got {type(comm).__name__}")
    if not eps > 0:
        raise ValueError(f"eps={eps!r} must be > 0")
    if momentum is not None and not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum={momentum!r} must be in [0, 1] or None (cumulative average)")


def convert(module: nn.Module, comm: Comm) -> nn.Module:
    """Replace every BatchNorm1d/2d/3d (and nn.SyncBatchNorm) inside `module` by ours, like
    `nn.SyncBatchNorm.convert_sync_batchnorm`: the new layers take over the old ones' tensors
    (an optimizer built before still works); a BatchNorm `module` is replaced."""
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)):
        new = SyncBatchNorm(module.num_features, comm, module.eps, module.momentum,
                            module.affine, module.track_running_stats)
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            if getattr(module, name) is not None:
                setattr(new, name, getattr(module, name))
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, convert(child, comm))
    return module
