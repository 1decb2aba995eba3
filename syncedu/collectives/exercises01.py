"""Checkers for notebooks/01_collectives' exercises (simulated ranks: instant, exact)."""

from __future__ import annotations

import torch

from syncedu.collectives import cost
from syncedu.comm import sim
from syncedu.ui.checkers import answered, checker, verdict

_P2P = {"send", "recv"}
NUMEL = 20_000  # 80,000 bytes of float32: above even Open MPI's 64 KiB eager limit


def rank_data(rank: int, numel: int = NUMEL) -> torch.Tensor:
    """Rank `rank`'s input: small integers (exact sums), seeded by the rank."""
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-50, 51, (numel,), generator=g).float()


@checker
def all_gather_from_send_recv(my_all_gather, world_sizes=(2, 3, 5)) -> bool:
    """Exercise 01.1: a ring `my_all_gather(comm, tensor)` returns [rank 0's, rank 1's, ...]."""
    name = "Exercise 1 (ring all-gather from send/recv)"

    def worker(comm):
        return [torch.as_tensor(t).clone() for t in my_all_gather(comm, rank_data(comm.rank))]

    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(worker, n))  # a deadlock: a verdict
        builtin = sorted(set(res.ledger.ops) - _P2P)
        wrong = (_gather_mistake(n, list(res)) or (builtin and "use only send/recv (or "
                 f"isend/irecv), no built-in collective (saw {builtin})") or
                 _ring_mistake(n, res.trace))
        if wrong:
            return verdict(name, False, wrong)
    return verdict(name, True)


def _gather_mistake(n: int, got: list) -> str:
    """What is wrong with the ranks' lists, or '' if every entry r holds rank r's data."""
    data = [rank_data(r) for r in range(n)]
    for r, out in enumerate(got):
        if len(out) != n:
            return f"with {n} ranks rank {r} returned {len(out)} tensors; return world_size of them"
        for k, t in enumerate(out):
            if t.shape == data[k].shape and torch.equal(t, data[k]):
                continue
            who = [j for j in range(n) if t.shape == data[j].shape and torch.equal(t, data[j])]
            held = f"rank {who[0]}'s data" if who else "data of no rank"
            return (f"with {n} ranks rank {r}'s entry {k} holds {held}; entry k must be rank "
                    f"k's tensor (check which chunk you pass on at each step)")
    return ""


def _ring_mistake(n: int, trace, block: int = NUMEL * 4) -> str:
    """'' if every rank sent N-1 messages of one `block`-byte tensor, all to one neighbour."""
    if n < 3:
        return ""  # on 2 ranks a ring and a direct exchange are the same pattern
    for r in range(n):
        mine = trace.only(src=r)
        peers = sorted(set(mine.dst.tolist()))
        if len(peers) != 1 or (peers[0] - r) % n != 1:  # the statement's direction: right
            return (f"with {n} ranks rank {r} sent to ranks {peers}: a ring passes every "
                    f"tensor on through one neighbour, rank r to r + 1")
        if len(mine) != n - 1:
            return (f"with {n} ranks rank {r} sent {len(mine)} messages; a ring all-gather "
                    f"takes N - 1 = {n - 1} steps of one tensor each")
        sizes = sorted(set(mine.nbytes.tolist()))
        if sizes != [block]:  # also catches sending everything received so far
            return (f"with {n} ranks rank {r} sent messages of {sizes} bytes; each step "
                    f"passes on one tensor of {block} bytes, the one that just arrived")
    return ""


@checker
def allreduce_from_collectives(my_allreduce, world_sizes=(2, 3, 4), numel: int = 12) -> bool:
    """Exercise 01.2: allreduce from comm.reduce_scatter + comm.all_gather (length % N == 0)."""
    name = "Exercise 2 (allreduce = reduce-scatter + all-gather)"

    def worker(comm):
        x = rank_data(comm.rank, numel)
        my_allreduce(comm, x)
        return x.tolist()

    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(worker, n))  # a deadlock: a verdict
        want = sum(rank_data(r, numel) for r in range(n)).tolist()
        bad = [r for r, got in enumerate(res) if got != want]
        used = sorted(res.ledger.ops)
        wrong = ((bad and f"with {n} ranks rank {bad[0]} got {res[bad[0]][:4]}..., expected "
                  f"{want[:4]}... (x must hold the sum, in place)") or
                 (used != ["all_gather", "reduce_scatter"] and "use comm.reduce_scatter then "
                  f"comm.all_gather (used {used})") or _collectives_mistake(n, res, numel * 4))
        if wrong:
            return verdict(name, False, wrong)
    return verdict(name, True)


def _collectives_mistake(n: int, res, nbytes: int) -> str:
    """'' if each collective was called once, on the whole tensor, reduce-scatter first."""
    counted = res.ledger.counted.ops
    for op in ("reduce_scatter", "all_gather"):
        if res.ledger.ops[op].calls != [1] * n:
            calls = res.ledger.ops[op].calls
            return f"with {n} ranks {op} was called {calls} times per rank; once each"
        want = (n - 1) * nbytes // n  # a ring of either collective: (N-1)/N of the tensor
        if op not in counted or counted[op].sent != [want] * n:
            got = counted[op].sent if op in counted else None
            return (f"with {n} ranks your {op} carried {got} bytes per rank, but one over the "
                    f"whole {nbytes}-byte tensor carries {want}: pass x's own chunks")
    ops = res.trace.op.tolist()  # in the order the messages were sent
    if ops and ops[0] != "reduce_scatter":
        return "reduce first (reduce_scatter), then share the summed chunks (all_gather)"
    return ""


@checker
def quick_busbw(answer) -> bool:
    """Quick check: busbw (bytes/s) of an all-reduce of 64 MiB on 8 ranks that took 0.1 s."""
    name = "Quick check (bus bandwidth)"
    s, t, n = 64 * 2**20, 0.1, 8  # bytes, seconds, ranks: the question's numbers
    got = answered(name, answer if callable(answer) else lambda: answer)
    want = cost.busbw("all_reduce", s, t, n)  # the wrong answers a learner would give:
    wrong = {cost.algbw(s, t): "that is the algorithm bandwidth S/t; multiply by 2(N-1)/N",
             cost.busbw("all_gather", s, t, n): "(N-1)/N is the factor of reduce-scatter and "
             "all-gather; an all-reduce is both, 2(N-1)/N",
             s / t * 2 * (n - 1) / n / 1e9: "the answer is in bytes per second, not GB/s"}
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return verdict(name, False, f"answer with a number of bytes per second, got {got!r}")
    if abs(got - want) <= 1e-6 * want:
        return verdict(name, True, f"{want / 1e9:.3f} GB/s")
    hint = next((why for value, why in wrong.items() if abs(got - value) <= 1e-6 * value),
                "busbw = S / t * 2(N-1)/N")
    return verdict(name, False, f"{got:.6g} - {hint}")
