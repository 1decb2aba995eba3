"""Checkers for notebooks/04_parameter_server's exercises."""

from __future__ import annotations

import itertools

import torch

from syncedu.ui.checkers import attempt, checker, verdict


@checker
def server_ingress(answer, cases=((3, 1), (4, 2), (5, 3))) -> bool:
    """Quick check: `answer(workers, servers, numel)` = push bytes server 0 receives per step."""
    from syncedu.ps import training as ps_train

    name = "Quick check (server ingress)"
    n = ps_train.numel()
    for workers, servers in cases:
        ok, value = attempt(name, lambda w=workers, s=servers: answer(w, s, n))
        if not ok:
            return False
        h = ps_train.run("sync", workers, servers=servers, steps=1, global_batch=workers * 8,
                         simulate=True, compute_seconds=0.0)
        want = h.ledger.ops["ps_push"].received[workers]
        if value != want:
            return verdict(name, False, f"workers={workers}, servers={servers}: {value!r} "
                            f"bytes, the ledger says {want} (remember the loss each push carries)")
    return verdict(name, True)


@checker
def ssp_rule(answer) -> bool:
    """Exercise 04.1: `answer(next_step, clocks, tau)`: may the server reply now?"""
    name = "Exercise 1 (the bounded-staleness rule)"
    for next_step, low, tau in itertools.product(range(6), range(6), range(4)):
        if low > next_step:
            continue
        clocks = [low, next_step, next_step + 1]
        ok, value = attempt(name, lambda c=next_step, k=clocks, t=tau: answer(c, k, t))
        if not ok:
            return False
        want = next_step - min(clocks) <= tau
        if bool(value) != want:
            return verdict(name, False, f"next_step={next_step}, clocks={clocks}, tau={tau}: "
                            f"got {value!r}, expected {want}")
    return verdict(name, True)


@checker
def sync_update(answer) -> bool:
    """Quick check: `answer(shard, grads, lr)` returns the shard after one sync step."""
    name = "Quick check (the synchronous update)"
    g = torch.Generator().manual_seed(4)
    for workers in (1, 3, 4):
        shard = torch.randn(7, generator=g)
        grads = [torch.randn(7, generator=g) for _ in range(workers)]
        copies = (shard.clone(), [x.clone() for x in grads])
        ok, value = attempt(name, lambda c=copies: answer(c[0], c[1], 0.5))
        if not ok:
            return False
        want = shard - 0.5 * torch.stack(grads).mean(0)
        if not isinstance(value, torch.Tensor) or not torch.allclose(value, want, atol=1e-6):
            return verdict(name, False, f"with {workers} workers got {value!r}, expected "
                            f"{want}: average the gradients, then take one SGD step")
    return verdict(name, True)
