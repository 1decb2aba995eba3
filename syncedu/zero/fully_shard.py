"""`FullyShard`: ZeRO stage 3 with per-parameter sharding, as FSDP2's `fully_shard` does it.

Rajbhandari et al., SC 2020 (ZeRO-3). FSDP1 (Zhao et al., VLDB 2023) cuts a unit's flat
parameters in N, as `shards.Layout`; FSDP2 (`torch.distributed.fsdp.fully_shard`) gives every
rank c = ceil(d0 / N) of each parameter's d0 rows (`rows`: the last fewer, maybe none) and
swaps in the rank's shards (fp32 masters), so any optimizer on `.parameters()` updates 1/N of
the model.

Units, as FSDP2's `fully_shard(block)` for each block and then `fully_shard(model)`: every
module chosen by `shard` (FSDP's wrap policy; it may own no parameter itself) is one `RowUnit`
holding every parameter of its subtree that no nested chosen module holds, and the wrapped
root is always a unit holding the rest. A tied parameter (one tensor registered in several
modules) is sharded once, in the innermost unit that holds all its uses, so its gradient sums
both uses. A unit gathers before its module's forward and frees after it, so a module that
reads a child's weight without calling the child (`nn.MultiheadAttention` reads
`out_proj.weight`) finds it whole. Only 0-dim parameters stay replicated. The default,
`shard=None`, is the root alone (FSDP's default without a wrap policy): correct for any model.

1. set-up: rank 0's parameters to every rank; each sharded one replaced by this rank's rows
   (in every module that registers it);
2. forward of a unit's module (pre-hook): one `comm.all_gather` of its unit (copy-in the
   padded shards cast to `compute_dtype`, FSDP2's param_dtype; copy-out full tensors), through
   an autograd function whose backward is step 3; the full tensors go in the `__dict__` of
   each module registering them, found before the shards; with `reshard_after_forward` saved
   tensors become tokens, gathered again in backward. With `compute_dtype` every module's
   floating inputs are cast to it (replicated modules' too). With `prefetch` (FSDP2's default
   one unit ahead) the next unit's all-gather starts before it is needed: in forward when a
   unit starts, in the order the first forward met the units; in backward when a unit's
   weights are gathered again, in the order the first backward gathered them (the reverse of
   the order their forwards ended: FSDP2's post-forward order); each unit's gathered weights
   are counted from the gather's start (`peak_gathered_bytes`: one unit more);
3. backward of the unit: the full gradients cut into the same padded pieces and
   reduce-scattered (`op="avg"`) in `reduce_dtype` (None: the compute dtype, as FSDP2's
   `MixedPrecisionPolicy`) into the shards' fp32 gradients; in `no_sync()` added into whole
   fp32 gradients instead (FSDP2's `set_requires_gradient_sync(False)`). With `prefetch` the
   reduce-scatter runs on under the next unit's backward; as the backward ends (a callback on
   autograd's engine, as FSDP2's) every one is waited for and added into the shards' `.grad`;
4. `finish_gradient_synchronization()`: replicated gradients allreduced (one flat buffer:
   the same bits on every rank); every trainable parameter gets a `.grad`;
5. `clip_grad_norm_(max_norm)`: the norm over all shards (a sum over ranks) and the
   replicated gradients, as torch's `clip_grad_norm_` on the unsharded model;
6. checkpoints: `sharded_state_dict()` holds this rank's rows with their global shape and
   first row; `load_sharded_state_dict` cuts any world size's pieces into this rank's rows
   (the idea of `torch.distributed.checkpoint`'s metadata, for plain tensors on any `Comm`).
"""

from __future__ import annotations

import contextlib
import itertools
from functools import partial

import torch
from torch import nn

from syncedu.comm.runs import check_bool, check_choice
from syncedu.comm.torch_comm import TorchComm
from syncedu.dp.data_parallel import FlatSync
from syncedu.zero.prefetch import Prefetching
from syncedu.zero.shards import Synced, broadcast_params, clip_grad_norm

COMPUTE_DTYPES = (None, torch.float32, torch.float16, torch.bfloat16)


def rows(d0: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank's rows [lo, hi) of a dim-0 size `d0` (c = ceil(d0/N) each; the tail may be short)."""
    c = -(-d0 // world_size)
    return min(d0, rank * c), min(d0, (rank + 1) * c)


class RowUnit:
    """One unit's sharded parameters: `slots[i]` lists every (module, name) registering
    parameter i (a tied one: several), `trainable[i]` whether it gets a gradient."""

    def __init__(self, module: nn.Module, params: list, world_size: int, rank: int):
        """`params`: (full parameter, its slots) pairs."""
        self.module, self.world_size, self.rank = module, world_size, rank
        self.slots, self.shapes = [s for _, s in params], [p.shape for p, _ in params]
        self.trainable = [p.requires_grad for p, _ in params]
        self.rest = [s[1:].numel() for s in self.shapes]  # elements per row
        self.chunk = [-(-s[0] // world_size) * r for s, r in zip(self.shapes, self.rest)]
        self.offsets = list(itertools.accumulate(self.chunk, initial=0))
        self.size = self.offsets.pop()  # one rank's padded piece of the unit, in elements
        self.cache: list[torch.Tensor] | None = None  # re-gathered for backward
        self.accumulated: list[torch.Tensor] | None = None  # no_sync: whole fp32 gradients
        self.pending: list | None = None  # HSDP's deferred allreduce: the node's mean shards
        self.held = 0  # bytes of gathered weights alive (forward's, backward's, prefetched)

    @property
    def shards(self) -> list[nn.Parameter]:
        """This unit's parameters as registered now: this rank's shards (between gathers)."""
        return [m._parameters[k] for (m, k), *_ in self.slots]

    def unshard(self, comm, dtype: torch.dtype | None = None):
        """Step 2: start the unit's all-gather (one collective, cast to `dtype`); returns a
        function that waits for it and returns the full parameters (called at once, or later:
        a prefetch)."""
        shards = [s.detach() for s in self.shards]
        send = shards[0].new_zeros(self.size, dtype=dtype or shards[0].dtype)
        for s, a in zip(shards, self.offsets):
            send[a: a + s.numel()] = s.reshape(-1)  # copy-in (cast), the tail padded with zeros
        outs = [torch.empty_like(send) for _ in range(self.world_size)]
        work = comm.all_gather(outs, send, async_op=True)
        return lambda: work.wait() or [  # (wait() returns None) then the copy-out
            torch.cat([o[a: a + chunk] for o in outs]).view(-1, *shape[1:])[: shape[0]]
            for shape, a, chunk in zip(self.shapes, self.offsets, self.chunk)]

    def reduce(self, comm, grads: list, dtype: torch.dtype):
        """Step 3: start reduce-scattering the mean over ranks (in `dtype`) of this rank's rows
        of the trainable `grads`; returns a function that waits and returns them as fp32
        tensors of the shards' shapes (None for frozen parameters)."""
        n, keep = self.world_size, [i for i, t in enumerate(self.trainable) if t]
        at = list(itertools.accumulate((self.chunk[i] for i in keep), initial=0))
        pieces = [grads[keep[0]].new_zeros(at[-1], dtype=dtype) for _ in range(n)]
        for i, a in zip(keep, at):
            flat, rest = grads[i].detach().to(dtype).reshape(-1), self.rest[i]
            for j in range(n):
                lo, hi = rows(self.shapes[i][0], n, j)
                pieces[j][a: a + (hi - lo) * rest] = flat[lo * rest: hi * rest]
        work = comm.reduce_scatter(out := pieces[0].new_empty(at[-1]), pieces, op="avg",
                                   async_op=True)
        mine = (out[a: a + s.numel()].view(s.shape) for s, a in
                zip([self.shards[i] for i in keep], at))  # run once wait() has divided "avg"
        return lambda: work.wait() or [next(mine).to(torch.float32, copy=True) if t else None
                                       for t in self.trainable]


def policy(shard):
    """`shard` as a predicate on modules: None (none: the root alone), a tuple of module
    types, or a callable."""
    def module_type(t):
        return isinstance(t, type) and issubclass(t, nn.Module)
    if module_type(shard) or isinstance(shard, tuple) and shard and all(map(module_type, shard)):
        return lambda m: isinstance(m, shard)  # (isinstance takes a type or a tuple of them)
    if shard is None or callable(shard):
        return lambda m: shard is not None and bool(shard(m))
    raise ValueError(f"shard={shard!r} is unknown; give None (the root as one unit), a tuple "
                     f"of nn.Module types, or a predicate module -> bool")


class _Gather(torch.autograd.Function):
    """Forward: the unit's full parameters. Backward: their gradients reduce-scattered."""

    @staticmethod
    def forward(ctx, owner, unit, *shards):
        ctx.owner, ctx.unit, ctx.sync = owner, unit, owner.require_sync
        fulls = tuple(owner._fulls(unit, "forward"))  # (and the next unit's prefetch)
        ctx.mark_non_differentiable(*(f for f, t in zip(fulls, unit.trainable) if not t))
        return fulls

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.owner.unit_backward(ctx.unit, grads, ctx.sync))


class FullyShard(Prefetching, Synced):
    """Shard `module`'s parameters over `comm`'s ranks (steps 1-5 of the module docstring).

    Args:
        module: the model; its `.parameters()` become this rank's shards (fp32 masters).
        comm: a `Comm` (None: `TorchComm()` on the default process group).
        compute_dtype: dtype of the gathered weights and of every module's floating inputs
            (FSDP2's `param_dtype`); None: the parameters' own.
        reduce_dtype: dtype of the gradient reduce-scatter; None: `compute_dtype` (as FSDP2).
        shard: the units besides the root: a tuple of module types or a predicate; None: the
            root alone.
        reshard_after_forward: free the gathered weights after each unit's forward (gather
            again in backward).
        prefetch: start the next unit's all-gather before it is needed (step 2), and let each
            reduce-scatter run on under the next unit's backward (step 3); False: every
            collective waited for where it is issued.
    """

    def __init__(self, module: nn.Module, comm=None, *, compute_dtype=None, shard=None,
                 reshard_after_forward: bool = True, reduce_dtype=None, prefetch: bool = True):
        for name, dtype in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            check_choice(name, dtype, COMPUTE_DTYPES)
        chosen = policy(shard)
        super().__init__(module, comm := TorchComm() if comm is None else comm)
        self.reshard_after_forward = check_bool("reshard_after_forward", reshard_after_forward)
        self.prefetch, self.compute_dtype = check_bool("prefetch", prefetch), compute_dtype
        # Units as the first pass of each step gathered them; prefetched all-gathers not used
        # yet (unit -> function); reduce-scatters in flight ((unit, function)); `_settle` also
        # sets `_passed`: the units gathered in this pass.
        self.order, self._gathering, self._reducing = {"forward": {}, "backward": {}}, {}, []
        self._settle()
        self.reduce_dtype = reduce_dtype or compute_dtype or torch.float32
        # storage -> (unit, index, gathered tensor); the full weights held (see _held)
        self._live, self.gathered_bytes, self.peak_gathered_bytes = {}, 0, 0
        if not list(module.parameters()):
            raise ValueError("module has no parameters to shard")
        self.shard_comm = self._shard_comm(comm)  # (HSDP: checks its nodes, before any traffic)
        broadcast_params(comm, list(module.parameters()))  # Step 1 (each tied one once)
        self.units = self._build_units(chosen)
        self.replicated = [p for p in module.parameters() if p.requires_grad and p.dim() == 0]
        module.register_forward_pre_hook(lambda *_: self._settle())  # a forward starts
        for u in self.units:
            u.module.register_forward_pre_hook(partial(self.pre_forward, u))
            u.module.register_forward_hook(partial(self.post_forward, u))
        for m in module.modules() if compute_dtype is not None else ():
            m.register_forward_pre_hook(self._cast_inputs, with_kwargs=True)

    # ------------------------------------------------------------ set-up
    def _shard_comm(self, comm):
        """The ranks each parameter is cut over: all of them (HSDP: the node's)."""
        return comm

    def _build_units(self, chosen) -> list[RowUnit]:
        """Step 1: a unit per chosen module and the root; each parameter in the innermost unit
        that holds all the modules registering it."""
        root, up, head, stack = self.module, {}, {}, [(self.module, None)]
        while stack:  # up: unit module -> the unit above it; head: module -> its unit
            m, above = stack.pop()
            if m is root or chosen(m):
                up[m], above = above, m
            head[m] = above
            stack += [(c, above) for c in m.children()]

        def chain(m):  # m's unit and every unit above it
            return [m] + chain(up[m]) if m is not None else []

        uses: dict = {}  # every shardable parameter (floating, >= 1-D) -> [(module, name), ...]
        for m in root.modules():
            for k, p in m._parameters.items():
                if p is not None and p.dim() >= 1 and p.is_floating_point():
                    uses.setdefault(p, []).append((m, k))
        owned: dict[nn.Module, list] = {m: [] for m in up}  # unit -> [(parameter, slots)]
        for p, slots in uses.items():
            inner = next(u for u in chain(head[slots[0][0]])
                         if all(u in chain(head[m]) for m, _ in slots))
            owned[inner].append((p, slots))
        n, r, units = self.shard_comm.world_size, self.shard_comm.rank, []
        for m, params in ((m, ps) for m, ps in owned.items() if ps):
            units.append(RowUnit(m, params, n, r))
            for p, slots in params:
                if p.dtype != torch.float32 and self.compute_dtype is not None:
                    raise ValueError(f"parameter {slots[0][1]!r} is {p.dtype}: with "
                                     f"compute_dtype the parameters are the fp32 masters")
                lo, hi = rows(p.shape[0], n, r)  # Step 1: my rows, a copy
                shard = nn.Parameter(p.detach()[lo:hi].clone(), requires_grad=p.requires_grad)
                for module, name in slots:
                    module._parameters[name] = shard
        return units

    # ------------------------------------------------------------ forward
    def forward(self, *args, **kwargs):
        """Run the module; with `reshard_after_forward`, saved weights become tokens (Step 2)."""
        with (torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
              if self.reshard_after_forward else contextlib.nullcontext()):
            return self.module(*args, **kwargs)

    def pre_forward(self, u: RowUnit, module, args) -> None:
        """A forward pre-hook for unit `u` (bound with `partial`): gather its full parameters
        (Step 2), prefetch the next unit's, and show the full tensors to every module."""
        fulls = _Gather.apply(self, u, *u.shards)  # Step 2
        for i, (slots, full) in enumerate(zip(u.slots, fulls)):
            for owner, name in slots:  # every module registering it sees it whole
                owner.__dict__[name] = full
            if self.reshard_after_forward:
                self._live[full.untyped_storage().data_ptr()] = (u, i, full)

    def _cast_inputs(self, module, args, kwargs):
        """Step 2: every module's floating inputs in `compute_dtype`."""
        def cast(a):
            return a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
        return tuple(map(cast, args)), {k: cast(v) for k, v in kwargs.items()}

    def post_forward(self, u: RowUnit, module, _args, _output) -> None:
        """A forward hook for unit `u` (bound with `partial`): drop the gathered full
        parameters (when `reshard_after_forward`) and put the shards back.
        """
        if self.reshard_after_forward:
            u.held += self._held(-u.held)  # let them go: 0 held
        for slots in u.slots:
            fulls = [owner.__dict__.pop(name) for owner, name in slots]
            self._live.pop(fulls[0].untyped_storage().data_ptr(), None)

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
        u.cache = u.cache or self._fulls(u, "backward")  # the backward all-gather (or prefetch)
        full = u.cache[i]
        return full.as_strided(shape, stride, full.storage_offset() + offset)

    def _held(self, delta: int) -> int:
        """Count full weights gathered (+) or let go (-); keep the peak. Returns `delta`."""
        self.gathered_bytes += delta
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)
        return delta

    # ------------------------------------------------------------ backward
    def unit_backward(self, u: RowUnit, grads, sync: bool) -> list:
        """Step 3: reduce-scatter the unit's gradients (or, in no_sync, add them up): the
        shards' gradients, or (prefetching) Nones, the reduce-scatter left running (`reduced`)."""
        u.cache = None
        u.held += self._held(-u.held)  # the gathered weights go (autograd frees them now)
        grads = [g.to(torch.float32) for g in grads]
        if u.accumulated is not None:
            grads = [a.add_(g) for a, g in zip(u.accumulated, grads)]
        if not sync:
            u.accumulated = grads
            return [None] * len(grads)
        u.accumulated = None
        return self.reduced(u, u.reduce(self.shard_comm, grads, self.reduce_dtype))  # started

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Step 4: allreduce the replicated gradients; give every parameter a `.grad`."""
        if not self._armed:
            return
        self._armed = False
        for s in (s for u in self.units for s in u.shards if s.grad is None and s.requires_grad):
            s.grad = torch.zeros_like(s)
        if self.replicated:  # data parallelism's flat allreduce (lesson 03)
            FlatSync(self.replicated, self.comm).finish()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Step 5: clip every gradient in place by the norm of the whole model's (returned),
        as `torch.nn.utils.clip_grad_norm_` on the unsharded model (FSDP1's method name)."""
        self.finish_gradient_synchronization()
        shards = [s.grad for u in self.units for s in u.shards if s.grad is not None]
        return clip_grad_norm(self.comm, shards, [p.grad for p in self.replicated], max_norm,
                              norm_type, copies=self.comm.world_size // self.shard_comm.world_size)

    # ------------------------------------------------------------ inspection
    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """The full fp32 parameters by the module's names (a collective: every rank calls it)."""
        fulls = {id(s): full.clone() for u in self.units
                 for s, full in zip(u.shards, u.unshard(self.shard_comm)())}
        return {name: fulls.get(id(p), p.detach().clone())
                for name, p in self.module.named_parameters()}

    # ------------------------------------------------------------ checkpoints
    def _where(self) -> dict:
        """By parameter name: (global shape, first row, end row) on this rank (None: whole)."""
        n, r = self.shard_comm.world_size, self.shard_comm.rank
        full = {s: tuple(shape) for u in self.units for s, shape in zip(u.shards, u.shapes)}
        return {k: (full[p], *rows(full[p][0], n, r)) if p in full else (tuple(p.shape), None, None)
                for k, p in self.module.named_parameters()}

    @torch.no_grad()
    def sharded_state_dict(self, optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Step 6, a sharded checkpoint: by parameter name, this rank's rows ("param"), their
        global "shape" and first "row" (None: replicated, whole), and `optimizer`'s state for
        them ("optim.exp_avg", ...). Each rank saves its own (`torch.save`); HSDP: one node's."""
        where, state = self._where(), optimizer.state if optimizer is not None else {}
        return {name: {"shape": where[name][0], "row": where[name][1], "param": p.detach().clone(),
                       **{f"optim.{k}": v.clone() if torch.is_tensor(v) else v
                          for k, v in state.get(p, {}).items()}}
                for name, p in self.module.named_parameters()}

    @torch.no_grad()
    def load_sharded_state_dict(self, saved: list[dict],
                                optimizer: torch.optim.Optimizer | None = None) -> None:
        """Load the `sharded_state_dict()`s of every rank of a run at any world size (in any
        order; `torch.load(..., mmap=True)` reads only the rows used): this rank's rows of each
        parameter and of the optimizer's per-element state, cut from the saved pieces."""
        where = self._where()
        if {k: v["shape"] for k, v in saved[0].items()} != {k: w[0] for k, w in where.items()}:
            raise ValueError("saved is a checkpoint of another model: its parameter names or "
                             "global shapes differ from this module's")
        for name, p in self.module.named_parameters():
            # in row order, whatever the list's (sorted file names put rank10 before rank2)
            pieces = sorted((s[name] for s in saved), key=lambda e: e["row"] or 0)
            lo, hi = where[name][1:]
            p.copy_(_cut(pieces, "param", lo, hi))
            if optimizer is not None and any(k.startswith("optim.") for k in pieces[0]):
                optimizer.state[p] = {k[6:]: _cut(pieces, k, lo, hi) for k in pieces[0]
                                      if k.startswith("optim.")}


def _cut(pieces: list[dict], key: str, lo: int, hi: int):
    """Rows [lo, hi) of `key` from saved pieces (each {"row": its first row, key: its rows});
    0-dim tensors (replicated parameters, Adam's step) and other values whole, copied."""
    if not torch.is_tensor(first := pieces[0][key]) or first.dim() == 0:
        return first.clone() if torch.is_tensor(first) else first
    return torch.cat([e[key][max(lo, e["row"]) - e["row"]: max(0, hi - e["row"])] for e in pieces])
