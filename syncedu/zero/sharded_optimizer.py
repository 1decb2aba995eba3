"""`ShardedOptimizer`: ZeRO stage 1 as an optimizer, over any `torch.optim` optimizer.

Rajbhandari et al., SC 2020, stage 1 (P_os). torch's `ZeroRedundancyOptimizer` hands each
rank whole parameters (greedily by size); here the trainable ones are laid end to end in
group order (tied weights once) and cut by `shards.Layout`. Rank r's shard is a list of
pieces (views of the parameters) that the local optimizer `.optim` holds, so element-wise
optimizers (SGD, Adam, AdamW) do the unsharded one's arithmetic. A step:

1. gradients: averaged already (DDP or `dp.DataParallel`), or with `reduce_scatter=True`
   by a ring reduce-scatter here (an allreduce's first half): each rank gets its shard's;
2. the hyperparameters of `param_groups` (a scheduler may change them) copied into the
   local groups, then `.optim.step()` on the shard;
3. the updated shards all-gathered (the second half), so the ranks agree again.

`clip_grad_norm_` clips by the global norm (with `reduce_scatter=True` it runs step 1 early,
so the norm is over the averaged shards, summed over ranks); `consolidate_state_dict(to)`
sends every rank's shard of the state to rank `to`, the only rank whose `state_dict()` then
answers (torch's `ZeroRedundancyOptimizer` does the same).
"""

from __future__ import annotations

import itertools

import torch

from syncedu.comm.runs import check_bool, check_int
from syncedu.comm.torch_comm import TorchComm
from syncedu.dp.buckets import flatten, unflatten_
from syncedu.train.memory import state_bytes
from syncedu.zero.shards import (
    Layout,
    broadcast_params,
    check_one_kind,
    clip_grad_norm,
    ring_all_gather_pieces,
    ring_reduce_scatter_pieces,
)

# Optimizers whose update of an element reads more than that element: run on a 1-D piece of a
# flat buffer they would silently compute something else, so they are refused by name.
NOT_ELEMENT_WISE = {"Adafactor": "factors each matrix's second moment into row and column means",
                    "Muon": "orthogonalizes each whole 2-D update (Newton-Schulz)",
                    "LBFGS": "keeps whole flat gradients and searches along one direction",
                    "SparseAdam": "updates only the rows a sparse gradient names"}


def _groups(params) -> list[dict]:
    """Parameter groups as torch takes them (tensors, or dicts), each tensor once per group
    (torch warns of a repeat, and will refuse it); a tensor in two groups torch refuses."""
    params = list(params)
    if not params:
        raise ValueError("params is empty: give the parameters (or parameter groups) to optimize")
    if not all(isinstance(g, dict) for g in params):
        if not all(isinstance(p, torch.Tensor) for p in params):
            raise ValueError("params must be tensors or parameter-group dicts, not a mixture")
        params = [{"params": params}]
    return [{**g, "params": list(dict.fromkeys([g["params"]] if isinstance(
        g["params"], torch.Tensor) else g["params"]))} for g in params]


def _options(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 over `optimizer_cls` (a class, e.g. `torch.optim.AdamW`; `**kwargs` its defaults).
    An Optimizer itself (schedulers take it) whose `param_groups` hold whole parameters.
    Optimizers in `NOT_ELEMENT_WISE` (and their subclasses) are refused by name: they need
    whole tensors, as torch's `ZeroRedundancyOptimizer` gives each rank.

    Args:
        params: parameters or parameter groups, as any torch optimizer takes them.
        optimizer_cls: an element-wise `torch.optim.Optimizer` class (SGD, Adam, AdamW), not
            an instance; it steps only this rank's shard, so its state is 1/N per rank.
        comm: this rank's `Comm` (default None: the default process group's `TorchComm`).
        reduce_scatter: average the gradients here, by a ring reduce-scatter (default False:
            they arrive averaged, from DDP or `dp.DataParallel`).
        **kwargs: `optimizer_cls`'s hyperparameters (lr, betas, weight_decay, ...).
    """

    def __init__(self, params, optimizer_cls, comm=None, *, reduce_scatter: bool = False, **kwargs):
        if not (isinstance(optimizer_cls, type)
                and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_cls={optimizer_cls!r} must be a torch.optim.Optimizer "
                             f"subclass, e.g. torch.optim.AdamW (the class, not an instance)")
        for name in (c.__name__ for c in optimizer_cls.__mro__ if c.__name__ in NOT_ELEMENT_WISE):
            raise ValueError(f"optimizer_cls={optimizer_cls.__name__} is not element-wise ({name} "
                             f"{NOT_ELEMENT_WISE[name]}): a flat shard needs SGD, Adam, AdamW...")
        self.reduce_scatter = check_bool("reduce_scatter", reduce_scatter)
        self.comm = TorchComm() if comm is None else comm
        super().__init__(_groups(params), {})  # Step 0: torch's rules for the groups
        self.params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not self.params:
            raise ValueError("params has no tensor with requires_grad=True to optimize")
        if not all(p.is_contiguous() for p in check_one_kind("params", self.params)):
            raise ValueError("params must be contiguous tensors")
        self.offsets = list(itertools.accumulate((p.numel() for p in self.params), initial=0))
        self.layout = Layout(self.offsets.pop(), self.comm.world_size)
        self.optim = self._local_optimizer(optimizer_cls, kwargs)
        for g, lg in zip(self.param_groups, self.optim.param_groups):  # the user's view: whole
            g.update(_options(lg))  # parameters, with the local groups' filled-in defaults
        self.defaults = dict(self.optim.defaults)
        self._averaged, self._consolidated = False, None  # clip_grad_norm_ ran step 1; to's
        broadcast_params(self.comm, self.params)  # start from rank 0's, as DDP does

    def add_param_group(self, param_group: dict) -> None:
        """torch's, while the constructor runs; after it, refused: the flat layout is cut (build
        a new ShardedOptimizer with every group)."""
        if hasattr(self, "optim"):
            raise NotImplementedError("add_param_group after construction: the layout is cut")
        super().add_param_group(param_group)

    def _local_optimizer(self, optimizer_cls, kwargs):
        index = {id(p): i for i, p in enumerate(self.params)}
        # (parameter index, where this rank's part starts in it, a view of that part)
        self.pieces: list[tuple[int, int, torch.Tensor]] = []
        local = []  # the groups over this rank's pieces
        for g in self.param_groups:
            first = len(self.pieces)  # this group's pieces follow
            for i in (index[id(p)] for p in g["params"] if id(p) in index):  # frozen: skipped
                a, p = self.offsets[i], self.params[i]
                lo, hi = self.layout.ranges(a, a + p.numel())[self.comm.rank]
                if hi > lo:
                    self.pieces.append((i, lo - a, p.detach().view(-1)[lo - a: hi - a]))
            local.append({**g, "params": [piece for *_, piece in self.pieces[first:]]})
        if not self.pieces:  # more ranks than elements: torch refuses an empty optimizer
            local[0]["params"] = [self.params[0].new_empty(0)]
        return optimizer_cls(local, **kwargs)

    def _unsharded(self, params: list[list]) -> torch.optim.Optimizer:
        """An `optimizer_cls` with these groups' options over `params` (a list per group)."""
        return type(self.optim)([{**_options(g), "params": ps}
                                 for g, ps in zip(self.param_groups, params)])

    # ------------------------------------------------------------ a step
    @torch.no_grad()
    def average(self) -> None:
        """Step 1 (reduce_scatter=True): every rank receives the mean of its own shard."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        mean = ring_reduce_scatter_pieces(self.comm, self.layout.pieces(flatten(grads)))
        mean.div_(self.comm.world_size)
        start = self.layout.start(self.comm.rank)
        for i, lo, piece in self.pieces:
            a = self.offsets[i] + lo - start
            piece.grad = (None if self.params[i].grad is None
                          else mean[a: a + piece.numel()].clone())

    def _attach_grads(self) -> None:
        """Step 1 (gradients averaged already): each piece's gradient is a view of its part."""
        for i, lo, piece in self.pieces:
            g = self.params[i].grad
            piece.grad = None if g is None else g.detach().reshape(-1)[lo: lo + piece.numel()]

    @torch.no_grad()
    def step(self, closure=None):
        """Steps 1-3: average (optionally), update this rank's shard, all-gather."""
        if closure is not None:
            raise ValueError("closure is not supported: compute the loss and backward first")
        if not self._averaged:
            self.average() if self.reduce_scatter else self._attach_grads()
        self._averaged, self._consolidated = False, None
        for full, local in zip(self.param_groups, self.optim.param_groups):  # Step 2
            local.update(_options(full))
        self.optim.step()
        for *_, piece in self.pieces:
            piece.grad = None  # the views must not outlive this step
        # Step 3: every rank's updated shard to every rank (a ring all-gather).
        flat = flatten(self.params)
        ring_all_gather_pieces(self.comm, self.layout.pieces(flat))
        unflatten_(self.params, flat)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip by the global norm (returned), as torch's `clip_grad_norm_` on the averaged
        gradients; call it between backward and `step()`. With `reduce_scatter=True` the
        averaged gradients exist only as each rank's shard: step 1 runs here, the shards'
        norms are summed over the ranks, and the shards' gradients are clipped."""
        if self.reduce_scatter:  # else every rank holds the whole averaged gradients
            self.average()
            self._averaged = True
        held = [pc for *_, pc in self.pieces] if self.reduce_scatter else self.params
        return clip_grad_norm(self.comm if self.reduce_scatter else None,
                              [t.grad for t in held if t.grad is not None], [], max_norm, norm_type)

    # ------------------------------------------------------------ state
    @property
    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (its shard's moments, momenta, ...)."""
        return state_bytes(self.optim)

    @torch.no_grad()
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the whole optimizer's state in torch's format on rank `to` only (a
        collective: every rank calls it); then `state_dict()` returns it there."""
        if check_int("to", to, 0) >= self.comm.world_size:
            raise ValueError(f"to={to} must be a rank in 0..{self.comm.world_size - 1}")
        elem, scalar = self._state_names()  # Step 1: the same names on every rank
        # Step 2: per parameter, "has state" and its scalars, from its first element's owner.
        small = self.params[0].new_zeros(len(self.params), 1 + len(scalar), dtype=torch.float64)
        r, sizes, start = self.comm.rank, self.layout.sizes, self.layout.start
        mine = self.params[0].new_zeros(len(elem), sizes[r])  # my shard's per-element state
        for i, lo, piece in self.pieces:
            if not (st := self.optim.state.get(piece)):
                continue
            if lo == 0:
                small[i] = small.new_tensor([1.0] + [float(st[key]) for key in scalar])
            a = self.offsets[i] + lo - start(r)
            for k, key in enumerate(elem):
                mine[k, a: a + piece.numel()] = st[key].reshape(-1)
        self.comm.all_reduce(small)
        with self.comm.scope("consolidate"):  # Step 3: every shard to rank `to`, one message
            if r != to:
                if mine.numel():
                    self.comm.send(mine, to)
                self._consolidated = None
                return
            parts = [mine if j == r else mine.new_zeros(len(elem), size)
                     for j, size in enumerate(sizes)]
            for j in (j for j, part in enumerate(parts) if j != r and part.numel()):
                self.comm.recv(parts[j], j)
            flats = torch.cat(parts, dim=1)  # the shards end to end
        whole = self._unsharded([g["params"] for g in self.param_groups])  # torch's format
        for i, (p, a) in enumerate(zip(self.params, self.offsets)):
            if small[i, 0]:  # scalars (Adam's step) as torch keeps them: fp32 tensors
                whole.state[p] = {**{k: flats[e, a: a + p.numel()].view_as(p).clone()
                                     for e, k in enumerate(elem)},
                                  **{k: small[i, 1 + j].float() for j, k in enumerate(scalar)}}
        self._consolidated = whole.state_dict()

    def state_dict(self) -> dict:
        """The whole state from the last `consolidate_state_dict(to)`, on rank `to` only."""
        if self._consolidated is None:
            raise RuntimeError(f"rank {self.comm.rank} holds no state: call consolidate_state_dict"
                               f"(to=...) on every rank after the step; only `to` answers")
        return self._consolidated

    def _state_names(self) -> tuple[list[str], list[str]]:
        """(per-element, scalar) state names, from one-element probes (the same on every rank)."""
        probes = [torch.zeros(1, requires_grad=True) for _ in self.param_groups]
        opt = self._unsharded([[p] for p in probes])
        for p in probes:
            p.grad = torch.zeros(1)
        opt.step()
        names = {k: v for st in opt.state.values() for k, v in st.items()}
        elem = sorted(k for k, v in names.items() if torch.is_tensor(v) and v.shape == (1,))
        return elem, sorted(k for k in names if k not in elem)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a whole optimizer's state (from `state_dict()` or an unsharded optimizer)."""
        whole = self._unsharded([g["params"] for g in self.param_groups])
        whole.load_state_dict(state_dict)  # torch's checks of the groups, and its casts
        for full, g in zip(self.param_groups, whole.param_groups):
            full.update(_options(g))
        for i, lo, piece in self.pieces:
            st, shape = whole.state.get(self.params[i]), self.params[i].shape
            if st:  # of a per-element state, this rank's part
                self.optim.state[piece] = {
                    k: (v.reshape(-1)[lo: lo + piece.numel()] if v.shape == shape else v).clone()
                    if torch.is_tensor(v) else v for k, v in st.items()}
