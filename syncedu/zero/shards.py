"""What ZeRO is built from: one flat buffer cut into N shards, the two halves of an
allreduce on it (Patarasuk & Yuan 2009; ZeRO, Rajbhandari et al., SC 2020, shards what
lies between them), and a meter of the model-state bytes a rank really holds.

Rank r owns contiguous shard r (`Layout`), cut as `comm.all_reduce` cuts it, so every
element is summed in data parallelism's order. A layer is a slice [a, b) of the buffer;
its piece on rank j (often empty) is its overlap with shard j.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from syncedu.collectives.algorithms import ring_all_gather_chunks, ring_reduce_scatter_chunks
from syncedu.comm.ledger import ring_chunks
from syncedu.comm.runs import check_int, check_number
from syncedu.dp.buckets import flatten, unflatten_
from syncedu.dp.data_parallel import sync_paused
from syncedu.train.memory import KINDS, model_state_bytes


@dataclass(frozen=True)
class Layout:
    """How `numel` elements are cut into `world_size` contiguous shards."""

    numel: int
    world_size: int

    def __post_init__(self):
        check_int("world_size", self.world_size)
        check_int("numel", self.numel, 0)

    @property
    def sizes(self) -> list[int]:
        """Elements of each rank's shard (ring chunks: the first ones one longer)."""
        return ring_chunks(self.numel, self.world_size)

    def start(self, rank: int) -> int:
        """Offset of `rank`'s shard in the flat buffer."""
        return sum(self.sizes[:rank])

    def ranges(self, a: int, b: int) -> list[tuple[int, int]]:
        """Per rank j, the part (lo, hi) of the slice [a, b) that lies in shard j."""
        starts = [self.start(j) for j in range(self.world_size)]
        return [(lo := max(a, s), max(lo, min(b, s + size))) for s, size in zip(starts, self.sizes)]

    def within_shard(self, a: int, b: int, rank: int) -> tuple[int, int]:
        """Where rank `rank`'s part of the slice [a, b) lies inside its own shard."""
        lo, hi = self.ranges(a, b)[rank]
        return lo - self.start(rank), hi - self.start(rank)

    def pieces(self, buf: torch.Tensor, a: int = 0) -> list[torch.Tensor]:
        """`buf` (the slice [a, a + len(buf)) of the whole buffer) cut at the shard borders."""
        return [buf[lo - a: hi - a] for lo, hi in self.ranges(a, a + buf.numel())]


@torch.no_grad()
def broadcast_params(comm, params) -> torch.Tensor:
    """Rank 0's `params` on every rank, as DDP starts: one broadcast of one flat buffer."""
    flat = flatten(params)
    comm.broadcast(flat, src=0)
    unflatten_(params, flat)
    return flat


@torch.no_grad()
def clip_grad_norm(comm, sharded: list, whole: list, max_norm: float, norm_type: float = 2.0,
                   *, copies: int = 1) -> torch.Tensor:
    """torch's `clip_grad_norm_` over gradients split across ranks: `sharded` hold each rank's
    own elements (each element on `copies` ranks: HSDP's replicas), `whole` are the same on
    every rank. The p-th powers (or the max, p = inf) of the shards are summed over `comm`
    (None: nothing to sum), then the whole ones' added; every gradient is scaled in place by
    min(1, max_norm / (norm + 1e-6)), torch's coefficient. Returns the norm (fp32)."""
    check_number("max_norm", max_norm)
    inf = (p := float(check_number("norm_type", norm_type, 1e-12))) == float("inf")
    device = next((g.device for g in [*sharded, *whole]), None)  # a rank may hold no shard

    def part(grads):  # sum of |g|^p, or max |g|, in float64
        norms = torch.stack([torch.linalg.vector_norm(g.double(), p) for g in grads if g.numel()]
                            or [torch.zeros((), dtype=torch.float64, device=device)])
        return (norms.max() if inf else norms.pow(p).sum()).reshape(1)

    total = part(sharded)
    if comm is not None:
        comm.all_reduce(total, op="max" if inf else "sum").div_(1 if inf else copies)
    total = (torch.maximum(total, part(whole)) if inf else (total + part(whole)) ** (1 / p))[0]
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in [*sharded, *whole]:
        g.mul_(coef.to(g.dtype))
    return total.float()


def ring_reduce_scatter_pieces(comm, pieces: list[torch.Tensor]) -> torch.Tensor:
    """Ring reduce-scatter in place, `pieces[r]` on rank r the sum: lesson 02's ring, adding
    in a ring allreduce's order (and `comm.all_reduce`'s); empty pieces skip the wire."""
    with comm.scope("ring_reduce_scatter"):
        ring_reduce_scatter_chunks(comm, pieces, list(range(comm.world_size)), skip_empty=True)
    return pieces[comm.rank]


def ring_all_gather_pieces(comm, pieces: list[torch.Tensor]) -> None:
    """Ring all-gather in place (the collectives' `ring_all_gather_chunks`)."""
    with comm.scope("ring_all_gather"):
        ring_all_gather_chunks(comm, pieces, list(range(comm.world_size)), skip_empty=True)


class Synced(nn.Module):
    """As DDP: `module`'s forward decides whether the backward synchronizes (a pre-hook, so
    calling `.module` directly counts too); `no_sync()` pauses it."""

    def __init__(self, module: nn.Module, comm):
        super().__init__()
        self.module, self.comm, self.require_sync, self._armed = module, comm, True, False
        self._arm_hook = module.register_forward_pre_hook(self._arm)

    def _arm(self, *_hook_args) -> None:
        self._armed = self.require_sync and torch.is_grad_enabled()

    def forward(self, *args, **kwargs):
        """The wrapped module's forward, unchanged."""
        return self.module(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """A context in which backward does not synchronize (accumulation)."""
        return sync_paused(self)


class MemoryMeter:
    """Peak model-state bytes of a `ZeroDataParallel` (`train.memory`'s count): `peak` =
    {"params", "grads", "optimizer", "total"}, each its own maximum over the samples."""

    def __init__(self, owner):
        self.owner = owner
        self.peak = dict.fromkeys((*KINDS, "total"), 0)
        self.samples: list[tuple[str, int, int, int]] = []  # (where, params, grads, optimizer)

    def sample(self, where: str) -> None:
        """Record the model-state bytes now (tagged `where`) and keep each kind's peak."""
        now = model_state_bytes(self.owner, self.owner.opt)
        self.samples.append((where, *(now[kind] for kind in KINDS)))
        self.peak = {kind: max(value, now[kind]) for kind, value in self.peak.items()}


class Unit:
    """One layer's parameters: the slice [a, b) of the flat buffer (stages 2-3 move it)."""

    def __init__(self, name: str, module: nn.Module, params: list, a: int):
        self.name, self.module, self.params = name, module, params
        self.shapes = [p.shape for p in params]
        self.a, self.b = a, a + sum(p.numel() for p in params)
        self.flat: torch.Tensor | None = None  # stage 3: the slice (its storage freed if unused)
        self.flat_grad: torch.Tensor | None = None  # stages 2-3: its gradients, until reduced
        self.ready = 0  # parameters whose gradient arrived in this backward

    def attach(self, flat: torch.Tensor, attr: str = "data") -> None:
        """The parameters' `attr` ("data", or "grad": autograd adds into it) as views of `flat`."""
        for p, v, shape in zip(self.params, flat.split([s.numel() for s in self.shapes]),
                               self.shapes):
            setattr(p, attr, v.view(shape))

    @property
    def gathered(self) -> bool:
        """True while the unit's full flat parameters are materialized."""
        return self.flat is not None and self.flat.untyped_storage().nbytes() > 0

    def free(self) -> None:
        """Stage 3: release the whole parameters' memory, as FSDP1 does: resize the storage
        to 0 bytes, so the tensors autograd saved for backward (views such as W.t()) hold
        nothing either until `ZeroDataParallel.gather` refills the same storage."""
        self.flat.untyped_storage().resize_(0)


def layer_units(module: nn.Module) -> list[Unit]:
    """One unit per module owning trainable parameters, in order (tied: the first owner)."""
    seen, out, a = set(), [], 0  # ids of the parameters placed, the units, the next offset
    for name, m in module.named_modules():
        params = [p for p in m.parameters(recurse=False) if p.requires_grad and id(p) not in seen]
        seen.update(map(id, params))
        if params:
            out.append(Unit(name or "model", m, params, a))
            a = out[-1].b
    if not out:
        raise ValueError("module has no trainable parameters to shard")
    check_one_kind("module's trainable parameters", [p for u in out for p in u.params])
    return out


def check_one_kind(name: str, params: list) -> list:
    """`params`, or a ValueError naming `name` unless they share one dtype and device."""
    if len(kinds := {(p.dtype, p.device) for p in params}) > 1:
        raise ValueError(f"{name} must share one dtype and device, got {sorted(map(str, kinds))}")
    return params
