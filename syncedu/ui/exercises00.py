"""Checkers for notebooks/00_start_here's exercises.

1. `sum_of_squares`: one all_reduce, on real ranks (1 and 3);
2. `pass_the_token`: the learner's ring pass on simulated ranks (2, 3 and 5):
   each rank's value, one message per rank, and a deadlock explained;
and the quick check `ring_bytes`.
"""

from __future__ import annotations

from syncedu.comm import launch, sim
from syncedu.comm.errors import DeadlockError
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.ui.checkers import attempt, checker, verdict


@checker
def sum_of_squares(worker, world_sizes=(1, 3)) -> bool:
    """Exercise 00.1: every rank must return 1^2 + 2^2 + ... + N^2."""
    name = "Exercise 1 (sum of squares)"
    for n in world_sizes:
        ok, res = attempt(name, lambda n=n: launch.run(worker, n, output="quiet"))
        if not ok:
            return False
        want = n * (n + 1) * (2 * n + 1) // 6
        if [float(v) for v in res] != [float(want)] * n:
            return verdict(name, False, f"with {n} ranks got {list(res)}, expected {want} on each")
        if res.ledger.ops.get("all_reduce") is None or sum(res.ledger.ops["all_reduce"].calls) != n:
            return verdict(name, False, "use exactly one comm.all_reduce per rank")
    return verdict(name, True)


@checker
def ring_bytes(answer, numel: int = 1000, world_size: int = 4, itemsize: int = 4) -> bool:
    """Quick check: bytes rank 0 sends in a ring all_reduce of `numel` float32."""
    name = "Quick check (predict the ledger)"
    ok, value = attempt(name, answer if callable(answer) else (lambda: answer))
    if not ok:
        return False
    want = ring_allreduce_elements(numel, world_size, 0)[0] * itemsize
    return verdict(name, value == want, "" if value == want else
                    f"{value!r} is not it: count the chunks sent in each of the two phases")


def _token_values(n: int) -> list[int]:
    """What each rank holds last: rank r > 0 what it sent on (0 + ... + r), rank 0 the total."""
    return [n * (n - 1) // 2] + [r * (r + 1) // 2 for r in range(1, n)]


def _token_mistake(name: str, n: int, got: list, want: list) -> bool | None:
    """A verdict naming the first rank whose value is wrong, or None if all are right."""
    for r, (g, w) in enumerate(zip(got, want)):
        try:
            value = float(g)
        except (TypeError, ValueError):
            return verdict(name, False, f"with {n} ranks rank {r} returned {g!r}; return "
                            "the token's value (e.g. t.item())")
        if value == w:
            continue
        hint = ""
        if r > 0 and value == w - r:
            hint = ": it returned the token before adding its own rank"
        elif r == 0 and value == 0:
            hint = ": rank 0 must receive the token back from the last rank"
        return verdict(name, False, f"with {n} ranks rank {r} returned {value:g}, expected "
                        f"{w}{hint}")
    return None


@checker
def pass_the_token(worker, world_sizes=(2, 3, 5)) -> bool:
    """Exercise 00.2: rank 0 starts a token 0; each rank adds its rank and passes it on.

    Runs on simulated ranks (quick, and a deadlock is reported instead of hanging).
    """
    name = "Exercise 2 (pass the token)"
    for n in world_sizes:
        try:
            ok, res = attempt(name, lambda n=n: sim.run(worker, n))
        except DeadlockError as e:
            waits = "; ".join(line.strip() for line in str(e).splitlines()[1:4])
            return verdict(name, False, f"with {n} ranks every rank waits for a message "
                            f"nobody sends ({waits}): rank 0 sends first, the others "
                            "receive first")
        if not ok:
            return False
        wrong = _token_mistake(name, n, list(res), _token_values(n))
        if wrong is not None:
            return wrong
        sent = [sum(op.msgs_sent[r] for op in res.ledger.ops.values()) for r in range(n)]
        if sent != [1] * n:
            return verdict(name, False, f"with {n} ranks the ranks sent {sent} messages; "
                            "each rank sends exactly one (rank r to r + 1, the last to 0)")
    return verdict(name, True)
