"""Checkers for notebooks/00_start_here's exercises."""

from __future__ import annotations

from syncedu.comm import launch
from syncedu.comm.ledger import ring_allreduce_elements

from . import _attempt, _verdict, checker


@checker
def sum_of_squares(worker, world_sizes=(1, 3)) -> bool:
    """Exercise 00.1: every rank must return 1^2 + 2^2 + ... + N^2."""
    name = "Exercise 1 (sum of squares)"
    for n in world_sizes:
        ok, res = _attempt(name, lambda n=n: launch.run(worker, n, output="quiet"))
        if not ok:
            return False
        want = n * (n + 1) * (2 * n + 1) // 6
        if [float(v) for v in res] != [float(want)] * n:
            return _verdict(name, False, f"with {n} ranks got {list(res)}, expected {want} on each")
        if res.ledger.ops.get("all_reduce") is None or sum(res.ledger.ops["all_reduce"].calls) != n:
            return _verdict(name, False, "use exactly one comm.all_reduce per rank")
    return _verdict(name, True)


@checker
def ring_bytes(answer, numel: int = 1000, world_size: int = 4, itemsize: int = 4) -> bool:
    """Exercise 00.2: bytes rank 0 sends in a ring all_reduce of `numel` float32."""
    name = "Exercise 2 (predict the ledger)"
    ok, value = _attempt(name, answer if callable(answer) else (lambda: answer))
    if not ok:
        return False
    want = ring_allreduce_elements(numel, world_size, 0)[0] * itemsize
    return _verdict(name, value == want, "" if value == want else
                    f"{value!r} is not it: count the chunks sent in each of the two phases")


@checker
def pass_the_token(worker, world_size: int = 3) -> bool:
    """Exercise 00.3: rank 0 starts a token 0; each rank adds its rank and passes it on."""
    name = "Exercise 3 (pass the token)"
    ok, res = _attempt(name, lambda: launch.run(worker, world_size, output="quiet"))
    if not ok:
        return False
    want = world_size * (world_size - 1) // 2
    if float(res[0]) != float(want):
        return _verdict(name, False, f"rank 0 got {res[0]!r} back, expected {want}")
    sends = res.ledger.ops.get("send")
    if sends is None or sends.msgs_sent != [1] * world_size:
        return _verdict(name, False, "each rank should send exactly one message")
    return _verdict(name, True)
