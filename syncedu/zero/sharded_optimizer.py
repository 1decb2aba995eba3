"""`ShardedOptimizer`: ZeRO stage 1 as an optimizer, over any `torch.optim` optimizer.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", SC 2020, stage 1 (P_os): every rank keeps whole parameters
and gradients but the optimizer state of 1/N of them. torch ships the same idea
as `torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class,
**defaults)`, which hands each rank whole parameters (greedily by size) and
broadcasts them after the step. Here the trainable parameters are laid end to
end, in parameter-group order (each tensor once, so tied weights count once),
and cut by `zero_shards.Layout` into N contiguous shards of ceil or floor
(Psi / N) elements ("uneven": sizes differ by at most one, as a ring
allreduce cuts a buffer). Rank r's shard is a list of pieces, each a view of
one parameter's storage; the local optimizer `.optim` (an `optimizer_cls`)
holds those pieces, so its state (Adam's moments, SGD's momentum) exists for
the shard alone. Element-wise optimizers (SGD, Adam, AdamW, ...) therefore do
exactly the arithmetic of the unsharded one. A step:

1. gradients: with `reduce_scatter=False` they were averaged already (DDP or
   `dp.DataParallel`); with `reduce_scatter=True` this optimizer averages them
   itself with a ring reduce-scatter (the first half of a ring allreduce), so
   each rank receives the mean of its shard only;
2. copy every hyperparameter of `param_groups` (which the user or a scheduler
   may change, as on any torch optimizer) into the local groups and run
   `.optim.step()` on the shard (a piece whose parameter has no gradient is
   skipped, as torch skips such a parameter);
3. all-gather the updated shards (the second half of the allreduce), so every
   rank again holds the whole, equal parameters.

Traffic per step: an all-gather of Psi elements (and, with `reduce_scatter`,
a reduce-scatter of Psi): together exactly one ring allreduce, 1x data
parallelism's bytes, by the ledger.

Used in: notebooks/10_sharded_data_parallel; tests/zero/test_sharded_optimizer.py.
"""

from __future__ import annotations

import torch

from syncedu.zero.shards import (
    Layout,
    held_bytes,
    ring_all_gather_pieces,
    ring_reduce_scatter_pieces,
)

__all__ = ["ShardedOptimizer", "check_optimizer_cls"]


def check_optimizer_cls(optimizer_cls) -> type:
    """Raise ValueError unless `optimizer_cls` is a subclass of torch.optim.Optimizer."""
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        raise ValueError(f"optimizer_cls={optimizer_cls!r} must be a torch.optim.Optimizer "
                         f"subclass, e.g. torch.optim.AdamW (the class, not an instance)")
    return optimizer_cls


def _groups(params) -> list[dict]:
    """Parameter groups as torch takes them: an iterable of tensors or of dicts."""
    params = list(params)
    if not params:
        raise ValueError("params is empty: give the parameters (or parameter groups) to optimize")
    if all(isinstance(g, dict) for g in params):
        return [{**g, "params": list(g["params"]) if not isinstance(g["params"], torch.Tensor)
                 else [g["params"]]} for g in params]
    if not all(isinstance(p, torch.Tensor) for p in params):
        raise ValueError("params must be tensors or parameter-group dicts, not a mixture")
    return [{"params": params}]


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 over `optimizer_cls` (see the module docstring).

    A `torch.optim.Optimizer` itself (as torch's ZeroRedundancyOptimizer), so
    learning-rate schedulers take it; its `param_groups` hold the whole
    parameters and the hyperparameters the next `step()` uses.

    Args:
        params: tensors or parameter groups (dicts with "params" and their own
            hyperparameters), as for any torch optimizer.
        optimizer_cls: a `torch.optim.Optimizer` subclass, e.g. `torch.optim.AdamW`.
        comm: this rank's `Comm`; None wraps torch.distributed's default group
            (`syncedu.comm.TorchComm()`).
        reduce_scatter: average the gradients here (reduce-scatter) instead of
            trusting that DDP / `dp.DataParallel` averaged them already.
        **kwargs: `optimizer_cls`'s defaults (lr, weight_decay, betas, ...).
    """

    def __init__(self, params, optimizer_cls, comm=None, *, reduce_scatter: bool = False,
                 **kwargs):
        check_optimizer_cls(optimizer_cls)
        if reduce_scatter not in (True, False):
            raise ValueError(f"reduce_scatter={reduce_scatter!r} must be a bool")
        if comm is None:
            from syncedu.comm import TorchComm
            comm = TorchComm()
        self.comm, self.reduce_scatter = comm, reduce_scatter
        groups = _groups(params)
        # Step 0: each trainable tensor once, in group order (tied weights once).
        seen: set[int] = set()
        self.params: list[torch.Tensor] = []
        for g in groups:
            g["params"] = [p for p in g["params"] if not (id(p) in seen or seen.add(id(p)))]
            for p in g["params"]:
                if not p.is_contiguous():
                    raise ValueError("params must be contiguous tensors")
            self.params += [p for p in g["params"] if p.requires_grad]
        if not self.params:
            raise ValueError("params has no tensor with requires_grad=True to optimize")
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise ValueError(f"params must share one dtype and device, "
                             f"got {sorted(map(str, kinds))}")
        self.offsets, a = [], 0
        for p in self.params:
            self.offsets.append(a)
            a += p.numel()
        self.layout = Layout(a, comm.world_size, "uneven")
        self.optim = self._local_optimizer(groups, optimizer_cls, kwargs)
        super().__init__(self._full_groups(groups), dict(self.optim.defaults))
        self._broadcast()

    # ------------------------------------------------------------ set-up
    def _mine(self, p_index: int) -> tuple[int, int]:
        """Where this rank's shard overlaps parameter `p_index`, in its flattened elements."""
        a = self.offsets[p_index]
        lo, hi = self.layout.ranges(a, a + self.params[p_index].numel())[self.comm.rank]
        return lo - a, hi - a

    def _local_optimizer(self, groups, optimizer_cls, kwargs):
        index = {id(p): i for i, p in enumerate(self.params)}
        self.pieces: list[tuple[int, torch.Tensor]] = []  # (parameter index, view of my part)
        local = []
        for g in groups:
            mine = []
            for p in g["params"]:
                if id(p) not in index:
                    continue  # frozen: never stepped, as the unsharded optimizer skips it
                i = index[id(p)]
                lo, hi = self._mine(i)
                if hi > lo:
                    piece = p.detach().view(-1)[lo:hi]
                    self.pieces.append((i, piece))
                    mine.append(piece)
            local.append({**g, "params": mine})
        if not self.pieces:  # more ranks than elements: torch refuses an empty optimizer
            local[0]["params"] = [self.params[0].new_empty(0)]
        return optimizer_cls(local, **kwargs)

    def _full_groups(self, groups) -> list[dict]:
        """The user's view: whole parameters, with the local groups' filled-in defaults."""
        return [{**lg, "params": g["params"]}
                for g, lg in zip(groups, self.optim.param_groups)]

    @torch.no_grad()
    def _broadcast(self) -> None:
        """Start from rank 0's parameters (as DDP and ZeroRedundancyOptimizer do)."""
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.comm.broadcast(flat, src=0)
        self._scatter(flat)

    def _scatter(self, flat: torch.Tensor) -> None:
        for p, a in zip(self.params, self.offsets):
            p.detach().copy_(flat[a: a + p.numel()].view_as(p))

    # ------------------------------------------------------------ a step
    @torch.no_grad()
    def _average(self) -> None:
        """Step 1 (reduce_scatter=True): every rank receives the mean of its own shard."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        mean = ring_reduce_scatter_pieces(self.comm, self.layout.pieces(flat))
        mean.div_(self.comm.world_size)
        start = self.layout.start(self.comm.rank)
        for i, piece in self.pieces:
            a = self.offsets[i] + self._mine(i)[0] - start
            piece.grad = (None if self.params[i].grad is None
                          else mean[a: a + piece.numel()].clone())

    def _attach_grads(self) -> None:
        """Step 1 (gradients averaged already): each piece's gradient is a view of its part."""
        for i, piece in self.pieces:
            g = self.params[i].grad
            lo, hi = self._mine(i)
            piece.grad = None if g is None else g.detach().reshape(-1)[lo:hi]

    @torch.no_grad()
    def step(self, closure=None):
        """Steps 1-3: average (optionally), update this rank's shard, all-gather."""
        if closure is not None:
            raise ValueError("closure is not supported: compute the loss and backward first")
        self._average() if self.reduce_scatter else self._attach_grads()
        for full, local in zip(self.param_groups, self.optim.param_groups):  # Step 2
            local.update({k: v for k, v in full.items() if k != "params"})
        self.optim.step()
        for _, piece in self.pieces:
            piece.grad = None  # the views must not outlive this step
        # Step 3: every rank's updated shard to every rank (a ring all-gather).
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        ring_all_gather_pieces(self.comm, self.layout.pieces(flat))
        self._scatter(flat)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the whole parameters' gradients, as torch's optimizers do."""
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.detach_().zero_()

    # ------------------------------------------------------------ state
    @property
    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its shard's moments, momenta, ...)."""
        return held_bytes(t for s in self.optim.state.values() for t in s.values()
                          if isinstance(t, torch.Tensor))

    @torch.no_grad()
    def state_dict(self) -> dict:
        """The whole optimizer's state in torch's format (a collective: call on every rank).

        Per-element state (Adam's `exp_avg`, SGD's `momentum_buffer`) is all-gathered;
        other state (`step`) comes from the rank that owns the parameter's first element.
        """
        # Step 1: agree on the state's names (a rank that never stepped has none).
        elem, scalar = self._state_names()
        index = {id(p): k for k, p in enumerate(q for g in self.param_groups for q in g["params"])}
        n = len(self.params)
        # Step 2: per parameter, "has state" and its scalars, from its first element's owner.
        small = self.params[0].new_zeros(n, 1 + len(scalar), dtype=torch.float64)
        for i, piece in self.pieces:
            st = self.optim.state.get(piece)
            if st and self._mine(i)[0] == 0:
                small[i, 0] = 1
                for j, key in enumerate(scalar):
                    small[i, 1 + j] = float(st[key])
        self.comm.all_reduce(small)
        # Step 3: each per-element state all-gathered as one flat buffer.
        flats = {}
        for key in elem:
            flat = self.params[0].new_zeros(self.layout.numel)
            for i, piece in self.pieces:
                st = self.optim.state.get(piece)
                if st:
                    a = self.offsets[i] + self._mine(i)[0]
                    flat[a: a + piece.numel()] = st[key].reshape(-1)
            ring_all_gather_pieces(self.comm, self.layout.pieces(flat))
            flats[key] = flat
        state = {}
        for i, p in enumerate(self.params):
            if small[i, 0]:
                a = self.offsets[i]
                st = {key: flats[key][a: a + p.numel()].view_as(p).clone() for key in elem}
                st.update({key: torch.tensor(small[i, 1 + j].item(), dtype=torch.float32)
                           for j, key in enumerate(scalar)})
                state[index[id(p)]] = st
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def _state_names(self) -> tuple[list[str], list[str]]:
        """(per-element, scalar) state names, the same on every rank (an allreduce of max)."""
        elem, scalar = [], []
        for _, piece in self.pieces:
            st = self.optim.state.get(piece)
            if st:
                elem = sorted(k for k, v in st.items()
                              if isinstance(v, torch.Tensor) and v.shape == piece.shape)
                scalar = sorted(k for k in st if k not in elem)
                break
        code = torch.zeros(512, dtype=torch.int32)
        text = (",".join(elem) + "|" + ",".join(scalar)).encode()
        if len(text) > code.numel():
            raise ValueError("optimizer state names are too long to consolidate")
        code[: len(text)] = torch.tensor(list(text), dtype=torch.int32)
        self.comm.all_reduce(code, op="max")
        e, s = bytes(code[code > 0].tolist()).decode().split("|")
        return [k for k in e.split(",") if k], [k for k in s.split(",") if k]

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a whole optimizer's state (from `state_dict()` or an unsharded optimizer)."""
        groups, state = state_dict["param_groups"], state_dict["state"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} parameter groups; this optimizer "
                             f"has {len(self.param_groups)}")
        for full, g in zip(self.param_groups, groups):
            full.update({k: v for k, v in g.items() if k != "params"})
        index = {id(p): k for k, p in enumerate(q for g in self.param_groups for q in g["params"])}
        for i, piece in self.pieces:
            st = state.get(index[id(self.params[i])], state.get(str(index[id(self.params[i])])))
            if st is None:
                continue
            lo, hi = self._mine(i)
            self.optim.state[piece] = {
                k: (v.reshape(-1)[lo:hi].clone() if isinstance(v, torch.Tensor)
                    and v.shape == self.params[i].shape else
                    (v.clone() if isinstance(v, torch.Tensor) else v)) for k, v in st.items()}

    def __repr__(self) -> str:
        return (f"ShardedOptimizer({type(self.optim).__name__}, rank={self.comm.rank}, "
                f"world_size={self.comm.world_size}, pieces={len(self.pieces)})")
