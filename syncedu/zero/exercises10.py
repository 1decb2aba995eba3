"""Checkers for notebooks/10_sharded_data_parallel's exercises (simulated ranks: exact).

Exercises 1 (`zero2_step`: one SGD step) and 3 (`zero1_step`: two steps of SGD with momentum,
kept in `state`) run the answer at N = 3 and 4 with Psi = 10 (neither divides it) and ask:

1. are every rank's parameters those of one process stepping the mean gradient (1e-6)? If
   not, are they one of `MISTAKES`' plausible wrong answers (named in the verdict)?
2. is it data parallelism (the whole mean gradient on every rank: an allreduce), or a
   parameter server (`comm.reduce`/`gather`, `broadcast`/`scatter`)?
3. does a rank send or receive (the trace) more than a ring reduce-scatter plus
   all-gather, 2 (N-1) ceil(Psi/N) elements per step?
4. exercise 3: does a rank keep momentum for more than ceil(Psi/N) elements in `state`, or
   keep it elsewhere? Counted by storage: a slice of a larger tensor keeps all of that tensor
   alive (the lesson's view-vs-storage trap), so `torch.zeros(N * numel)[lo:hi]` holds N * numel
   elements. Between the two steps the checker doubles every floating tensor in `state` (as
   reloading a changed checkpoint would): the second step must use that momentum;
5. with each rank's `params` NaN outside its own shard (a ZeRO step never reads them),
   does it end with NaN (data parallelism on a copy of the gradients)?

Exercise 2 (`memory_per_rank`) asks for the three parts separately (a total cannot tell
sharded parameters from sharded gradients at stage 2) and accepts Psi/N or ceil(Psi/N).
"""

from __future__ import annotations

import math

import torch

from syncedu.comm import sim
from syncedu.comm.ledger import ring_chunks
from syncedu.train import memory
from syncedu.ui.checkers import answered, checker, verdict

LR, MOMENTUM = 0.1, 0.9
ROOT_OPS = ("reduce", "gather", "broadcast", "scatter")


def _grads(rank: int, step: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 * step + rank))


def _tensors(x):
    """The tensors in `x`, looking inside lists, tuples and dicts."""
    if isinstance(x, torch.Tensor):
        yield x
    for v in x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else ():
        yield from _tensors(v)


def _worker(comm, answer, numel: int, steps: int, nan_outside: bool = False):
    params, state = torch.linspace(-1.0, 1.0, numel), {}
    if nan_outside:  # keep rank r's shard under either accepted split, NaN elsewhere
        sizes, r, c = ring_chunks(numel, comm.world_size), comm.rank, -(-numel // comm.world_size)
        own = torch.zeros(numel, dtype=torch.bool)
        own[sum(sizes[:r]):sum(sizes[:r + 1])] = own[r * c:(r + 1) * c] = True
        params[~own] = float("nan")
    for step in range(steps):
        # Step 4: every floating tensor in `state` doubled; only momentum read from there sees it
        [t.mul_(2) for t in _tensors(state) if t.is_floating_point()]
        grads = _grads(comm.rank, step, numel)  # the answer may use it as a buffer
        # Exercise 1 gets (sizes, lr): rank r owns sum(sizes[:r]) .. sum(sizes[:r+1]) - 1;
        # exercise 3 (state, lr, momentum).
        rest = (ring_chunks(numel, comm.world_size), LR) if steps == 1 else (state, LR, MOMENTUM)
        answer(comm, params, grads, *rest)
    kept = list(_tensors(state))  # and the storage they keep alive (of a view: its base's)
    alive = {(s := t.untyped_storage()).data_ptr(): s.nbytes() // t.element_size() for t in kept}
    return params.tolist(), (sum(t.numel() for t in kept), sum(alive.values())), grads.tolist()


MISTAKES = {"sum": "the sum, not the mean: divide the reduced piece by N",
            "reset": "the momentum restarts every step: keep the velocity in `state`",
            "ema": "v = m v + (1 - m) g is not torch's SGD momentum: use v = m v + g",
            "outside": "the second step ignored the momentum in `state` (the checker doubled "
                       "it between the steps): keep the velocity in `state`, nowhere else"}


def _reference(n: int, numel: int, steps: int, mistake: str | None = None) -> list[float]:
    params, velocity = torch.linspace(-1.0, 1.0, numel), torch.zeros(numel)
    for step in range(steps):
        mean = sum(_grads(r, step, numel) for r in range(n)) / (1 if mistake == "sum" else n)
        keep = (2 - (mistake == "outside")) * MOMENTUM if steps > 1 and mistake != "reset" else 0
        velocity = keep * velocity + (1 - MOMENTUM if mistake == "ema" else 1) * mean
        params -= LR * velocity
    return params.tolist()


def _close(got: list[float], want: list[float], tol: float = 1e-6) -> bool:
    return len(got) == len(want) and all(abs(a - b) <= tol for a, b in zip(got, want))


def _judge(n: int, numel: int, steps: int, res, nan: bool) -> str | None:
    """Steps 1-5 of the module docstring: what is wrong at world size n (None: nothing)."""
    want, ceil = _reference(n, numel, steps), -(-numel // n)
    for r, (got, *_) in enumerate(res):
        if nan and any(math.isnan(a) for a in got):
            return (f"N={n}: with rank {r}'s parameters NaN outside its own shard it ends with "
                    f"{sum(math.isnan(a) for a in got)} NaN: it updated parameters it does not own"
                    " (data parallelism on a copy of the gradients?) - update only your shard")
        if not _close(got, want):
            named = [m for k, m in MISTAKES.items() if _close(got, _reference(n, numel, steps, k))]
            return (f"N={n}: rank {r}'s parameters are not those of one process stepping the "
                    f"mean gradient: {named[0] if named else 'all-gather every shard?'}")
    ops, total = set(res.ledger.ops), sum(_grads(r, steps - 1, numel) for r in range(n))
    if "all_reduce" in ops or any(all(_close(g, (total / k).tolist(), 1e-5) for *_, g in res)
                                  for k in (1, n)):  # the sum or the mean, on every rank
        return (f"N={n}: every rank ends with the whole summed gradient (an allreduce): that is "
                "data parallelism, not ZeRO - reduce-scatter, update your shard, all-gather")
    if root := [op for op in ROOT_OPS if op in ops]:
        return (f"N={n}: you used comm.{' / comm.'.join(root)}: that is a parameter server - "
                "one rank sums, updates and holds everything; each rank must update only its "
                "own ceil(Psi/N) elements")
    bound = steps * 2 * (n - 1) * ceil * 4
    src, dst, nbytes = res.trace.src, res.trace.dst, res.trace.nbytes
    for r in range(n):
        sent, received = int(nbytes[src == r].sum()), int(nbytes[dst == r].sum())
        if max(sent, received) > bound:
            return (f"N={n}: rank {r} sent {sent} and received {received} bytes (from ranks "
                    f"{sorted(set(src[dst == r].tolist()))}); a ring reduce-scatter plus "
                    f"all-gather moves at most {bound} per rank - is one rank a root?")
    for r, (_, (held, alive), _) in enumerate(res):
        if max(held, alive) > ceil:
            view = f" (a view of {held} elements into a larger tensor keeps all its storage alive)"
            return (f"N={n}: rank {r} keeps momentum for {max(held, alive)} elements"
                    f"{view if held <= ceil else ''}; its shard is at most ceil(Psi/N) = {ceil}")
    return None


def _grade(name: str, answer, steps: int, world_sizes, numel: int, praise: str) -> bool:
    for n, nan in ((n, nan) for nan in (False, True) for n in world_sizes):
        res = answered(name, lambda n=n, nan=nan: sim.run(
            _worker, n, args=(answer, numel, steps, nan), output="quiet"))
        if wrong := _judge(n, numel, steps, res, nan):
            return verdict(name, False, wrong)
    return verdict(name, True, f"world sizes {list(world_sizes)}, Psi={numel}: {praise}")


@checker
def zero2_step(step, world_sizes=(3, 4), numel: int = 10) -> bool:
    """Exercise 10.1: `step(comm, params, grads, sizes, lr)`, one ZeRO-2 SGD step in place."""
    return _grade("Exercise 1 (a ZeRO-2 step)", step, 1, world_sizes, numel,
                  "no rank sends more than a ring reduce-scatter + all-gather")


@checker
def zero1_step(step, world_sizes=(3, 4), numel: int = 10) -> bool:
    """Exercise 10.3: `step(comm, params, grads, state, lr, momentum)`, one ZeRO-1 step."""
    return _grade("Exercise 3 (ZeRO-1 with momentum)", step, 2, world_sizes, numel,
                  "momentum for ceil(Psi/N) elements per rank, one allreduce's bytes")


@checker
def memory_per_rank(answer) -> bool:
    """Exercise 10.2: `answer(psi, n, stage)` -> {"params", "grads", "optimizer"} bytes per rank."""
    name = "Exercise 2 (memory per rank)"
    cases = [(7.5e9, 64, 0), (7.5e9, 64, 1), (7.5e9, 64, 2), (7.5e9, 64, 3), (1e9, 8, 2),
             (175e9, 1024, 3), (10, 4, 3)]
    for psi, n, stage in cases:
        got = answered(name, lambda psi=psi, n=n, stage=stage: answer(psi, n, stage))
        if not isinstance(got, dict) or set(got) != set(memory.KINDS):
            return verdict(name, False, f"return a dict with the keys {memory.KINDS}, got {got!r}")
        for kind in memory.KINDS:  # Psi/N, or ceil(Psi/N) elements per shard where it is sharded
            exact, per = memory.bytes_per_rank(psi, n, stage)[kind], memory.MIXED_ADAM[kind]
            ceil = exact if exact == psi * per else math.ceil(psi / n) * per
            if not any(math.isclose(got[kind], w, rel_tol=1e-12, abs_tol=1e-6)
                       for w in (exact, ceil)):
                hint = {"params": "parameters are sharded only at stage 3",
                        "grads": "gradients are sharded from stage 2 on",
                        "optimizer": "the optimizer state is sharded from stage 1 on"}[kind]
                if psi % n and math.isclose(got[kind], psi // n * per, abs_tol=1e-6):
                    hint = "a shard holds ceil(Psi/N) elements: round up, not down"
                return verdict(name, False, f"psi={psi:,.0f}, N={n}, stage {stage}: {kind} "
                                f"{got[kind]:,.1f} bytes, expected {exact:,.1f} (or {ceil:,.0f} "
                                f"with ceil(Psi/N) elements per shard): {hint}")
    return verdict(name, True, "Psi/N or ceil(Psi/N) elements per shard both accepted")
