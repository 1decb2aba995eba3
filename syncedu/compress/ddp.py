"""Compression and mixed precision under DDP, on real ranks: what goes on the wire.

Every configuration of the audit allreduces through Python hooks (DDP's default path is
C++), so patching `dist.all_reduce` for one step sees them all. Mixed precision as in
Micikevicius et al. 2018: fp32 masters, 16-bit parameters and gradients. `TorchPowerSGD`
is torch's `powerSGD_hook` as a compressor for the harness, its traffic in our ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

from syncedu.comm.runs import check_int
from syncedu.compress import BF16, FP16, Compressor
from syncedu.dp.ddp_hook import charge_ring_allreduce
from syncedu.train import data, models


def recording_allreduce(calls: list):
    """Append (dtype name, bytes) of every `dist.all_reduce` inside the block to `calls`."""
    real = dist.all_reduce

    def record(t, *args, **kwargs):
        calls.append((str(t.dtype).replace("torch.", ""), t.numel() * t.element_size()))
        return real(t, *args, **kwargs)

    return mock.patch.object(dist, "all_reduce", record)


def _batch(comm, step: int, per_rank: int = 32):
    x, y = data.digits().tensors
    g = torch.Generator().manual_seed(1000 * step + comm.rank)
    idx = torch.randint(0, len(x), (per_rank,), generator=g)
    return x[idx], y[idx]


def _one_step(comm, hook, autocast: bool, dtype=torch.float32) -> dict:
    ddp = DDP(models.make("mlp", seed=0).to(dtype))
    if hook is not None:
        ddp.register_comm_hook(*hook)
    x, y = _batch(comm, 0)
    calls: list = []
    with recording_allreduce(calls):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(ddp(x.to(dtype)), y)
        loss.backward()
    return {"wire": sorted({d for d, _ in calls}), "bytes": sum(b for _, b in calls),
            "grads": sorted({str(p.grad.dtype).replace("torch.", "") for p in ddp.parameters()})}


def wire_audit(comm) -> dict:
    """Configuration -> {"wire": dtypes sent, "bytes", "grads": grad dtypes} (or "refused")."""
    configs = {
        "fp32": ((None, default_hooks.allreduce_hook), False),
        "bf16 parameters": ((None, default_hooks.allreduce_hook), False, torch.bfloat16),
        "autocast bf16": ((None, default_hooks.allreduce_hook), True),
        "autocast + torch fp16 hook": ((None, default_hooks.fp16_compress_hook), True),
        "autocast + our FP16 hook": (FP16().ddp_hook(comm), True),
        "our BF16 hook": (BF16().ddp_hook(comm), False),
        "torch bf16 hook": ((None, default_hooks.bf16_compress_hook), False),
    }
    out = {}
    for name, (hook, autocast, *dtype) in configs.items():
        try:
            out[name] = _one_step(comm, hook, autocast, *dtype)
        except Exception as e:  # torch's bf16 hook refuses CPU tensors
            out[name] = {"refused": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    return out


class _ChargedGroup(dist.ProcessGroup):
    """`comm`'s process group; each allreduce issued on it is charged to `comm.ledger`.

    torch's hook allreduces with `dist.all_reduce(t, group=state.process_group)`, also later
    in its futures' callbacks, which ends in `group.allreduce`: a group of our own sees them
    all, where a patch of `dist.all_reduce` would have to outlive the hook call and could
    leak into a warm pool's later runs. A subclass, though a duck-typed wrapper also works in
    torch 2.13: it stays a `ProcessGroup` wherever torch checks the type.
    """

    def __init__(self, comm):
        self.inner, self.comm = comm.group or dist.group.WORLD, comm
        super().__init__(self.inner.rank(), self.inner.size())

    def allreduce(self, tensors, *args, **kwargs):
        for t in tensors:  # as `counting_hook` charges DDP's own buckets
            charge_ring_allreduce(self.comm, t.numel(), t.element_size())
        return self.inner.allreduce(tensors, *args, **kwargs)


def _one_bucket_hook(state, bucket):
    """torch's `powerSGD_hook` on DDP's bucket 0; on a second bucket a ValueError before it
    allreduces (no return annotation: DDP inspects it, a string here)."""
    if bucket.index() > 0:
        raise ValueError("TorchPowerSGD needs DDP to keep one bucket: raise bucket_cap_mb to "
                         "at least the model's gradient bytes / 2**20")
    return psgd.powerSGD_hook(state, bucket)


@dataclass(frozen=True)
class TorchPowerSGD(Compressor):
    """torch's `powerSGD_hook` for `train.run("ddp", ..., compression=)`: torch's state on a
    `_ChargedGroup`, torch's hook unchanged (its first Q drawn from `seed`). One DDP bucket
    only: with several, its chained allreduces on Gloo came in different orders per rank
    (a SIGABRT), so `check_config` and the hook refuse them, naming `bucket_cap_mb`."""

    rank: int = 1
    start_iter: int = 2  # torch refuses < 2 with error feedback or warm start (pytorch#51427)
    seed: int = 0
    name: ClassVar[str] = "torch_powersgd"
    strategies: ClassVar[tuple] = ("ddp",)  # TrainConfig refuses the others before any rank

    def __post_init__(self):
        for pname, low in (("rank", 1), ("start_iter", 2), ("seed", 0)):
            check_int(pname, getattr(self, pname), low)

    def check_config(self, cfg) -> None:
        """Raise unless DDP keeps one bucket: a cap of at least the fp32 gradient bytes (DDP
        closes a bucket once it reaches the cap, torch's `compute_bucket_assignment_by_size`
        in reducer.cpp, so then only the last tensor can)."""
        model = models.make(cfg.model, **dict(cfg.model_kwargs))
        need = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        if cfg.bucket_cap_mb * 2 ** 20 < need:
            raise ValueError(f"bucket_cap_mb={cfg.bucket_cap_mb!r} splits DDP's gradients into "
                             f"several buckets; TorchPowerSGD needs one: bucket_cap_mb >= "
                             f"{need / 2 ** 20:.4f} (the {cfg.model}'s {need:,} gradient bytes)")

    def average_(self, comm, tensors, key: str = "bucket") -> None:
        """Refused: torch's hook runs inside DDP only (use `PowerSGD` with our strategies)."""
        raise ValueError("TorchPowerSGD is torch's DDP comm hook: it runs only under DDP, "
                         "train.run(\"ddp\", ...); use PowerSGD with other strategies")

    def ddp_hook(self, comm):
        """(state, hook) for `DistributedDataParallel.register_comm_hook`: torch's PowerSGD state
        on a process group that charges each allreduce to `comm`'s ledger.
        """
        return psgd.PowerSGDState(process_group=_ChargedGroup(comm), random_seed=self.seed,
                                  matrix_approximation_rank=self.rank,
                                  start_powerSGD_iter=self.start_iter), _one_bucket_hook


def grad_scaler_fp16(comm, scales=(2.0 ** 24, 2.0 ** 10)) -> list[dict]:
    """GradScaler through torch's `fp16_compress_hook`: a too-large scale overflows the wire.

    Steps (torch.amp.GradScaler; default_hooks.fp16_compress_hook):
    1. scale the loss, backward: the hook casts each bucket to fp16 before dividing
       by N, so a scaled gradient above 65,504 becomes inf on the wire;
    2. `unscale_` finds the inf, `step` skips the update, `update` halves the scale;
    3. with a smaller scale the same step is applied, clipped after `unscale_`.
    """
    ddp = DDP(models.make("mlp", seed=0))
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    out = []
    for scale in scales:
        scaler = torch.amp.GradScaler("cpu", init_scale=scale)
        before = [p.detach().clone() for p in ddp.parameters()]
        x, y = _batch(comm, 0)
        opt.zero_grad()
        scaler.scale(F.cross_entropy(ddp(x), y)).backward()                # Step 1
        inf = any(not torch.isfinite(p.grad).all() for p in ddp.parameters())
        scaled = torch.nn.utils.get_total_norm([p.grad for p in ddp.parameters()]).item()
        scaler.unscale_(opt)                                               # Step 2
        norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=1.0).item()
        scaler.step(opt)
        scaler.update()
        moved = any(not torch.equal(a, p) for a, p in zip(before, ddp.parameters()))
        out.append({"scale": scale, "inf": inf, "moved": moved,
                    "scale_after": scaler.get_scale(), "scaled_norm": scaled, "norm": norm})
    return out
