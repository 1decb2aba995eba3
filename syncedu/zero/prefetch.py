"""`FullyShard`'s prefetch (steps 2-3 of fully_shard.py's docstring, with `prefetch=True`): the
next unit's all-gather started one unit ahead, reduce-scatters left running until the backward
ends, as FSDP2 (`torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:566-573, 795-830`,
torch 2.13: the post-forward order, and one unit back in backward)."""

from __future__ import annotations

import torch


class Prefetching:
    """The part of `FullyShard` that starts gathers early and ends reduce-scatters late; it
    keeps `order`, `_passed`, `_gathering` and `_reducing` (set in `FullyShard.__init__`)."""

    def _fulls(self, u) -> list[torch.Tensor]:
        """Step 2: `u`'s full parameters, from its prefetched all-gather or one started now."""
        return (self._gathering.pop(u, None) or self._start(u))()

    def _start(self, u):
        """Start `u`'s all-gather (`RowUnit.unshard`), its full weights counted from now."""
        itemsize = (self.compute_dtype or u.shards[0].dtype).itemsize
        u.held += self._held(sum(s.numel() for s in u.shapes) * itemsize)
        return u.unshard(self.shard_comm, self.compute_dtype)

    def _ahead(self, step: str, u) -> None:
        """Prefetch (FSDP2's one unit ahead): start the all-gather of the unit after `u` in
        `step`'s order, unless this pass gathered it already; the first forward records the
        forward's order."""
        order, passed = self.order[step], self._passed[step]
        if step == "forward" and u not in order:
            order.append(u)
        passed.add(u)
        if self.prefetch and u in order[:-1] and (v := order[order.index(u) + 1]) not in passed:
            passed.add(v)
            self._gathering[v] = self._start(v)

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

