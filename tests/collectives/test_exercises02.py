"""Lesson 02's checkers reject the wrong answers a learner would plausibly write.

Each wrong answer below is one a learner could write (the list in issue 22,
"Exercise checkers accept wrong answers"); the checker must reject it with a
message that names the mistake. The checkers run every answer at several world
sizes (3, 4 and 5 ranks for the ring; 2, 3 and 6 for the naive one).
"""

from __future__ import annotations

import torch

from syncedu import collectives
from syncedu.collectives import exercises02 as ex2


def _ring_right(comm, x, right_first=True):
    """A correct two-phase ring: isend right, recv from the left, then wait."""
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(x, n))
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % n])
        work = comm.isend(chunks[(r - s) % n], right)
        comm.recv(inbox, left)
        work.wait()
        chunks[(r - s - 1) % n] += inbox
    for s in range(n - 1):
        work = comm.isend(chunks[(r - s + 1) % n], right)
        comm.recv(chunks[(r - s) % n], left)
        work.wait()


def _ring_even_odd(comm, x):
    """Correct and blocking: even ranks send first, odd ranks receive first."""
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(x, n))
    right, left = (r + 1) % n, (r - 1) % n

    def step(out, into):
        if r % 2 == 0:
            comm.send(out.clone(), right)
            comm.recv(into, left)
        else:
            buf = torch.empty_like(into)
            comm.recv(buf, left)
            comm.send(out.clone(), right)
            into.copy_(buf)

    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % n])
        step(chunks[(r - s) % n], inbox)
        chunks[(r - s - 1) % n] += inbox
    for s in range(n - 1):
        step(chunks[(r - s + 1) % n], chunks[(r - s) % n])


def _ring_send_first(comm, x):
    """Wrong: a blocking ring in which every rank sends before it receives."""
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(x, n))
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % n])
        comm.send(chunks[(r - s) % n], (r + 1) % n)
        comm.recv(inbox, (r - 1) % n)
        chunks[(r - s - 1) % n] += inbox
    for s in range(n - 1):
        comm.send(chunks[(r - s + 1) % n], (r + 1) % n)
        comm.recv(chunks[(r - s) % n], (r - 1) % n)


def _direct_exchange(comm, x):
    """Wrong: every rank sends chunk k straight to rank k, then the sums straight back.

    Same message count (2(N-1) per rank) and bytes as the ring: only the trace
    tells it apart.
    """
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(x, n))
    for phase in range(2):
        works, inboxes = [], {}
        for p in range(n):
            if p != r:
                works.append(comm.isend(chunks[p] if phase == 0 else chunks[r].clone(), p))
        for p in range(n):
            if p != r:
                inboxes[p] = comm.recv(torch.empty_like(chunks[r] if phase == 0
                                                        else chunks[p]), p)
        for w in works:
            w.wait()
        for p, got in inboxes.items():
            if phase == 0:
                chunks[r] += got
            else:
                chunks[p].copy_(got)


def _closed_form(comm, x):
    """Wrong: the sum written down from the known inputs, nothing sent."""
    n = comm.world_size
    x.copy_(sum(ex2._ring_input(r, x.numel()) for r in range(n)))


def _closed_form_with_call(comm, x):
    """Wrong: a collective called (and ignored), the answer in closed form."""
    comm.all_reduce(torch.zeros(1))
    _closed_form(comm, x)


def _hard_coded_four(comm, x):
    """Wrong: a ring written for 4 ranks."""
    n, r = 4, comm.rank
    chunks = list(torch.tensor_split(x, n))
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % n])
        work = comm.isend(chunks[(r - s) % n], (r + 1) % comm.world_size)
        comm.recv(inbox, (r - 1) % comm.world_size)
        work.wait()
        chunks[(r - s - 1) % n] += inbox


def _whole_tensor_ring(comm, x):
    """Wrong: passes the whole tensor round the ring N-1 times (right sum, N times the bytes)."""
    n, r = comm.world_size, comm.rank
    acc, travelling = x.clone(), x.clone()
    for _ in range(n - 1):
        inbox = torch.empty_like(x)
        work = comm.isend(travelling, (r + 1) % n)
        comm.recv(inbox, (r - 1) % n)
        work.wait()
        acc += inbox
        travelling = inbox
    x.copy_(acc)
    for _ in range(n - 1):  # an all-gather's worth of extra messages, to match the count
        work = comm.isend(torch.zeros(1), (r + 1) % n)
        comm.recv(torch.empty(1), (r - 1) % n)
        work.wait()


def _reduce_scatter_only(comm, x):
    """Wrong: the reduce-scatter phase alone, no all-gather."""
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(x, n))
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % n])
        work = comm.isend(chunks[(r - s) % n], (r + 1) % n)
        comm.recv(inbox, (r - 1) % n)
        work.wait()
        chunks[(r - s - 1) % n] += inbox


def _ring_with_chunk(comm, x):
    """Wrong: x.chunk(n), which gives fewer than n chunks for some lengths."""
    n, r = comm.world_size, comm.rank
    chunks = list(x.chunk(n))
    k = len(chunks)
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % k])
        work = comm.isend(chunks[(r - s) % k], (r + 1) % n)
        comm.recv(inbox, (r - 1) % n)
        work.wait()
        chunks[(r - s - 1) % k] += inbox
    for s in range(n - 1):
        work = comm.isend(chunks[(r - s + 1) % k], (r + 1) % n)
        comm.recv(chunks[(r - s) % k], (r - 1) % n)
        work.wait()


def _naive(comm, x, root=0):
    """A naive allreduce through `root` (right values; not a ring)."""
    n = comm.world_size
    if comm.rank != root:
        comm.send(x, root)
        comm.recv(x, root)
        return
    for src in range(n):
        if src != root:
            x += comm.recv(torch.empty_like(x), src)
    for dst in range(n):
        if dst != root:
            comm.send(x, dst)


def _nobody_sends(comm, x):
    comm.recv(x, (comm.rank - 1) % comm.world_size)


def _stub(*args):
    raise NotImplementedError


def _ring_left(comm, x):
    """Wrong (review C3): a correct ring the other way round (to rank - 1)."""
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(x, n))
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r + s + 1) % n])
        work = comm.isend(chunks[(r + s) % n], (r - 1) % n)
        comm.recv(inbox, (r + 1) % n)
        work.wait()
        chunks[(r + s + 1) % n] += inbox
    for s in range(n - 1):
        work = comm.isend(chunks[(r + s - 1) % n], (r - 1) % n)
        comm.recv(chunks[(r + s) % n], (r + 1) % n)
        work.wait()


def _ring_never_waits(comm, x):
    """Wrong (review C1): right sums, but the isends are never waited on."""
    n, r = comm.world_size, comm.rank
    chunks, got = torch.tensor_split(x, n), torch.empty(x.numel())
    for s in range(n - 1):
        comm.isend(chunks[(r - s) % n].clone(), (r + 1) % n)
        into = chunks[(r - s - 1) % n]
        into.add_(comm.recv(got[: into.numel()], (r - 1) % n))
    for s in range(n - 1):
        comm.isend(chunks[(r + 1 - s) % n].clone(), (r + 1) % n)
        comm.recv(chunks[(r - s) % n], (r - 1) % n)


def _ring_reuses_send_chunk(comm, x):
    """Wrong (review C1): one buffer both sent and received into before the send's wait()."""
    n, r = comm.world_size, comm.rank
    chunks = torch.tensor_split(x, n)
    for s in range(2 * (n - 1)):
        out, into = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        buf = out.clone()
        w = comm.isend(buf, (r + 1) % n)
        comm.recv(buf[: into.numel()] if into.numel() <= buf.numel() else into, (r - 1) % n)
        w.wait()
        into.add_(buf[: into.numel()]) if s < n - 1 else into.copy_(buf[: into.numel()])


def test_ring_checker_accepts_right_rings(capsys):
    assert ex2.ring_from_send_recv.grade(_ring_right)
    assert ex2.ring_from_send_recv.grade(_ring_even_odd)
    assert "correct" in capsys.readouterr().out


def test_ring_checker_rejects_wrong_rings(capsys):
    cases = [
        (_ring_send_first, "every rank sends before it receives"),
        (_ring_send_first, "at every size on Gloo"),  # r0002 item 9: not "(large messages)"
        (_direct_exchange, "direct exchange, not a ring"),
        (_closed_form, "no message was sent"),
        (_closed_form_with_call, "ready-made collective (saw ['all_reduce'])"),
        (_hard_coded_four, "with 3 ranks"),
        (_whole_tensor_ring, "never the whole tensor"),
        (_reduce_scatter_only, "rank 0's chunk 0 (elements 0..2) is [1.0, 101.0, 201.0], expected "
                               "[7.0, 307.0, 607.0]; element 0 holds only this rank's own"),
        (_ring_with_chunk, "tensor_split"),
        (collectives.ring_allreduce, "ready-made collective (saw ['ring_allreduce'])"),
        (_naive, "2(N-1) = 4 steps"),
        (_nobody_sends, "with 3 ranks and 7 elements: deadlock"),
        (_stub, "not attempted yet"),
        (_ring_never_waits, "never waited on"),
        (_ring_left, "messages went left, to (rank - 1) % N: send right"),
        (_ring_reuses_send_chunk, "changed the tensor it isend"),
    ]
    for answer, mistake in cases:
        assert not ex2.ring_from_send_recv.grade(answer), answer.__name__
        out = capsys.readouterr().out
        assert mistake in out, (answer.__name__, out)


def test_ring_checker_runs_two_world_sizes_for_the_direct_exchange(capsys):
    # on 3 ranks both other ranks are neighbours: the direct exchange shows as both ways round;
    # on 4 it sends past them
    assert not ex2.ring_from_send_recv.grade(_direct_exchange, cases=((4, 9),))
    assert "past the neighbours" in capsys.readouterr().out
    assert not ex2.ring_from_send_recv.grade(_direct_exchange, cases=((3, 7),))
    assert "both ways round" in capsys.readouterr().out


def test_naive_checker_rejects_closed_form_and_a_relay(capsys):
    def closed(comm, x):
        n = comm.world_size
        x.fill_(n * (n + 1) / 2)

    def relay(comm, x):  # rank 1 forwards rank 0's tensor: the right bytes, the wrong pattern
        n = comm.world_size
        root = n - 1
        if comm.rank == 0 and n > 2:
            comm.send(x, 1)
            comm.recv(x, root)
        elif comm.rank == 1 and n > 2:
            mine = x.clone()
            comm.recv(x, 0)
            comm.send(x, root)
            comm.send(mine, root)
            comm.recv(x, root)
        elif comm.rank != root:
            comm.send(x, root)
            comm.recv(x, root)
        else:
            for src in range(n - 1):
                x += comm.recv(torch.empty_like(x), 1 if (src == 0 and n > 2) else src)
            for dst in range(n - 1):
                comm.send(x, dst)

    assert not ex2.rotated_naive.grade(closed)
    assert "bytes sent per rank were [0, 0]" in capsys.readouterr().out
    assert not ex2.rotated_naive.grade(relay)
    assert "every message of a naive allreduce goes to or from the root" in \
        capsys.readouterr().out


def test_naive_checker_accepts_the_last_root_and_rejects_others(capsys):
    assert ex2.rotated_naive.grade(lambda comm, x: _naive(comm, x, root=comm.world_size - 1))
    assert "correct" in capsys.readouterr().out
    for answer, words in [(_naive, "with 3 ranks messages went [(0, 1), (1, 0)]"),
                          (lambda comm, x: comm.all_reduce(x), "not a ready-made collective"),
                          (_stub, "not attempted yet")]:
        assert not ex2.rotated_naive.grade(answer)
        assert words in capsys.readouterr().out


def test_formula_quick_checks(capsys):
    assert ex2.ring_time.grade(lambda n, s, a, b: 2 * (n - 1) * (a + s / n * b))
    assert not ex2.ring_time.grade(lambda n, s, a, b: 2 * (n - 1) * (a + s * b))  # whole tensor
    assert "N=2, S=1e+06" in capsys.readouterr().out
    assert not ex2.ring_time.grade(lambda n, s, a, b: (n - 1) * (a + s / n * b))  # one phase
    assert ex2.crossover.grade(1 << 20) and ex2.crossover.grade(lambda: 1 << 20)
    assert "S* = 710,280 B" in capsys.readouterr().out  # the closed form (review C2)
    for wrong in (1 << 14, 1 << 21, 10**6, 1 << 19):  # 2^19 < S*: the tree still wins there
        assert not ex2.crossover.grade(wrong)
        assert "is not it" in capsys.readouterr().out
    assert not ex2.crossover.grade(710_280)  # S* itself is not a power of two
    assert "S* itself" in capsys.readouterr().out


def test_crossover_is_graded_by_the_closed_form_not_by_cost(monkeypatch, capsys):
    """Review C2: a checker that calls cost.allreduce_time grades the loop, not the model; a
    broken cost module must not change the grade."""
    from syncedu.collectives import cost

    monkeypatch.setattr(cost, "allreduce_time", lambda *a, **k: 0.0)
    assert ex2.crossover.grade(1 << 20)
