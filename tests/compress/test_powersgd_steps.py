"""PowerSGD counts training steps, not bucket calls: the warm-up ends for every bucket at once.

The bug this guards against: the step was the maximum count over buckets, taken
before incrementing, so in step 0 every bucket after the first already saw step
1 (and with start_iter=1 was compressed in step 0, which torch's hook forbids:
pytorch#51427). Witness: torch's own `powerSGD_hook` on the same buckets.

torch's hook is driven directly, in this process, on DDP-like buckets of the MLP's
gradients (index, buffer, per-parameter views, `is_last`), with a one-rank group whose
`all_reduce` completes at once: no process, no thread, no Gloo, so nothing can hang (a
DDP run on Gloo hung once inside the hook in a full-suite run).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from syncedu import compress, models
from syncedu.comm.local import LocalComm


def test_every_bucket_of_a_step_gets_the_same_step():
    c, comm = compress.PowerSGD(1, start_iter=2), LocalComm()
    steps = [c._step(comm, key) for _ in range(4) for key in ("b0", "b1", "b2")]
    assert steps == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_a_bucket_first_seen_late_joins_the_current_step():
    c, comm = compress.PowerSGD(1), LocalComm()
    keys = ["d0", "d0", "d1", "d2", "d0", "d2", "d1"]  # DDP rebuilt its buckets after step 0
    assert [c._step(comm, k) for k in keys] == [0, 1, 1, 1, 2, 2, 2]


class _Bucket:
    """What both hooks read from a `dist.GradBucket`: one flat buffer and views into it."""

    def __init__(self, index: int, grads: list[torch.Tensor], count: int):
        self._index, self._last = index, index == count - 1
        self._buf = torch.cat([g.reshape(-1) for g in grads])
        self._grads = [v.view(g.shape) for v, g in
                       zip(self._buf.split([g.numel() for g in grads]), grads)]

    def buffer(self):
        return self._buf

    def gradients(self):
        return self._grads

    def index(self):
        return self._index

    def is_last(self):
        return self._last


class _OneRankGroup:
    def size(self) -> int:
        return 1


class _Done:
    """A finished collective's work: its future already holds the result ([tensor])."""

    def __init__(self, t):
        self.fut = torch.futures.Future()
        self.fut.set_result([t])

    def get_future(self):
        return self.fut


def _buckets(step: int, groups=((4, 5), (2, 3), (0, 1))) -> list[_Bucket]:
    """The MLP's gradients of one step in 3 buckets, last layer first (DDP's order)."""
    model = models.make("mlp", seed=0)
    g = torch.Generator().manual_seed(step)
    grads = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    return [_Bucket(i, [grads[j] for j in group], len(groups)) for i, group in enumerate(groups)]


def _torch_elements_per_step(monkeypatch, steps: int) -> list[int]:
    calls: list[int] = []
    def all_reduce(t, group=None, async_op=False):
        calls.append(t.numel())
        return _Done(t)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    state = psgd.PowerSGDState(_OneRankGroup(), matrix_approximation_rank=1,
                               start_powerSGD_iter=2)
    per_step = []
    for step in range(steps):
        calls.clear()
        for bucket in _buckets(step):
            psgd.powerSGD_hook(state, bucket).wait()
        per_step.append(sum(calls))
    return per_step


def _our_elements_per_step(steps: int, kind=compress.PowerSGD) -> list[int]:
    comm, calls = LocalComm(), []
    real = comm.all_reduce
    comm.all_reduce = lambda t, *a, **kw: (calls.append(t.numel()), real(t, *a, **kw))[1]
    hook_state, hook = kind(1, start_iter=2).ddp_hook(comm)
    per_step = []
    for step in range(steps):
        calls.clear()
        for bucket in _buckets(step):
            hook(hook_state, bucket).wait()
        per_step.append(sum(calls))
    return per_step


@pytest.mark.timeout(60)
def test_several_buckets_send_what_torchs_hook_sends_each_step(monkeypatch):
    theirs = _torch_elements_per_step(monkeypatch, 4)
    ours = _our_elements_per_step(4)
    print("elements per step over 3 buckets, torch:", theirs, "ours:", ours)
    # Two plain steps of all 8,970 gradients, then compressed: r(n+m) per matrix + vectors.
    assert theirs[0] == theirs[1] == sum(p.numel() for p in models.make("mlp").parameters())
    assert theirs[1] > theirs[2] == theirs[3] == 128 + 128 + 74 + 64 + 64 + 10
    assert ours == theirs


class _OldCount(compress.PowerSGD):
    """The bug: the step is the largest count over buckets, read before this one's increment."""

    def _step(self, comm, key):
        counts = self.state(comm, ("old-steps",), dict)
        step = max(counts.values(), default=0)
        counts[key] = counts.get(key, 0) + 1
        return step  # steps [0, 1, 1], then [1, 2, 2]: buckets 1-2 compress one step early


def test_the_old_off_by_one_count_disagrees_with_torchs_hook(monkeypatch):
    """The witness can fail: the old count sends less than torch's hook in step 2."""
    theirs = _torch_elements_per_step(monkeypatch, 4)
    old = _our_elements_per_step(4, _OldCount)
    print("torch:", theirs, "old count:", old)
    assert old[2] < theirs[1] and old != theirs
