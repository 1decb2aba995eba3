"""Lesson 03's checkers accept a right answer and reject the wrong answers a learner writes.

Each wrong answer is one plausible mistake; the checker must reject it with a
message that names the mistake, at 2 and 3 simulated ranks (the checker runs
both, and two bucket caps), on a model with a frozen layer and a tied weight.
"""

from __future__ import annotations

import pytest
import torch

from syncedu.dp import exercises03 as ex


def _bucketed(mode="right"):
    """A learner's bucketed_sync, right or with the one mistake `mode` names."""
    def bucketed_sync(comm, params, cap):
        cap = 300 if mode == "ignore_cap" else cap
        live = params if mode == "frozen_hooked" else [p for p in params if p.requires_grad]
        buckets, cur, held = [], [], 0
        for p in reversed(live):
            if mode == "close_before" and cur and held + p.numel() * 4 > cap:
                buckets.append(cur)  # closed before the overflowing parameter: too many buckets
                cur, held = [], 0
            cur.append(p)
            held += p.numel() * 4
            if held >= cap or mode == "per_param":
                buckets.append(cur)
                cur, held = [], 0
        buckets += [cur] if cur else []
        where = {id(p): b for b, ps in enumerate(buckets) for p in ps}
        ready, works, bufs, nxt = [0] * len(buckets), {}, {}, [0]
        n = 2 if mode == "hard_n" else comm.world_size

        def launch(b):
            bufs[b] = torch.cat([p.grad.reshape(-1) for p in buckets[b]])
            if mode == "dummy":  # a token allreduce on time; the real work in finish()
                works[b] = comm.all_reduce(torch.zeros(1), async_op=True)
                return
            blocking = mode == "blocking"
            work = comm.all_reduce(bufs[b], async_op=not blocking)
            works[b] = None if blocking else work
            if mode == "wait_now":
                works[b].wait()

        def hook(p):
            b = where[id(p)]
            ready[b] += 1
            if mode == "last_hook":  # everything from the last gradient's hook
                if sum(ready) == len(live):
                    for i in range(len(buckets)):
                        launch(i)
            elif mode == "eager":  # at once, even before an earlier bucket: out of order
                if ready[b] == len(buckets[b]):
                    launch(b)
            elif mode != "late":  # in bucket order: each complete bucket after the earlier ones
                while nxt[0] < len(buckets) and ready[nxt[0]] == len(buckets[nxt[0]]):
                    launch(nxt[0])
                    nxt[0] += 1

        for p in live:
            p.register_post_accumulate_grad_hook(hook)

        def finish():
            if mode != "no_reset":  # ready for the next backward
                ready[:], nxt[0] = [0] * len(buckets), 0
            for b in range(len(buckets)):
                if mode == "late":
                    launch(b)
                if works.get(b) is not None:
                    works[b].wait()
                if mode == "no_copy":
                    continue
                if mode == "dummy":  # every rank's buffer gathered, summed here
                    parts = [torch.empty_like(bufs[b]) for _ in range(comm.world_size)]
                    comm.all_gather(parts, bufs[b])
                    bufs[b] = torch.stack(parts).sum(0)
                bufs[b] /= 1 if mode == "sum" else n
                off = 0
                for p in buckets[b]:
                    p.grad.copy_(bufs[b][off:off + p.numel()].view_as(p))
                    off += p.numel()
        return finish
    return bucketed_sync


def test_ready_points_follow_ddp_rule():
    # layer d runs before b but is defined after it: bucket 2 (b) completes before bucket 1 (d)
    # and must wait for it
    assert ex.ready_points(300) == [2, 5, 5, 7] and ex.ready_points(700) == [5, 7]


def test_right_bucketed_answer_passes(capsys):
    assert ex.bucketed_overlap.grade(_bucketed())
    assert "4 and 2 buckets" in capsys.readouterr().out


@pytest.mark.parametrize("mode, words", [
    ("late", "nothing was sent during backward"),
    ("last_hook", "launch it from the hook that completes it"),
    ("wait_now", "waited on inside backward"),
    ("blocking", "blocking all_reduce"),
    ("per_param", "one per parameter"),
    ("ignore_cap", "use the cap you are given"),
    ("sum", "divide by the world size"),
    ("hard_n", "hard-coded world size"),
    ("no_copy", "copy each averaged slice back"),
    ("frozen_hooked", "skip it only if it is frozen"),
    ("dummy", "carried 1 elements"),
    ("eager", "bucket 2 was launched before bucket 1: launch in bucket order"),  # review 03-06 #5c
    ("no_reset", "in the second backward"),
])
def test_wrong_bucketed_answers_are_named(mode, words, capsys):
    assert not ex.bucketed_overlap.grade(_bucketed(mode)), mode
    out = capsys.readouterr().out
    assert words in out, out


def test_bucket_closed_before_the_cap_is_named(capsys):
    # at cap 700 closing before the overflowing parameter gives 4 buckets, not DDP's 2 (nor 7)
    assert not ex.bucketed_overlap.grade(_bucketed("close_before"), caps=(700,))
    out = capsys.readouterr().out
    assert "4 allreduces for cap_bytes=700, expected 2" in out, out
    assert "not before the parameter that would overflow it" in out, out
    assert not ex.bucketed_overlap.grade(_bucketed("close_before"))  # 300: one per parameter


def _flat(mode="right"):
    def flat_sync(comm, params):
        live = {"frozen": params, "skip_none": [p for p in params if p.grad is not None]}.get(
            mode, [p for p in params if p.requires_grad])  # right: zeros for an unused layer
        if mode == "none_last":  # review r0306 #6: grad-less layers moved to the buffer's end
            live = [p for p in live if p.grad is not None] + [p for p in live if p.grad is None]
        for p in live:
            p.grad = torch.zeros_like(p) if p.grad is None and mode != "frozen" else p.grad
        if mode == "zero_frozen":  # review 03-06 #7: zeros written into the frozen layer
            for p in params:
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad
        if mode == "per_param":
            for p in live:
                comm.all_reduce(p.grad, op="avg")
            return
        g = torch.cat([p.grad.reshape(-1) for p in live])
        if mode == "gather":  # a token allreduce, the real work by an all_gather
            comm.all_reduce(torch.zeros(1))
            parts = [torch.empty_like(g) for _ in range(comm.world_size)]
            comm.all_gather(parts, g)
            g = torch.stack(parts).sum(0)
        else:
            comm.all_reduce(g)
        g /= 2 if mode == "hard_n" else comm.world_size
        if mode == "no_copy":
            return
        off = 0
        for p in live:
            p.grad.copy_(g[off:off + p.numel()].view_as(p))
            off += p.numel()
    return flat_sync


@pytest.mark.parametrize("mode, words", [
    ("per_param", "use exactly one"), ("hard_n", "hard-coded world size"),
    ("no_copy", "copy each averaged slice back"), ("frozen", "skip it only if it is frozen"),
    ("gather", "all_gather used besides all_reduce"),
    # review 03-06 #4: a layer only rank 1 runs has p.grad None on the other ranks
    ("skip_none", "must send zeros"),
    ("zero_frozen", "a frozen parameter got a .grad"),
    ("none_last", "flat buffers were laid out differently"),
])
def test_flat_checker(mode, words, capsys):
    assert ex.flat_sync.grade(_flat())
    capsys.readouterr()
    assert not ex.flat_sync.grade(_flat(mode)), mode
    out = capsys.readouterr().out
    assert words in out, out
