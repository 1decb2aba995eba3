"""`FullyShard`'s prefetch (steps 2-3 of fully_shard.py's docstring, with `prefetch=True`): the
next unit's all-gather started one unit ahead, reduce-scatters left running until the backward
ends, as FSDP2 (`torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:566-573, 795-830`,
torch 2.13: the post-forward order, and one unit back in backward; the order the first backward
gathers the units in is that one)."""

from __future__ import annotations

import torch


class Prefetching:
    """The part of `FullyShard` that starts gathers early and ends reduce-scatters late; it
    keeps `order`, `_passed`, `_gathering` and `_reducing` (set in `FullyShard.__init__`)."""

    def _fulls(self, u, step: str) -> list[torch.Tensor]:
        """Step 2 in `step` ("forward" or "backward"): `u`'s full parameters, from its
        prefetched all-gather or one started now; then the prefetch (FSDP2's one unit ahead):
        start the all-gather of the unit after `u` in `step`'s order, unless this pass gathered
        it already. The first pass of each step records its order (the first forward's and the
        first backward's gathers: one pass of each runs without prefetching)."""
        fulls = (self._gathering.pop(u, None) or self._start(u))()
        self.order[step].setdefault(u)  # the first pass records the order (a dict keeps it)
        order, passed = list(self.order[step]), self._passed[step]
        passed.add(u)
        if self.prefetch and u in order[:-1] and (v := order[order.index(u) + 1]) not in passed:
            passed.add(v)
            self._gathering[v] = self._start(v)
        return fulls

    def _start(self, u):
        """Start `u`'s all-gather (`RowUnit.unshard`), its full weights counted from now."""
        itemsize = (self.compute_dtype or u.shards[0].dtype).itemsize
        u.held += self._held(sum(s.numel() for s in u.shapes) * itemsize)
        return u.unshard(self.shard_comm, self.compute_dtype)

    def reduced(self, u, done) -> list:
        """Step 3's end: `u`'s reduce-scatter `done` (a function: wait, then the shards'
        gradients) waited for now, or with `prefetch` left running under the next unit's
        backward: Nones now, and `_settle` (queued on autograd's engine as the backward's
        first one starts, as FSDP2's final callback) adds its gradients into the `.grad`s."""
        if not self.prefetch:
            return done()
        if not self._reducing:
            torch.autograd.Variable._execution_engine.queue_callback(self._settle)
        self._reducing.append((u, done))
        return [None] * len(u.shapes)

    @torch.no_grad()
    def _settle(self) -> None:
        """Wait for the reduce-scatters in flight, adding their gradients into the shards'
        `.grad` as autograd does; wait for and drop prefetched gathers no unit used; forget
        the pass's gathers."""
        for u, done in self._reducing:
            for s, g in zip(u.shards, done()):
                if g is not None:
                    s.grad = g if s.grad is None else s.grad.add_(g)
        for u, gathering in self._gathering.items():
            gathering()
            u.held += self._held(-u.held)
        self._reducing, self._gathering = [], {}
        self._passed = {"forward": set(), "backward": set()}

