"""Checkers for notebooks/04_parameter_server's exercises."""

from __future__ import annotations

import itertools

import torch

from syncedu.ps import training as ps_train
from syncedu.ps.config import PULL_TAG, PUSH_TAG, shard_ranges
from syncedu.ui.checkers import answered, checker, not_attempted, verdict


@checker
def server_ingress(answer, cases=((3, 1), (4, 2), (5, 3), (4, 4))) -> bool:
    """Quick check: `answer(workers, servers, numel)` = push bytes server 0 receives per step.
    (4, 4): 8970 % 4 = 2, so server 0's range is longer than the smallest one."""
    name = "Quick check (server ingress)"
    n = ps_train.numel()
    for workers, servers in cases:
        value = answered(name, lambda w=workers, s=servers: answer(w, s, n))
        h = ps_train.run("sync", workers, servers=servers, steps=1, global_batch=workers * 8,
                         simulate=True, compute_seconds=0.0)
        want = h.ledger.ops["ps_push"].received[workers]
        if value != want:  # (4, 4) rejects the smallest range: numel // servers + 1 floats
            return verdict(name, False, f"workers={workers}, servers={servers}: {value!r} "
                            f"bytes, the ledger says {want} (server 0 owns the largest range, "
                            f"ceil(numel / servers); each push also carries the loss)")
    return verdict(name, True)


@checker
def ssp_rule(answer) -> bool:
    """Exercise 04.2: `answer(next_step, clocks, tau)`: may the server reply now? (The slowest
    worker sits first, then last, in `clocks`: "worker 0 is the slowest" fails.)"""
    name = "Exercise 2 (the bounded-staleness rule)"
    for next_step, low, tau in itertools.product(range(6), range(6), range(4)):
        if low > next_step:
            continue
        for clocks in ([low, next_step, next_step + 1], [next_step + 1, next_step, low]):
            value = answered(name, lambda c=next_step, k=clocks, t=tau: answer(c, list(k), t))
            want = next_step - min(clocks) <= tau
            if bool(value) != want:
                return verdict(name, False, f"next_step={next_step}, clocks={clocks}, "
                               f"tau={tau}: got {value!r}, expected {want} (the bound is "
                               f"against the slowest unfinished worker, min(clocks))")
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
        value = answered(name, lambda c=copies: answer(c[0], c[1], 0.5))
        want = shard - 0.5 * torch.stack(grads).mean(0)
        if not isinstance(value, torch.Tensor) or not torch.allclose(value, want, atol=1e-6):
            return verdict(name, False, f"with {workers} workers got {value!r}, expected "
                            f"{want}: average the gradients, then take one SGD step")
    return verdict(name, True)


# Exercise 04.1's runs: two world sizes, equal-sized (tied) shards, an SSP run with noise.
_CASES = [("sync, 2 workers + 2 servers", "sync", 2, dict(servers=2)),
          ("sync, 3 workers + 1 server", "sync", 3, dict(servers=1)),
          ("ssp tau=1, 3 workers + 2 servers, a straggler", "ssp", 3,
           dict(servers=2, staleness=1, variability=0.5, seed=3,
                network=ps_train.stragglers(3, 2, slow={2: 2.0})))]


def _pattern(h, workers: int, servers: int, steps: int, n: int) -> str:
    """Who sent what to whom, from the trace; '' if it is the push/pull pattern."""
    ranges = shard_ranges(n, servers)
    t = h.trace
    for w in range(workers):
        for s, (lo, hi) in enumerate(ranges):
            pushes = [r.nbytes for r in t
                      if r.src == w and r.dst == workers + s and r.tag == PUSH_TAG]
            if pushes != [(hi - lo + 1) * 4] * steps:
                return (f"worker {w} sent server {s} pushes of {sorted(set(pushes))} bytes "
                        f"({len(pushes)} of them); expected {steps} of {(hi - lo + 1) * 4} = "
                        f"(its range of {hi - lo} floats + the loss) x 4")
            pulls = [r for r in t if r.src == workers + s and r.dst == w and r.tag == PULL_TAG]
            if len(pulls) != steps - 1:
                return f"worker {w} got {len(pulls)} pulls from server {s}, expected {steps - 1}"
    return ""


@checker
def push_pull(answer, steps: int = 4) -> bool:
    """Exercise 04.1: `answer(comm, cfg, grad, loss, params, pull)` in place of `push_pull`,
    on simulated ranks: the library's parameters, staleness and message pattern?"""
    name = "Exercise 1 (the worker's push and pull)"
    for label, mode, workers, kw in _CASES:
        run = dict(steps=steps, global_batch=12, lr=0.3, simulate=True, timeout=30, **kw)
        want = ps_train.run(mode, workers, **run)
        try:
            got = ps_train.run(mode, workers, worker_step=answer, **run)
        except Exception as exc:  # a deadlock, a size mismatch, the learner's own error
            if isinstance(exc, NotImplementedError) or "NotImplementedError" in str(exc):
                not_attempted(name)
            return verdict(name, False, f"{label}: {_diagnose(exc)}")
        if bad := _pattern(got, workers, kw["servers"], steps, ps_train.numel()):
            return verdict(name, False, f"{label}: {bad}")
        if (diff := got.max_param_diff(want.params)) > 1e-6 or got.staleness != want.staleness:
            return verdict(name, False, f"{label}: final parameters differ from the library's by "
                           f"{diff:.2e} (staleness {max(got.staleness)} vs {max(want.staleness)}): "
                           f"each server range must go to its own server, and the pull must "
                           f"write the answers into `params`")
    return verdict(name, True)


def _diagnose(exc: Exception) -> str:
    """Name the likely mistake behind a failed run (Exercise 04.1)."""
    text = str(exc)
    lines = text.strip().splitlines()
    last = f"({type(exc).__name__}: {lines[-1].strip() if lines else ''})"
    if "posted a receive" in text and "tag 41" in text:
        return (f"a push has the wrong size {last}: each server gets its own range of the "
                f"gradient followed by the loss, one message")
    if "already returned" in text and "tag 42" in text:
        return f"a pull after the last step {last}: pull only when `pull` is True"
    if "tag 41" in text:
        return (f"a server is still waiting for a push {last}: push to every server first, "
                f"then pull")
    if "tag 42" in text:
        return f"a worker is waiting for a pull that never comes {last}"
    return f"the run failed {last}"
