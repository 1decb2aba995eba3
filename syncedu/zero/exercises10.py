"""Checkers for notebooks/10_sharded_data_parallel's exercises (simulated ranks: exact)."""

from __future__ import annotations

import math

import torch

from syncedu.comm import sim
from syncedu.comm.ledger import ring_allreduce_elements, ring_chunks
from syncedu.train import memory
from syncedu.ui.checkers import attempt, checker, verdict

LR = 0.1


def _inputs(rank: int, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same parameters on every rank; each rank's own gradients."""
    params = torch.linspace(-1.0, 1.0, numel)
    grads = torch.randn(numel, generator=torch.Generator().manual_seed(10 + rank))
    return params, grads


def _step_worker(comm, step, numel: int):
    params, grads = _inputs(comm.rank, numel)
    sizes = ring_chunks(numel, comm.world_size)  # uneven: the first ranks own one more
    step(comm, params, grads, sizes, LR)
    return params.tolist(), sum(c.sent for c in comm.ledger.ops.values()), set(comm.ledger.ops)


@checker
def zero2_step(step, world_sizes=(3, 4), numel: int = 10) -> bool:
    """Exercise 10.1: `step(comm, params, grads, sizes, lr)`, one ZeRO-2 SGD step in place.

    Rank r owns elements sum(sizes[:r]) .. sum(sizes[:r+1]) - 1 (uneven sizes).
    Afterwards every rank's `params` must be params - lr * (mean gradient), and
    the bytes sent must be those of one allreduce (a reduce-scatter plus an
    all-gather), not more.
    """
    name = "Exercise 1 (a ZeRO-2 step)"
    for n in world_sizes:
        ok, res = attempt(name, lambda n=n: sim.run(_step_worker, n, args=(step, numel),
                                                     output="quiet"))
        if not ok:
            return False
        p0 = _inputs(0, numel)[0]
        mean = sum(_inputs(r, numel)[1] for r in range(n)) / n
        want = (p0 - LR * mean).tolist()
        if any("all_reduce" in ops for _, _, ops in res):
            return verdict(name, False, f"N={n}: you called comm.all_reduce: that is data "
                            "parallelism, not ZeRO-2 - reduce-scatter, update your shard, "
                            "all-gather")
        for r, (got, _, _) in enumerate(res):
            if len(got) != numel or any(abs(a - b) > 1e-6 for a, b in zip(got, want)):
                return verdict(name, False, f"N={n}: rank {r}'s parameters are not "
                                "params - lr * mean(gradients) everywhere (did every rank "
                                "all-gather the updated shards? divide the sum by N?)")
        allreduce = sum(4 * ring_allreduce_elements(numel, n, r)[0] for r in range(n))
        sent = sum(s for _, s, _ in res)
        if sent > allreduce + 4 * 2 * n * (n - 1):  # a little padding is fine
            return verdict(name, False, f"N={n}: the ranks sent {sent} bytes in all, an "
                            f"allreduce sends {allreduce}: reduce-scatter, update your shard, "
                            "all-gather - no allreduce, no broadcast of the whole buffer")
    return verdict(name, True, f"world sizes {list(world_sizes)}, {numel} parameters "
                    "split unevenly")


@checker
def memory_per_rank(answer) -> bool:
    """Exercise 10.2: `answer(psi, n, stage)`: bytes of model state per rank (mixed Adam)."""
    name = "Exercise 2 (memory per rank)"
    cases = [(7.5e9, 64, 0), (7.5e9, 64, 1), (7.5e9, 64, 2), (7.5e9, 64, 3), (1e9, 8, 2),
             (175e9, 1024, 3)]
    for psi, n, stage in cases:
        ok, got = attempt(name, lambda psi=psi, n=n, stage=stage: answer(psi, n, stage))
        if not ok:
            return False
        want = memory.bytes_per_rank(psi, n, stage)["total"]
        if got is None or not math.isclose(got, want, rel_tol=1e-9):
            return verdict(name, False, f"psi={psi:g}, N={n}, stage {stage}: got {got!r}, "
                            f"expected {want:.4g} bytes (2 + 2 + 12 bytes per parameter; "
                            "which of them does each stage divide by N?)")
    return verdict(name, True)
