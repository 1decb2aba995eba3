"""Checkers for notebooks/10_sharded_data_parallel's exercises 1 and 2 (simulated ranks: exact).

Exercise 1 (`zero2_step`) is judged, at N = 3 and 4 with 10 parameters split
unevenly, in this order:

1. are every rank's `params` params - lr * mean(gradients) (1e-6)?
2. is it data parallelism (`comm.all_reduce`), or a parameter server around a
   root (`comm.reduce`/`gather` then `comm.broadcast`/`scatter`: rank 0
   updates everything, so nothing is sharded)?
3. does any one rank send or receive more than a ring reduce-scatter plus
   all-gather of the uneven split, 2 (N-1) max(sizes) elements (a root built
   from send/recv does: rank 0 receives (N-1) Psi)?

Exercise 2 (`memory_per_rank`) asks for the three parts separately (a total
cannot tell sharded parameters from sharded gradients at stage 2: both are 2
bytes per parameter) and accepts Psi/N or ceil(Psi/N) elements per shard.

Used in: notebooks/10_sharded_data_parallel; tests/zero/test_zero.py.
"""

from __future__ import annotations

import math

import torch

from syncedu.comm import sim
from syncedu.comm.ledger import ring_chunks
from syncedu.train import memory
from syncedu.ui.checkers import attempt, checker, verdict

LR = 0.1
KINDS = ("params", "grads", "optimizer")
ROOT_OPS = ("reduce", "gather", "broadcast", "scatter")


def _inputs(rank: int, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same parameters on every rank; each rank's own gradients."""
    params = torch.linspace(-1.0, 1.0, numel)
    grads = torch.randn(numel, generator=torch.Generator().manual_seed(10 + rank))
    return params, grads


def _step_worker(comm, step, numel: int):
    params, grads = _inputs(comm.rank, numel)
    sizes = ring_chunks(numel, comm.world_size)  # uneven: the first ranks own one more
    step(comm, params, grads, sizes, LR)
    return params.tolist(), comm.ledger.sent, comm.ledger.received, set(comm.ledger.ops)


def _judge_step(n: int, numel: int, res) -> str | None:
    """Steps 1-3 of the module docstring: what is wrong at world size n (None: nothing)."""
    p0 = _inputs(0, numel)[0]
    want = (p0 - LR * sum(_inputs(r, numel)[1] for r in range(n)) / n).tolist()
    for r, (got, *_) in enumerate(res):
        if len(got) != numel or any(abs(a - b) > 1e-6 for a, b in zip(got, want)):
            return (f"N={n}: rank {r}'s parameters are not params - lr * mean(gradients) "
                    "everywhere (did every rank all-gather the updated shards? divide the "
                    "sum by N?)")
    ops = set().union(*(o for *_, o in res))
    if "all_reduce" in ops:
        return (f"N={n}: you called comm.all_reduce: that is data parallelism, not ZeRO-2 - "
                "reduce-scatter, update your shard, all-gather")
    root = sorted(ops & set(ROOT_OPS))
    if root:
        return (f"N={n}: you used comm.{' / comm.'.join(root)}: that is a parameter server - "
                "rank 0 sums, updates and holds everything, nothing is sharded; each rank "
                "must update only its own shard")
    bound = 4 * 2 * (n - 1) * max(ring_chunks(numel, n))
    for r, (_, sent, received, _) in enumerate(res):
        if max(sent, received) > bound:
            return (f"N={n}: rank {r} sent {sent} and received {received} bytes; a ring "
                    f"reduce-scatter plus all-gather moves at most {bound} per rank - is one "
                    "rank (a root) collecting everything?")
    return None


@checker
def zero2_step(step, world_sizes=(3, 4), numel: int = 10) -> bool:
    """Exercise 10.1: `step(comm, params, grads, sizes, lr)`, one ZeRO-2 SGD step in place.

    Rank r owns elements sum(sizes[:r]) .. sum(sizes[:r+1]) - 1 (uneven sizes).
    """
    name = "Exercise 1 (a ZeRO-2 step)"
    for n in world_sizes:
        ok, res = attempt(name, lambda n=n: sim.run(_step_worker, n, args=(step, numel),
                                                     output="quiet"))
        if not ok:
            return False
        wrong = _judge_step(n, numel, res)
        if wrong:
            return verdict(name, False, wrong)
    return verdict(name, True, f"world sizes {list(world_sizes)}, {numel} parameters split "
                    "unevenly; no rank sends more than a ring reduce-scatter + all-gather")


def _allowed(psi: float, n: int, stage: int, kind: str) -> tuple[float, float]:
    """The bytes of `kind` per rank with Psi/N and with ceil(Psi/N) elements per shard."""
    exact = memory.bytes_per_rank(psi, n, stage)[kind]
    if exact == psi * memory.MIXED_ADAM[kind]:  # not sharded at this stage
        return exact, exact
    return exact, math.ceil(psi / n) * memory.MIXED_ADAM[kind]


@checker
def memory_per_rank(answer) -> bool:
    """Exercise 10.2: `answer(psi, n, stage)` -> bytes per rank by part.

    The parts are {"params", "grads", "optimizer"}.
    """
    name = "Exercise 2 (memory per rank)"
    cases = [(7.5e9, 64, 0), (7.5e9, 64, 1), (7.5e9, 64, 2), (7.5e9, 64, 3), (1e9, 8, 2),
             (175e9, 1024, 3), (10, 4, 3)]
    for psi, n, stage in cases:
        ok, got = attempt(name, lambda psi=psi, n=n, stage=stage: answer(psi, n, stage))
        if not ok:
            return False
        if not isinstance(got, dict) or set(got) != set(KINDS):
            return verdict(name, False, f"return a dict with the keys {KINDS}, got {got!r}")
        for kind in KINDS:
            exact, ceil = _allowed(psi, n, stage, kind)
            if not any(math.isclose(got[kind], w, rel_tol=1e-12, abs_tol=1e-6)
                       for w in (exact, ceil)):
                hint = {"params": "parameters are sharded only at stage 3",
                        "grads": "gradients are sharded from stage 2 on",
                        "optimizer": "the optimizer state is sharded from stage 1 on"}[kind]
                return verdict(name, False, f"psi={psi:,.0f}, N={n}, stage {stage}: {kind} "
                                f"{got[kind]:,.1f} bytes, expected {exact:,.1f} (or {ceil:,.0f} "
                                f"with ceil(Psi/N) elements per shard): {hint}")
    return verdict(name, True, "Psi/N or ceil(Psi/N) elements per shard both accepted")
