"""Checkers for notebooks/00_start_here's exercises, on simulated ranks (instant, and a
deadlock is reported instead of hanging); the wrong answers each rejects are in the tests."""

from __future__ import annotations

from syncedu.comm import sim
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.comm.work import CollectiveWork
from syncedu.ui.checkers import answered, checker, verdict


class _Spy:
    """The learner's comm, recording what each all_reduce was given and gave back, and
    adding `mark` to what all_reduce gives back and to what rank 1 receives (recv or
    irecv): an answer that computes its result instead of using what arrived is found out."""

    def __init__(self, comm, mark: float = 0.0):
        self._comm, self.mark, self.inputs, self.outputs = comm, mark, [], []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def all_reduce(self, tensor, *args, **kwargs):
        self.inputs.append(tensor.detach().flatten().tolist())
        out = self._comm.all_reduce(tensor, *args, **kwargs)
        self._add_mark(tensor)
        self.outputs.append(tensor.detach().flatten().tolist())
        return out

    def irecv(self, tensor, *args, **kwargs):
        work = self._comm.irecv(tensor, *args, **kwargs)
        if self.mark and self._comm.rank == 1:
            return CollectiveWork(work, then=lambda: self._add_mark(tensor))  # mark on arrival
        return work

    def _add_mark(self, tensor):
        # copy_ casts back to the tensor's own dtype: an int64 answer is as right as a float one
        if self.mark:
            tensor.copy_(tensor + self.mark)

    def recv(self, tensor, *args, **kwargs):
        self.irecv(tensor, *args, **kwargs).wait()
        return tensor


def _spied(worker, mark: float = 0.0):
    """A worker that runs `worker` on a spying comm: (its result, inputs, outputs)."""
    def run(comm):
        spy = _Spy(comm, mark)
        return worker(spy), spy.inputs, spy.outputs
    return run


@checker
def sum_of_squares(worker, world_sizes=(1, 3)) -> bool:
    """Exercise 00.1: every rank must return 1^2 + 2^2 + ... + N^2, summed by the all_reduce."""
    name = "Exercise 1 (sum of squares)"
    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(_spied(worker), n))
        want = n * (n + 1) * (2 * n + 1) // 6
        values = [v for v, _, _ in res]
        try:
            floats = [float(v) for v in values]
        except (TypeError, ValueError):
            return verdict(name, False, f"with {n} ranks got {values}; return a number (t.item())")
        if floats != [float(want)] * n:
            return verdict(name, False, f"with {n} ranks got {values}, expected {want} on each")
        calls = [len(ins) for _, ins, _ in res]
        if calls != [1] * n:
            return verdict(name, False, f"use exactly one comm.all_reduce per rank (made {calls})")
        for r, (value, ins, outs) in enumerate(res):
            if (r + 1) ** 2 not in ins[0]:
                return verdict(name, False, f"with {n} ranks rank {r} passed {ins[0][:4]} to "
                               f"all_reduce; it must hold (r+1)^2 = {(r + 1) ** 2}: let the "
                               "collective do the sum, not a closed formula")
            if float(value) not in outs[0]:
                return verdict(name, False, f"rank {r} returned {value}, which is not what its "
                               f"all_reduce produced ({outs[0][:4]}): return the reduced value")
    # once more with the all_reduce's result marked (+1000): a closed formula misses it
    res = answered(name, lambda: sim.run(_spied(worker, 1000.0), n))
    if [float(v) for v, _, _ in res] != [float(want + 1000)] * n:
        return verdict(name, False, "your answer does not change when the all_reduce's result "
                       "does: return the reduced tensor's value, not a closed formula")
    return verdict(name, True)


@checker
def ring_bytes(answer, numel: int = 1000, world_size: int = 4, itemsize: int = 4) -> bool:
    """Quick check: bytes rank 0 sends in a ring all_reduce of `numel` float32."""
    name = "Quick check (predict the ledger)"
    value = answered(name, answer if callable(answer) else (lambda: answer))
    want = ring_allreduce_elements(numel, world_size, 0)[0] * itemsize
    return verdict(name, value == want, "" if value == want else
                    f"{value!r} is not it: count the chunks sent in each of the two phases")


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
    """Exercise 00.2: rank 0 starts a token 0; each rank adds its rank and passes it on."""
    name = "Exercise 2 (pass the token)"
    for n in world_sizes:
        res = answered(name, lambda n=n: sim.run(worker, n), deadlock=(
            f"With {n} ranks: rank 0 sends first, the others receive first, and rank 0 "
            "receives the token back from the last rank (Gloo: every send waits for its "
            "receive)"))
        # rank r > 0 returns what it sent on (0 + ... + r), rank 0 the total that came back
        want = [n * (n - 1) // 2] + [r * (r + 1) // 2 for r in range(1, n)]
        wrong = _token_mistake(name, n, list(res), want)
        if wrong is not None:
            return wrong
        sent, got = res.ledger.counted.msgs_sent, res.ledger.counted.msgs_received
        if sent != [1] * n:
            return verdict(name, False, f"with {n} ranks the ranks sent {sent} messages; "
                            "each rank sends exactly one (rank r to r + 1, the last to 0)")
        if got != [1] * n:
            return verdict(name, False, f"with {n} ranks the ranks received {got} messages; "
                            "each rank receives exactly one (rank 0 the token that comes back)")
        pairs = dict(res.trace.pairs())
        ring = {(r, (r + 1) % n): 1 for r in range(n)}
        if pairs != ring:
            return verdict(name, False, f"with {n} ranks the messages went {sorted(pairs)}; "
                            f"the token goes round the ring {sorted(ring)}")
    # once more with rank 1's receive adding 1000: every later value must carry it
    res = answered(name, lambda: sim.run(_spied(worker, 1000.0), n))
    values = [v for v, _, _ in res]
    if list(map(float, values)) != [w + 1000.0 for w in want]:
        return verdict(name, False, f"when rank 1's recv adds 1000 to the token, the ranks "
                       f"returned {values}: add your rank to the value that arrived and "
                       "pass that on, do not compute r(r+1)/2 yourself")
    return verdict(name, True)
