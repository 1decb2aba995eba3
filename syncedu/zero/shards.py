"""What ZeRO is built from: one flat buffer cut into N shards, the two halves of an
allreduce on it (whole, or one layer's slice at a time), and a meter of the
model-state bytes a rank really holds.

A ring allreduce *is* a reduce-scatter followed by an all-gather (Patarasuk &
Yuan 2009); ZeRO (Rajbhandari et al., SC 2020) shards what lies between them.
The trainable parameters, in module order, make one buffer of `numel` elements;
rank r owns its contiguous shard r (`Layout`), cut one of two ways (`SPLITS`):
"padded" (ceil(numel / N) each, zeros appended, so the built-ins
`comm.reduce_scatter` / `comm.all_gather`, which want equal pieces, move it
whole) or "uneven" (`ring_chunks`, sizes differing by at most one: the cut of
`comm.all_reduce`, so every element is summed in data parallelism's order).
A layer is a slice [a, b) of the buffer; its piece on rank j is the slice's
overlap with shard j (often empty), moved by lesson 02's ring with uneven chunks.

1. `reduce_scatter_mean(comm, pieces, builtin)`: rank r gets the mean over ranks
   of `pieces[r]` (the gradient half);
2. `all_gather(comm, pieces, builtin)`: every `pieces[j]` becomes rank j's (the
   parameter half); `start_direct_all_gather` does it in the background (prefetch);
3. `MemoryMeter`: peaks of parameters, gradients and optimizer state, each storage
   counted once (`train.memory.held_bytes`: a view counts its buffer once);
4. `layer_units(module)`: the `Unit`s, each a slice [a, b) of the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from syncedu.collectives.algorithms import ring_all_gather_chunks, ring_reduce_scatter_chunks
from syncedu.comm.ledger import ring_chunks
from syncedu.train.memory import held_bytes

SPLITS = ("padded", "uneven")
_KINDS = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class Layout:
    """How `numel` elements are cut into `world_size` shards (see the module docstring)."""

    numel: int
    world_size: int
    split: str = "padded"

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"split={self.split!r} is unknown; choose one of {SPLITS}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size={self.world_size!r} must be an int >= 1")
        if not isinstance(self.numel, int) or self.numel < 0:
            raise ValueError(f"numel={self.numel!r} must be an int >= 0")

    @property
    def sizes(self) -> list[int]:
        """Elements in each rank's shard."""
        if self.split == "uneven":
            return ring_chunks(self.numel, self.world_size)
        return [-(-self.numel // self.world_size)] * self.world_size

    @property
    def padded_numel(self) -> int:
        """Length of the whole buffer: `numel` plus the padding ("padded" only)."""
        return sum(self.sizes)

    def start(self, rank: int) -> int:
        return sum(self.sizes[:rank])

    def ranges(self, a: int, b: int) -> list[tuple[int, int]]:
        """Per rank j, the part (lo, hi) of the slice [a, b) that lies in shard j."""
        out = []
        for j, size in enumerate(self.sizes):
            lo, hi = max(a, self.start(j)), min(b, self.start(j) + size)
            out.append((lo, max(lo, hi)))
        return out

    def within_shard(self, a: int, b: int, rank: int) -> tuple[int, int]:
        """Where rank `rank`'s part of the slice [a, b) lies inside its own shard."""
        lo, hi = self.ranges(a, b)[rank]
        return lo - self.start(rank), hi - self.start(rank)

    def pieces(self, buf: torch.Tensor, a: int = 0) -> list[torch.Tensor]:
        """`buf` (the slice [a, a + len(buf)) of the whole buffer) cut at the shard borders."""
        return [buf[lo - a: hi - a] for lo, hi in self.ranges(a, a + buf.numel())]


def flatten(tensors, numel: int | None = None) -> torch.Tensor:
    """`tensors` end to end in one new buffer (of `numel` elements: zeros after them)."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    return flat if numel is None else torch.cat([flat, flat.new_zeros(numel - flat.numel())])


def unflatten(flat: torch.Tensor, like) -> list[torch.Tensor]:
    """`flat` cut into views shaped like the tensors `like` (the inverse of `flatten`)."""
    out, a = [], 0
    for t in like:
        out.append(flat[a: a + t.numel()].view_as(t))
        a += t.numel()
    return out


@torch.no_grad()
def broadcast_params(comm, params, numel: int | None = None) -> torch.Tensor:
    """Rank 0's `params` on every rank, as DDP starts: one broadcast of one flat buffer
    (returned; `numel`: padded to that length)."""
    flat = flatten(params, numel)
    comm.broadcast(flat, src=0)
    for p, v in zip(params, unflatten(flat, params)):
        p.copy_(v)
    return flat


def ring_reduce_scatter_pieces(comm, pieces: list[torch.Tensor]) -> torch.Tensor:
    """Ring reduce-scatter in place: afterwards `pieces[r]` on rank r is the sum over ranks.

    Lesson 02's ring (`ring_reduce_scatter_chunks`), which adds in the order of a ring
    allreduce (and the simulator's `comm.all_reduce`); empty pieces skip the wire.
    """
    with comm.scope("ring_reduce_scatter"):
        ring_reduce_scatter_chunks(comm, pieces, list(range(comm.world_size)), skip_empty=True)
    return pieces[comm.rank]


def ring_all_gather_pieces(comm, pieces: list[torch.Tensor]) -> None:
    """Ring all-gather in place (the collectives' `ring_all_gather_chunks`)."""
    with comm.scope("ring_all_gather"):
        ring_all_gather_chunks(comm, pieces, list(range(comm.world_size)), skip_empty=True)


def start_direct_all_gather(comm, pieces: list[torch.Tensor], tag: int) -> list:
    """All-gather without waiting (stage 3's prefetch): every rank sends its piece straight
    to every other and posts its receives; returns the handles to `wait()`. The ring's
    bytes, and on one port about its time, but in the background while the rank computes."""
    me, works = comm.rank, []
    with comm.scope("prefetch_all_gather"):
        for j, piece in enumerate(pieces):
            if j != me and piece.numel():
                works.append(comm.irecv(piece, j, tag))
            if j != me and pieces[me].numel():
                works.append(comm.isend(pieces[me], j, tag))
    return works


def reduce_scatter_mean(comm, pieces: list[torch.Tensor], builtin: bool) -> torch.Tensor:
    """Step 1: the mean over ranks of `pieces[comm.rank]`: `builtin` (equal pieces only)
    `comm.reduce_scatter` into a new tensor, else our ring in place (partial sums stay)."""
    if builtin:
        out = pieces[comm.rank].new_empty(pieces[comm.rank].numel())
        return comm.reduce_scatter(out, pieces, op="avg")
    return ring_reduce_scatter_pieces(comm, pieces).div_(comm.world_size)


def all_gather(comm, pieces: list[torch.Tensor], builtin: bool) -> None:
    """Step 2: fill every piece from its owner (`builtin`: `comm.all_gather`, equal pieces)."""
    if builtin:
        # Our own piece is both input and output: the built-ins copy it onto itself.
        comm.all_gather(pieces, pieces[comm.rank])
    else:
        ring_all_gather_pieces(comm, pieces)


class MemoryMeter:
    """Peak bytes of model state a `ZeroDataParallel` held: `peak` = {"params", "grads",
    "optimizer", "total"} (each its own maximum; "total" the largest sum at one sample)."""

    def __init__(self, owner):
        self.owner = owner
        self.peak = dict.fromkeys((*_KINDS, "total"), 0)
        self.samples: list[tuple[str, int, int, int]] = []  # (where, params, grads, optimizer)

    def sample(self, where: str) -> None:
        o = self.owner
        params = held_bytes([p.data for p in o.params] + [o.shard.data, o.flat]
                            + [u.flat for u in o.units])
        grads = held_bytes([p.grad for p in o.params] + [o.shard.grad, o.flat_grad]
                           + [u.flat_grad for u in o.units])
        optim = held_bytes(t for s in o.opt.state.values() for t in s.values()
                           if isinstance(t, torch.Tensor))
        self.samples.append((where, params, grads, optim))
        for kind, value in zip((*_KINDS, "total"), (params, grads, optim, params + grads + optim)):
            self.peak[kind] = max(self.peak[kind], value)


class Unit:
    """One layer's parameters: the slice [a, b) of the flat buffer (stages 2-3 move it)."""

    def __init__(self, name: str, module: nn.Module, params: list, a: int):
        self.name, self.module, self.params = name, module, params
        self.shapes = [p.shape for p in params]  # stage 3 leaves the parameters empty
        self.a, self.b = a, a + sum(p.numel() for p in params)
        self.flat: torch.Tensor | None = None  # stage 3: the gathered slice, while in use
        self.flat_grad: torch.Tensor | None = None  # stages 2-3: its gradients, until reduced
        self.pending: list = []  # stage 3 with prefetch: the all-gather's sends and receives
        self.ready = 0  # parameters whose gradient arrived in this backward

    def attach(self, flat: torch.Tensor) -> None:
        """Point every parameter at its part of `flat` (this unit's slice, or more)."""
        offset = 0
        for p, shape in zip(self.params, self.shapes):
            p.data = flat[offset: offset + shape.numel()].view(shape)
            offset += shape.numel()

    def attach_grads(self, flat_grad: torch.Tensor) -> None:
        """`.grad`s as views of `flat_grad`: autograd adds into them in place."""
        offset = 0
        for p, shape in zip(self.params, self.shapes):
            p.grad = flat_grad[offset: offset + shape.numel()].view(shape)
            offset += shape.numel()

    def free(self) -> None:
        """Stage 3: drop the whole parameters (0-element placeholders stay in the module)."""
        self.flat = None
        for p in self.params:
            p.data = p.data.new_empty(0)


def layer_units(module: nn.Module) -> list[Unit]:
    """One unit per module that owns trainable parameters, in module order, each parameter
    once (tied weights with their first owner), each a slice of the flat buffer."""
    seen: set[int] = set()

    def fresh(params) -> list:
        out = [p for p in params if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in out)
        return out

    groups = [(name or "model", m, fresh(m.parameters(recurse=False)))
              for name, m in module.named_modules()]
    groups = [g for g in groups if g[2]]
    if not groups:
        raise ValueError("module has no trainable parameters to shard")
    kinds = {(p.dtype, p.device) for _, _, ps in groups for p in ps}
    if len(kinds) > 1:
        raise ValueError(f"module's trainable parameters must share one dtype and device, "
                         f"got {sorted(map(str, kinds))}")
    out, a = [], 0
    for name, m, params in groups:
        out.append(Unit(name, m, params, a))
        a = out[-1].b
    return out
