"""Lesson 01's checkers accept right answers and reject the wrong ones a learner would write.

Each wrong answer below is one the reviews (issue 22) or a first attempt would produce; the
checker must reject it with a message that names the mistake.
"""

from __future__ import annotations

import torch

from syncedu.collectives import exercises01 as ex1


# ------------------------------------------------ Exercise 1: ring all-gather
def ring_posted(comm, t):
    """Right: N-1 steps, isend right and irecv left posted together."""
    n, r = comm.world_size, comm.rank
    out = [torch.empty_like(t) for _ in range(n)]
    out[r].copy_(t)
    for s in range(n - 1):
        send, recv = out[(r - s) % n], out[(r - s - 1) % n]
        works = [comm.isend(send, (r + 1) % n), comm.irecv(recv, (r - 1) % n)]
        for w in works:
            w.wait()
    return out


def ring_parity(comm, t):
    """Right: blocking calls, even ranks send first, odd ranks receive first."""
    n, r = comm.world_size, comm.rank
    out = [torch.empty_like(t) for _ in range(n)]
    out[r].copy_(t)
    for s in range(n - 1):
        send, recv = out[(r - s) % n], out[(r - s - 1) % n]
        if r % 2 == 0:
            comm.send(send, (r + 1) % n)
            comm.recv(recv, (r - 1) % n)
        else:
            comm.recv(recv, (r - 1) % n)
            comm.send(send, (r + 1) % n)
    return out


def ring_send_first(comm, t):
    """Wrong: every rank sends first with a blocking send (deadlocks above the eager limit)."""
    n, r = comm.world_size, comm.rank
    out = [torch.empty_like(t) for _ in range(n)]
    out[r].copy_(t)
    for s in range(n - 1):
        comm.send(out[(r - s) % n], (r + 1) % n)
        comm.recv(out[(r - s - 1) % n], (r - 1) % n)
    return out


def direct(comm, t):
    """Wrong: a direct exchange with every rank (right values, not a ring)."""
    out = [torch.empty_like(t) for _ in range(comm.world_size)]
    out[comm.rank].copy_(t)
    for p in range(comm.world_size):
        if p != comm.rank:
            w = comm.isend(t, p)
            comm.recv(out[p], p)
            w.wait()
    return out


def ring_off_by_one(comm, t):
    """Wrong: stores what arrives at the index it sent from."""
    n, r = comm.world_size, comm.rank
    out = [torch.empty_like(t) for _ in range(n)]
    out[r].copy_(t)
    for s in range(n - 1):
        got = torch.empty_like(t)
        works = [comm.isend(out[(r - s) % n], (r + 1) % n), comm.irecv(got, (r - 1) % n)]
        for w in works:
            w.wait()
        out[(r - s + 1) % n] = got if (r - s + 1) % n != r else out[r]
    return out


def same_buffer(comm, t):
    """Wrong: receives every step into one buffer and returns it N times."""
    n, r = comm.world_size, comm.rank
    buf, cur = torch.empty_like(t), t.clone()
    for _ in range(n - 1):
        works = [comm.isend(cur, (r + 1) % n), comm.irecv(buf, (r - 1) % n)]
        for w in works:
            w.wait()
        cur = buf.clone()
    return [buf] * n


def hard_coded_four(comm, t):
    """Wrong: a ring for exactly 4 ranks."""
    r = comm.rank
    out = [torch.empty_like(t) for _ in range(4)]
    out[r].copy_(t)
    for s in range(3):
        works = [comm.isend(out[(r - s) % 4], (r + 1) % 4),
                 comm.irecv(out[(r - s - 1) % 4], (r - 1) % 4)]
        for w in works:
            w.wait()
    return out


def ring_cumulative(comm, t):
    """Wrong: right values, one message per step, but each carries all it has so far."""
    n, r = comm.world_size, comm.rank
    out = [torch.empty_like(t) for _ in range(n)]
    out[r].copy_(t)
    for s in range(n - 1):
        send = torch.cat([out[(r - k) % n] for k in range(s + 1)])
        got = torch.empty(send.numel())
        works = [comm.isend(send, (r + 1) % n), comm.irecv(got, (r - 1) % n)]
        for w in works:
            w.wait()
        out[(r - s - 1) % n].copy_(got[-t.numel():])
    return out


def reuses_send_buffer(comm, t):
    """Wrong (review C1): sends `cur` and receives into it before the send's wait(): on Gloo
    (rendezvous) and NCCL the data may leave after the receive overwrote it."""
    n, r = comm.world_size, comm.rank
    out, cur = [t.clone()], t.clone()
    for _ in range(n - 1):
        w = comm.isend(cur, (r + 1) % n)
        comm.recv(cur, (r - 1) % n)
        w.wait()
        out.insert(0, cur.clone())
    return [out[(k - r - 1) % n] for k in range(n)]


def never_waits(comm, t):
    """Wrong (review C1): right values, but no isend is ever waited on."""
    n, r = comm.world_size, comm.rank
    out = [torch.empty_like(t) for _ in range(n)]
    out[r].copy_(t)
    for s in range(n - 1):
        comm.isend(out[(r - s) % n], (r + 1) % n)
        comm.recv(out[(r - s - 1) % n], (r - 1) % n)
    return out


def ring_left(comm, t):
    """Wrong (review C3): a ring, but the other way round from the statement (to r - 1)."""
    n, r = comm.world_size, comm.rank
    out = [torch.empty_like(t) for _ in range(n)]
    out[r].copy_(t)
    for s in range(n - 1):
        works = [comm.isend(out[(r + s) % n], (r - 1) % n),
                 comm.irecv(out[(r + s + 1) % n], (r + 1) % n)]
        for w in works:
            w.wait()
    return out


def builtin(comm, t):
    out = [torch.empty_like(t) for _ in range(comm.world_size)]
    comm.all_gather(out, t)
    return out


def stub(comm, t):
    raise NotImplementedError


def test_ring_all_gather_accepts_rings(capsys):
    assert ex1.all_gather_from_send_recv.grade(ring_posted)
    assert ex1.all_gather_from_send_recv.grade(ring_parity)
    assert "correct" in capsys.readouterr().out


def test_ring_all_gather_rejects_wrong_answers(capsys):
    cases = [(ring_send_first, "deadlock"), (direct, "sent to ranks [1, 2]"),
             (ring_off_by_one, "entry"), (same_buffer, "entry 0 holds"),
             (hard_coded_four, "must be another rank in 0..1"), (builtin, "no built-in collective"),
             (ring_cumulative, "sent messages of [80000, 160000] bytes"),
             (stub, "not attempted yet"),
             (reuses_send_buffer, "changed the tensor it isend to rank"),
             (never_waits, "never waited on"),
             (ring_left, "rank 0 sent to ranks [2]: a ring passes every tensor on through one "
                         "neighbour, rank r to r + 1")]
    for answer, words in cases:
        assert not ex1.all_gather_from_send_recv.grade(answer), answer.__name__
        out = capsys.readouterr().out
        assert words in out, (answer.__name__, out)


# ------------------------------------------------ Exercise 2: reduce-scatter + all-gather
def rs_ag(comm, x):
    n = comm.world_size
    mine = torch.empty(x.numel() // n)
    comm.reduce_scatter(mine, list(x.chunk(n)))
    comm.all_gather(list(x.chunk(n)), mine)


def gather_then_sum(comm, x):
    """Wrong: all-gathers whole tensors and sums locally, with a dummy reduce-scatter."""
    n = comm.world_size
    dummy = torch.zeros(1)
    comm.reduce_scatter(dummy, [torch.zeros(1) for _ in range(n)])
    everyone = [torch.empty_like(x) for _ in range(n)]
    comm.all_gather(everyone, x)
    x.copy_(sum(everyone))


def not_in_place(comm, x):
    """Wrong: builds the result in a new tensor and leaves x alone."""
    n = comm.world_size
    mine = torch.empty(x.numel() // n)
    comm.reduce_scatter(mine, list(x.chunk(n)))
    out = torch.empty_like(x)
    comm.all_gather(list(out.chunk(n)), mine)
    return out


def gather_only(comm, x):
    """Wrong: all-gather without the reduce: each rank ends with the others' chunks unsummed."""
    n = comm.world_size
    comm.all_gather(list(x.chunk(n)), x.chunk(n)[comm.rank].clone())


def test_allreduce_checker(capsys):
    assert ex1.allreduce_from_collectives.grade(rs_ag)
    assert "correct" in capsys.readouterr().out
    cases = [(gather_then_sum, "carried"), (not_in_place, "in place"),
             (gather_only, "expected"), (lambda comm, x: comm.all_reduce(x), "used ['all_reduce']")]
    for answer, words in cases:
        assert not ex1.allreduce_from_collectives.grade(answer)
        out = capsys.readouterr().out
        assert words in out, out


def test_quick_busbw(capsys):
    right = 2**26 / 0.1 * 2 * 7 / 8
    assert ex1.quick_busbw.grade(right) and ex1.quick_busbw.grade(lambda: right)
    for wrong, words in [(2**26 / 0.1, "algorithm bandwidth"),
                         (2**26 / 0.1 * 7 / 8, "(N-1)/N is the factor of reduce-scatter"),
                         (right / 1e9, "bytes per second, not GB/s"),
                         ("fast", "answer with a number")]:
        assert not ex1.quick_busbw.grade(wrong), wrong
        assert words in capsys.readouterr().out
