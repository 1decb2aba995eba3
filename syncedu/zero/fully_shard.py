"""`FullyShard`: ZeRO stage 3 with per-parameter sharding, as FSDP2's `fully_shard` does it.

Rajbhandari et al., SC 2020 (ZeRO-3). FSDP1 (Zhao et al., VLDB 2023) cuts a unit's flat
parameters in N, as `shards.Layout`; FSDP2 (`torch.distributed.fsdp.fully_shard`) gives every
rank c = ceil(d0 / N) of each parameter's d0 rows (`rows`: the last fewer, maybe none) and
swaps in the rank's shards (fp32 masters), so any optimizer on `.parameters()` updates 1/N of
the model. Modules chosen by `shard` (FSDP's wrap policy) are one `RowUnit` each (its pieces
padded to c rows); the rest is replicated.

1. set-up: rank 0's parameters to every rank; each sharded one replaced by this rank's rows;
2. forward of a sharded module (pre-hook): one `comm.all_gather` of its unit (copy-in the
   padded shards, copy-out full tensors), through an autograd function whose backward is
   step 3; the full tensors (cast to `compute_dtype`, FSDP2's param_dtype, as are the
   module's floating inputs) go in the module's `__dict__`, found before the shards; with
   `reshard_after_forward` saved tensors become tokens, gathered again in backward;
3. backward of the unit: the full fp32 gradients cut into the same padded pieces and
   reduce-scattered (`op="avg"`) into the shards' gradients; in `no_sync()` added into whole
   fp32 gradients instead (FSDP2's `set_requires_gradient_sync(False)`);
4. `finish_gradient_synchronization()`: replicated gradients allreduced (one flat buffer:
   the same bits on every rank); every trainable parameter gets a `.grad`.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch import nn

from syncedu.comm.torch_comm import TorchComm
from syncedu.dp.data_parallel import FlatSync
from syncedu.train.sampling import check_bool
from syncedu.zero.shards import Synced, broadcast_params

COMPUTE_DTYPES = (None, torch.float32, torch.float16, torch.bfloat16)


def rows(d0: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank's rows [lo, hi) of a dim-0 size `d0` (c = ceil(d0/N) each; the tail may be short)."""
    c = -(-d0 // world_size)
    return min(d0, rank * c), min(d0, (rank + 1) * c)


class RowUnit:
    """One module's sharded parameters (`names` in `module._parameters`)."""

    def __init__(self, module: nn.Module, names: list[str], shapes: list[torch.Size],
                 world_size: int, rank: int):
        self.module, self.names, self.shapes = module, names, shapes
        self.world_size, self.rank = world_size, rank
        self.rest = [s[1:].numel() for s in shapes]  # elements per row
        self.chunk = [-(-s[0] // world_size) * r for s, r in zip(shapes, self.rest)]
        self.offsets = [sum(self.chunk[:i]) for i in range(len(shapes))]
        self.size = sum(self.chunk)  # one rank's padded piece of the unit, in elements
        self.cache: list[torch.Tensor] | None = None  # re-gathered for backward
        self.accumulated: list[torch.Tensor] | None = None  # no_sync: whole fp32 gradients
        self.held_forward = 0  # bytes of the forward's gathered weights still held

    @property
    def shards(self) -> list[nn.Parameter]:
        """This unit's parameters as registered now: this rank's shards (between gathers)."""
        return [self.module._parameters[n] for n in self.names]

    def shard(self, i: int, full: torch.Tensor) -> torch.Tensor:
        """Step 1 (a copy)."""
        lo, hi = rows(self.shapes[i][0], self.world_size, self.rank)
        return full[lo:hi].clone()

    def unshard(self, comm, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
        """Step 2: the unit's full parameters, gathered (and cast to `dtype`) in one collective."""
        shards = [s.detach() for s in self.shards]
        dtype = dtype or shards[0].dtype
        send = shards[0].new_zeros(self.size, dtype=dtype)
        for s, a in zip(shards, self.offsets):
            send[a: a + s.numel()] = s.reshape(-1)  # copy-in (cast), the tail padded with zeros
        outs = [torch.empty_like(send) for _ in range(self.world_size)]
        comm.all_gather(outs, send)
        return [torch.cat([o[a: a + chunk] for o in outs]).view(-1, *shape[1:])[: shape[0]]
                for shape, a, chunk in zip(self.shapes, self.offsets, self.chunk)]  # copy-out

    def reduce(self, comm, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Step 3: the mean over ranks of this rank's rows of `grads` (fp32, shards' shapes)."""
        n = self.world_size
        pieces = [grads[0].new_zeros(self.size, dtype=torch.float32) for _ in range(n)]
        for g, shape, a, rest in zip(grads, self.shapes, self.offsets, self.rest):
            flat = g.detach().to(torch.float32).reshape(-1)
            for j in range(n):
                lo, hi = rows(shape[0], n, j)
                pieces[j][a: a + (hi - lo) * rest] = flat[lo * rest: hi * rest]
        out = pieces[0].new_empty(self.size)
        comm.reduce_scatter(out, pieces, op="avg")
        return [out[a: a + s.numel()].view(s.shape).clone()  # this rank's rows: the shard's shape
                for s, a in zip(self.shards, self.offsets)]


def policy(shard):
    """`shard` as a predicate on modules: None (all), a tuple of module types, or a callable."""
    if isinstance(shard, type) and issubclass(shard, nn.Module):
        shard = (shard,)
    if shard is None:
        return lambda m: True
    if isinstance(shard, tuple) and shard and all(
            isinstance(t, type) and issubclass(t, nn.Module) for t in shard):
        return lambda m: isinstance(m, shard)
    if callable(shard):
        return lambda m: bool(shard(m))
    raise ValueError(f"shard={shard!r} is unknown; give None (every module with parameters), "
                     f"a tuple of nn.Module types, or a predicate module -> bool")


class _Gather(torch.autograd.Function):
    """Forward: the unit's full parameters. Backward: their gradients reduce-scattered."""

    @staticmethod
    def forward(ctx, owner, unit, *shards):
        ctx.owner, ctx.unit, ctx.sync = owner, unit, owner.require_sync
        return tuple(unit.unshard(owner.shard_comm, owner.compute_dtype))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.owner.unit_backward(ctx.unit, grads, ctx.sync))


class FullyShard(Synced):
    """Shard `module`'s parameters over `comm`'s ranks (steps 1-4 of the module docstring);
    `compute_dtype` casts the gathered weights and sharded modules' inputs."""

    def __init__(self, module: nn.Module, comm=None, *, compute_dtype=None, shard=None,
                 reshard_after_forward: bool = True):
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype={compute_dtype!r} is not supported; choose one of "
                             f"{COMPUTE_DTYPES}")
        chosen = policy(shard)
        check_bool("reshard_after_forward", reshard_after_forward)
        comm = TorchComm() if comm is None else comm
        super().__init__(module, comm)
        self.reshard_after_forward, self.compute_dtype = reshard_after_forward, compute_dtype
        self._live: dict[int, tuple] = {}  # storage -> (unit, index, gathered tensor)
        self.gathered_bytes = self.peak_gathered_bytes = 0  # full weights held (see _held)
        if not list(module.parameters()):
            raise ValueError("module has no parameters to shard")
        broadcast_params(comm, list(module.parameters()))  # Step 1 (each tied one once)
        self.shard_comm = self._shard_comm(comm)
        self.units = self._build_units(chosen)
        sharded = {id(s) for u in self.units for s in u.shards}
        self.replicated = [p for p in module.parameters()  # after the swap
                           if p.requires_grad and id(p) not in sharded]
        for u in self.units:
            u.module.register_forward_pre_hook(self.pre_forward(u))
            u.module.register_forward_hook(self.post_forward(u))

    # ------------------------------------------------------------ set-up
    def _shard_comm(self, comm):
        """The ranks each parameter is cut over: all of them (HSDP: the node's)."""
        return comm

    def _build_units(self, chosen) -> list[RowUnit]:
        # A parameter two modules own (tied) stays replicated.
        count = Counter(id(p) for m in self.module.modules() for p in m._parameters.values()
                        if p is not None)
        units, n, r = [], self.shard_comm.world_size, self.shard_comm.rank
        for m in self.module.modules():
            # Only trainable tensors with a dim 0 are cut (scalars and frozen ones replicate).
            names = [k for k, p in m._parameters.items()
                     if p is not None and p.requires_grad and p.dim() >= 1 and count[id(p)] == 1]
            if not names or not chosen(m):
                continue
            u = RowUnit(m, names, [m._parameters[k].shape for k in names], n, r)
            for i, k in enumerate(names):
                full = m._parameters[k]
                if full.dtype != torch.float32 and self.compute_dtype is not None:
                    raise ValueError(f"parameter {k!r} is {full.dtype}: with compute_dtype the "
                                     f"parameters are the fp32 masters")
                m._parameters[k] = nn.Parameter(u.shard(i, full.detach()))
            units.append(u)
        return units

    # ------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        """Run the module; with `reshard_after_forward`, saved weights become tokens (Step 2)."""
        with (torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
              if self.reshard_after_forward else contextlib.nullcontext()):
            return self.module(*args, **kwargs)

    def pre_forward(self, u: RowUnit):
        def hook(module, args):
            fulls = _Gather.apply(self, u, *u.shards)  # Step 2
            u.held_forward += self._held(sum(f.nbytes for f in fulls))
            for i, (name, full) in enumerate(zip(u.names, fulls)):
                module.__dict__[name] = full
                if self.reshard_after_forward:
                    self._live[full.untyped_storage().data_ptr()] = (u, i, full)
            if self.compute_dtype is not None:
                return tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and
                             a.is_floating_point() else a for a in args)
            return None
        return hook

    def post_forward(self, u: RowUnit):
        """A forward hook for unit `u`: drop the gathered full parameters (when
        `reshard_after_forward`) and put the shards back.
        """
        def hook(module, _args, _output):
            if self.reshard_after_forward:
                self._held(-u.held_forward)
                u.held_forward = 0
            for name in u.names:
                full = module.__dict__.pop(name)
                self._live.pop(full.untyped_storage().data_ptr(), None)
        return hook

    def _pack(self, t: torch.Tensor):
        hit = self._live.get(t.untyped_storage().data_ptr()) if t.numel() else None
        if hit is None:
            return t
        u, i, full = hit  # Step 2: a token instead of the gathered weight (reshard)
        return (u, i, tuple(t.shape), t.stride(), t.storage_offset() - full.storage_offset())

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        u, i, shape, stride, offset = packed
        if u.cache is None:
            with torch.no_grad():
                u.cache = u.unshard(self.shard_comm, self.compute_dtype)  # backward all-gather
                self._held(sum(f.nbytes for f in u.cache))
        full = u.cache[i]
        return full.as_strided(shape, stride, full.storage_offset() + offset)

    def _held(self, delta: int) -> int:
        """Count full weights gathered (+) or let go (-); keep the peak. Returns `delta`."""
        self.gathered_bytes += delta
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)
        return delta

    # ------------------------------------------------------------ backward
    def unit_backward(self, u: RowUnit, grads, sync: bool) -> list:
        """Step 3: reduce-scatter the unit's gradients (or, in no_sync, add them up)."""
        if u.cache is not None:
            self._held(-sum(f.nbytes for f in u.cache))
        u.cache = None
        if u.held_forward:  # not resharded: autograd frees the forward's weights now
            self._held(-u.held_forward)
            u.held_forward = 0
        grads = [g.to(torch.float32) for g in grads]
        if u.accumulated is not None:
            grads = [a.add_(g) for a, g in zip(u.accumulated, grads)]
        if not sync:
            u.accumulated = grads
            return [None] * len(grads)
        u.accumulated = None
        return u.reduce(self.shard_comm, grads)

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Step 4: allreduce the replicated gradients; give every parameter a `.grad`."""
        if not self._armed:
            return
        self._armed = False
        for s in (s for u in self.units for s in u.shards if s.grad is None):
            s.grad = torch.zeros_like(s)
        if self.replicated:  # data parallelism's flat allreduce (lesson 03)
            FlatSync(self.replicated, self.comm).finish()

    # ------------------------------------------------------------ inspection
    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """The full fp32 parameters by the module's names (a collective: every rank calls it)."""
        fulls = {id(s): full.clone() for u in self.units
                 for s, full in zip(u.shards, u.unshard(self.shard_comm))}
        return {name: fulls.get(id(p), p.detach().clone())
                for name, p in self.module.named_parameters()}
