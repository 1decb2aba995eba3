"""Checkers for notebooks/02_allreduce_algorithms' exercises (simulated ranks: instant, exact)."""

from __future__ import annotations

import itertools
import math

import torch

from syncedu.comm import sim
from syncedu.comm.errors import DeadlockError
from syncedu.comm.ledger import ring_allreduce_elements, ring_chunks
from syncedu.comm.network import Network
from syncedu.ui.checkers import answered, checker, not_attempted, verdict

_P2P = {"send", "recv"}


@checker
def ring_time(my_ring_time) -> bool:
    """Exercise 02.1: `my_ring_time(n, nbytes, alpha, beta)`: the ring's alpha-beta time."""
    name = "Exercise 1 (the ring's formula)"
    for n, s, a, b in [(2, 1e6, 1e-5, 1e-9), (8, 4096, 5e-5, 8e-10), (1000, 1e8, 2e-6, 2e-11)]:
        got = answered(name, lambda n=n, s=s, a=a, b=b: my_ring_time(n, s, a, b))
        want = 2 * (n - 1) * (a + s / n * b)  # Patarasuk & Yuan 2009: 2(N-1) steps of S/N
        if got is None or not math.isclose(got, want, rel_tol=1e-9):
            return verdict(name, False, f"N={n}, S={s:g}: got {got!r}, expected {want:.6g}")
    return verdict(name, True)


@checker
def crossover(answer, world_size: int = 64, network: str = "ethernet_10g") -> bool:
    """Exercise 02.2: the smallest power-of-two size at which the ring beats the tree."""
    name = "Exercise 2 (where the ring overtakes the tree)"
    got = answered(name, answer if callable(answer) else (lambda: answer))
    # graded by the closed form, not by the function the learner calls: the ring's
    # 2(N-1)(a + S/N b) equals the tree's 2k(a + S b), k = ceil(log2 N), at
    # S* = (2(N-1) - 2k) a / ((2k - 2(N-1)/N) b); the answer is the first power of two above
    net, n, k = Network.preset(network), world_size, math.ceil(math.log2(world_size))
    star = (2 * (n - 1) - 2 * k) * net.latency * net.bandwidth / (2 * k - 2 * (n - 1) / n)
    want = 1 << (math.floor(math.log2(star)) + 1)
    hint = ("that is S* itself, where the two are equal; the answer is a power of two" if
            isinstance(got, (int, float)) and abs(got - star) < 1 else "compare the ring's "
            "2(N-1)(alpha + S/N beta) with the tree's 2 ceil(log2 N)(alpha + S beta)")
    return verdict(name, got == want, f"S* = {star:,.0f} B" if got == want else
                    f"{got!r} is not it: {hint}")


@checker
def rotated_naive(my_allreduce, world_sizes=(2, 3, 6)) -> bool:
    """Exercise 02.3: a naive allreduce whose root is the LAST rank, from send/recv."""
    name = "Exercise 3 (naive allreduce, root = last rank)"

    def worker(comm):
        x = torch.full((5,), float(comm.rank + 1))
        my_allreduce(comm, x)
        return x.tolist()

    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(worker, n))
        want = [n * (n + 1) / 2] * 5
        if any(got != want for got in res):
            bad = next(r for r, got in enumerate(res) if got != want)
            return verdict(name, False, f"with {n} ranks rank {bad} got {res[bad]}, "
                            f"expected {want}")
        if set(res.ledger.ops) - _P2P:
            return verdict(name, False, "write it with comm.send/recv (or isend/irecv), "
                            f"not a ready-made collective (saw {sorted(set(res.ledger.ops))})")
        if strays := sorted({(s, d) for s, d in res.trace.pairs() if n - 1 not in (s, d)}):
            return verdict(name, False, f"with {n} ranks messages went {strays[:3]} (source, "
                            f"destination): every message of a naive allreduce goes to or "
                            f"from the root, rank {n - 1}")
        sent = res.ledger.sent
        if sent[n - 1] != (n - 1) * 20 or any(sent[r] != 20 for r in range(n - 1)):
            return verdict(name, False, f"with {n} ranks the bytes sent per rank were {sent}: "
                            "the last rank should send the sum to each other rank, the others "
                            "one tensor each (5 float32 = 20 bytes)")
    return verdict(name, True)


# ------------------------------------------------- build it: the two-phase ring
def _ring_input(rank: int, numel: int) -> torch.Tensor:
    """Rank r's input: 2^r + 100 i at element i. A sum then tells whose inputs it holds
    (its value mod 100, as a bitmask of ranks) and from which element (the rest)."""
    return 2.0 ** rank + 100.0 * torch.arange(numel, dtype=torch.float32)


def _explain(value: float, i: int, rank: int, n: int) -> str:
    """What element i of `rank` holding `value` says about the learner's ring."""
    mask = int(value) % 100
    ranks = [r for r in range(n) if mask >> r & 1]
    source = (value - mask) / (100 * len(ranks)) if ranks else 0.5
    if value != int(value) or mask >= 1 << n or source != int(source):
        return "a value no sum of the inputs gives (a chunk added twice, or buffers mixed up?)"
    where = "" if int(source) == i else f", taken from element {int(source)} (chunk offsets?)"
    if ranks == list(range(n)):
        return f"the full sum{where}"
    if ranks == [rank]:
        return f"only this rank's own input{where}: nothing was received into it"
    return (f"the inputs of ranks {ranks} only{where}: a phase stopped early, or a received "
            "chunk was not added")


def _first_wrong(res, n: int, numel: int) -> str:
    """Which rank's which chunk first differs from the full sum, and what it holds ('' if none)."""
    want = sum(_ring_input(r, numel) for r in range(n)).tolist()
    starts = [0, *itertools.accumulate(ring_chunks(numel, n))]
    for rank, got in enumerate(res):
        for k, (lo, hi) in enumerate(zip(starts, starts[1:])):
            if got[lo:hi] != want[lo:hi]:
                bad = next(i for i in range(lo, hi) if got[i] != want[i])
                return (f"rank {rank}'s chunk {k} (elements {lo}..{hi - 1}) is {got[lo:hi]}, "
                        f"expected {want[lo:hi]}; element {bad} holds "
                        f"{_explain(got[bad], bad, rank, n)}")
    return ""


def _ring_pattern(trace, n: int) -> str:
    """What is wrong with the trace's pattern for a ring of n ranks ('' if nothing): a
    direct exchange has the ring's message count and bytes; only the trace tells it apart."""
    if len(trace) == 0:
        return "no message was sent: the answer must come from the other ranks' data"
    step = {(d - s) % n for s, d in zip(trace.src.tolist(), trace.dst.tolist())}
    if not trace.neighbours_only(n):
        far = sorted({(s, d) for s, d in trace.pairs() if (d - s) % n not in (1, n - 1)})
        return (f"messages went {far[:3]} (source, destination), past the neighbours: a "
                "direct exchange, not a ring (send only to (rank + 1) % N)")
    if step != {1}:  # both ways (a direct exchange), or a ring the other way round
        return ("messages went " + ("both ways round the ring (a rank that sends to both of its "
                "neighbours is a direct exchange, not a ring)" if len(step) > 1 else "left, to "
                "(rank - 1) % N") + ": send right, to (rank + 1) % N, and receive from the left")
    return ""


@checker
def ring_from_send_recv(my_ring_allreduce, cases=((3, 7), (5, 13), (5, 7), (4, 9))) -> bool:
    """Exercise 02.4: the two-phase ring allreduce, written from send/recv (isend/irecv).

    On the simulator's default network every send waits for its receive (Gloo's rendezvous,
    at any size), so a send-first ring deadlocks, and a sent chunk changed before its
    send's wait() (or a send never waited on) fails. Checks every chunk, then the trace (one
    way round the ring) and the counted traffic (2(N-1) messages, 2(N-1)/N * S bytes).
    """
    name = "Exercise 4 (the two-phase ring from send/recv)"

    def worker(comm, numel):
        x = _ring_input(comm.rank, numel)
        my_ring_allreduce(comm, x)
        return x.tolist()

    for n, numel in cases:
        hint = ("; note that x.chunk(N) can give fewer than N chunks: torch.tensor_split(x, N) "
                "always gives N" if len(torch.empty(numel).chunk(n)) < n else "")
        try:
            res = sim.run(worker, n, args=(numel,))  # Gloo's rule: every send waits
        except DeadlockError as e:
            waits = [x.strip() for x in str(e).splitlines()[1:]]
            if waits and all(": send to" in x for x in waits):
                return verdict(name, False, f"with {n} ranks: deadlock ({waits[0]}; ...): "
                                "every rank sends before it receives, which hangs once a send "
                                "waits for its receiver, at every size on Gloo; post comm.isend "
                                "first, then recv, then wait, or alternate the order on even "
                                "and odd ranks")
            return verdict(name, False, f"with {n} ranks and {numel} elements: deadlock: "
                            f"{'; '.join(waits[:n])}{hint}")
        except Exception as e:  # a rank raised: the first line says who
            if "NotImplementedError" in f"{type(e).__name__}: {e}":
                not_attempted(name)
            lines = str(e).split("\n--- traceback")[0].splitlines()
            return verdict(name, False, f"with {n} ranks and {numel} elements: "
                            f"{'; '.join(x.strip() for x in lines[:n + 1])}{hint}")
        if wrong := _first_wrong(res, n, numel):
            return verdict(name, False, f"with {n} ranks and {numel} elements, {wrong}{hint}")
        if used := set(res.ledger.ops) - _P2P:
            return verdict(name, False, "write it from comm.send/recv or isend/irecv, not a "
                            f"ready-made collective (saw {sorted(used)})")
        msgs = res.ledger.counted.msgs_sent
        if len(res.trace) and msgs != [2 * (n - 1)] * n:
            return verdict(name, False, f"with {n} ranks each rank sent {msgs} messages; a "
                            f"ring takes 2(N-1) = {2 * (n - 1)} steps of one chunk each")
        if pattern := _ring_pattern(res.trace, n):
            return verdict(name, False, f"with {n} ranks: {pattern}")
        want_bytes = sum(ring_allreduce_elements(numel, n, r)[0] * 4 for r in range(n))
        if sum(res.ledger.counted.sent) != want_bytes:
            return verdict(name, False, f"with {n} ranks the ranks sent "
                            f"{sum(res.ledger.counted.sent)} bytes in all; a ring sends "
                            f"{want_bytes}: N-1 chunks per rank in each phase, never the "
                            "whole tensor")
    return verdict(name, True)
