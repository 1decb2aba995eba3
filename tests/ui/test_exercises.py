"""The exercise checkers accept right answers, reject wrong ones, and excuse stubs."""

from __future__ import annotations

import pytest
import torch

from syncedu.ui import exercises00 as ex

pytestmark = pytest.mark.real


def good_sum(comm):
    t = torch.tensor([float((comm.rank + 1) ** 2)])
    comm.all_reduce(t)
    return t.item()


def wrong_sum(comm):
    return float(comm.rank)


def stub(comm):
    raise NotImplementedError


def good_token(comm):
    t = torch.zeros(1)
    n, r = comm.world_size, comm.rank
    if r == 0:
        comm.send(t, dst=1)
        comm.recv(t, src=n - 1)
    else:
        comm.recv(t, src=r - 1)
        t += r
        comm.send(t, dst=(r + 1) % n)
    return t.item()


def test_sum_of_squares_checker(capsys):
    assert ex.sum_of_squares.grade(good_sum)
    assert not ex.sum_of_squares.grade(wrong_sum)
    assert not ex.sum_of_squares.grade(stub)
    assert "not attempted yet" in capsys.readouterr().out


def test_ring_bytes_checker():
    assert ex.ring_bytes.grade(6000)
    assert not ex.ring_bytes.grade(8000)


def test_token_checker():
    assert ex.pass_the_token.grade(good_token)
    assert not ex.pass_the_token.grade(wrong_sum)


def test_checkers_print_and_return_none(capsys):
    assert ex.ring_bytes(6000) is None
    assert "correct" in capsys.readouterr().out


# ------------------------------------------------ lessons 01 and 02 (simulated ranks)
def stub_any(*args):
    raise NotImplementedError


def _ring_by_hand(comm, x):
    """A learner's two-phase ring, textbook numbering (Patarasuk & Yuan: chunk r - s)."""
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


def _reduce_scatter_only(comm, x):
    n, r = comm.world_size, comm.rank
    chunks = list(torch.tensor_split(x, n))
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % n])
        work = comm.isend(chunks[(r - s) % n], (r + 1) % n)
        comm.recv(inbox, (r - 1) % n)
        work.wait()
        chunks[(r - s - 1) % n] += inbox


def _ring_with_chunk(comm, x):
    n, r = comm.world_size, comm.rank
    chunks = list(x.chunk(n))  # fewer than n chunks when n does not divide len(x) nicely
    for s in range(n - 1):
        inbox = torch.empty_like(chunks[(r - s - 1) % len(chunks)])
        work = comm.isend(chunks[(r - s) % len(chunks)], (r + 1) % n)
        comm.recv(inbox, (r - 1) % n)
        work.wait()
        chunks[(r - s - 1) % len(chunks)] += inbox
    for s in range(n - 1):
        work = comm.isend(chunks[(r - s + 1) % len(chunks)], (r + 1) % n)
        comm.recv(chunks[(r - s) % len(chunks)], (r - 1) % n)
        work.wait()


def _naive_by_hand(comm, x, root=0):
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


def _deadlocks(comm, x):
    comm.recv(x, (comm.rank - 1) % comm.world_size)  # everyone waits, nobody sends


def test_ring_checker_says_which_rank_and_chunk(capsys):
    from syncedu import collectives
    from syncedu.collectives import exercises02 as ex2

    assert ex2.ring_from_send_recv.grade(_ring_by_hand)
    assert "correct" in capsys.readouterr().out
    assert not ex2.ring_from_send_recv.grade(_reduce_scatter_only)
    out = capsys.readouterr().out
    assert "rank 0's chunk 0 (elements 0..2) is [1.0, 101.0, 201.0], expected [7.0, 307.0, 607.0]" \
        in out and "only this rank's own input" in out
    assert not ex2.ring_from_send_recv.grade(_ring_with_chunk)
    assert "tensor_split" in capsys.readouterr().out
    assert not ex2.ring_from_send_recv.grade(collectives.ring_allreduce)
    assert "ready-made collective (saw ['ring_allreduce'])" in capsys.readouterr().out
    assert not ex2.ring_from_send_recv.grade(_naive_by_hand)
    assert "2(N-1) = 4 steps" in capsys.readouterr().out
    assert not ex2.ring_from_send_recv.grade(_deadlocks)
    assert "with 3 ranks and 7 elements" in capsys.readouterr().out
    assert not ex2.ring_from_send_recv.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out


def test_lesson01_and_02_checkers_grade_right_and_wrong(capsys):
    from syncedu.collectives import exercises01 as ex1
    from syncedu.collectives import exercises02 as ex2

    def gather(comm, t):
        out = [torch.empty_like(t) for _ in range(comm.world_size)]
        out[comm.rank].copy_(t)
        for p in range(comm.world_size):
            if p != comm.rank:
                w = comm.isend(t, p)
                comm.recv(out[p], p)
                w.wait()
        return out

    def gather_builtin(comm, t):
        out = [torch.empty_like(t) for _ in range(comm.world_size)]
        comm.all_gather(out, t)
        return out

    def rs_ag(comm, x):
        n = comm.world_size
        mine = torch.empty(x.numel() // n)
        comm.reduce_scatter(mine, list(x.chunk(n)))
        comm.all_gather(list(x.chunk(n)), mine)

    def last_root(comm, x):
        _naive_by_hand(comm, x, root=comm.world_size - 1)

    assert not ex1.all_gather_from_send_recv.grade(gather)  # a direct exchange, not a ring
    assert not ex1.all_gather_from_send_recv.grade(gather_builtin)
    assert not ex1.all_gather_from_send_recv.grade(stub_any)
    assert ex1.allreduce_from_collectives.grade(rs_ag)
    assert not ex1.allreduce_from_collectives.grade(lambda comm, x: comm.all_reduce(x))
    assert ex1.quick_busbw.grade(2**26 / 0.1 * 2 * 7 / 8)
    assert ex1.quick_busbw.grade(lambda: 2**26 / 0.1 * 2 * 7 / 8)
    assert not ex1.quick_busbw.grade(2**26 / 0.1)  # algbw
    assert "algorithm bandwidth" in capsys.readouterr().out
    assert not ex1.quick_busbw.grade(2**26 / 0.1 * 2 * 7 / 8 / 1e9)  # GB/s
    assert "bytes per second" in capsys.readouterr().out
    assert ex2.ring_time.grade(lambda n, s, a, b: 2 * (n - 1) * (a + s / n * b))
    assert not ex2.ring_time.grade(lambda n, s, a, b: 2 * (n - 1) * (a + s * b))
    assert ex2.crossover.grade(1 << 20) and not ex2.crossover.grade(1 << 14)
    assert ex2.rotated_naive.grade(last_root)
    assert not ex2.rotated_naive.grade(_naive_by_hand)  # root 0, not the last rank
    assert not ex2.rotated_naive.grade(lambda comm, x: comm.all_reduce(x))
    assert not ex2.rotated_naive.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out


# ------------------------------------------------ lesson 06 (simulated ranks)
def _bc(t, ref):
    return t.view(1, -1, *([1] * (ref.dim() - 2)))


def _syncbn_backward(comm, dy, xhat, invstd, weight, count, *, local=False, calls=1,
                     global_w=False):
    """A learner's SyncBN backward, right by default, or with one classic mistake."""
    dims = [d for d in range(dy.dim()) if d != 1]
    c = dy.shape[1]
    sums = torch.cat([dy.sum(dims), (dy * xhat).sum(dims)])
    mine = sums.clone()
    if not local and calls == 1:
        comm.all_reduce(sums)
    elif not local:
        comm.all_reduce(sums[:c])
        comm.all_reduce(sums[c:])
    n = dy.numel() // c if local else count
    dx = _bc(weight * invstd, dy) * (dy - _bc(sums[:c], dy) / n - xhat * _bc(sums[c:], dy) / n)
    kept = sums if global_w else mine
    return dx, kept[c:], kept[:c]


def test_lesson06_syncbn_backward_checker_names_the_mistake(capsys):
    from functools import partial

    from syncedu.syncbn import exercises06 as ex6

    assert ex6.syncbn_backward.grade(_syncbn_backward)
    assert "correct" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(partial(_syncbn_backward, local=True))
    assert "this rank's samples alone: all_reduce the two sums" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(partial(_syncbn_backward, calls=2))
    assert "2 communication calls" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(partial(_syncbn_backward, global_w=True))
    assert "leave dweight and dbias LOCAL" in capsys.readouterr().out
    assert not ex6.syncbn_backward.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out


def test_lesson06_checkers(capsys):
    from syncedu.comm.ledger import ring_allreduce_elements as ring
    from syncedu.syncbn import exercises06 as ex6

    def stats(comm, x, wide=True):
        x = x.double() if wide else x
        c = x.shape[1]
        t = torch.cat([x.sum(0), (x * x).sum(0), torch.tensor([float(len(x))], dtype=x.dtype)])
        comm.all_reduce(t)
        mean = t[:c] / t[-1]
        return mean, t[c:2 * c] / t[-1] - mean * mean

    def local_stats(comm, x):  # no communication: each rank's own sums, wrong
        return x.sum(0), (x * x).sum(0)

    def good_avg(comm, model):
        for name, b in model.named_buffers():
            if "running" in name:
                comm.all_reduce(b, op="avg")

    bytes_ = 8 * sum(ring(2 * c + 1, 8, 0)[0] + ring(2 * c, 8, 0)[0] for c in (16, 32, 64))
    assert ex6.global_mean_var.grade(stats) and not ex6.global_mean_var.grade(local_stats)
    capsys.readouterr()
    assert not ex6.global_mean_var.grade(lambda comm, x: stats(comm, x, wide=False))
    assert "float32 data with mean 3000" in capsys.readouterr().out  # the cancellation
    assert ex6.step_bytes.grade(bytes_) and not ex6.step_bytes.grade(bytes_ // 2)
    assert ex6.average_running_stats.grade(good_avg)
    assert not ex6.average_running_stats.grade(lambda comm, model: None)
    assert not ex6.global_mean_var.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out


# ------------------------------------------------ lesson 00 (simulated ranks for the token)
def _token_before_adding(comm):
    t = torch.zeros(1)
    n, r = comm.world_size, comm.rank
    if r == 0:
        comm.send(t, dst=1)
        comm.recv(t, src=n - 1)
        return t.item()
    comm.recv(t, src=r - 1)
    seen = t.item()
    t += r
    comm.send(t, dst=(r + 1) % n)
    return seen


def _token_everyone_waits(comm):
    t = torch.zeros(1)
    comm.recv(t, src=(comm.rank - 1) % comm.world_size)
    comm.send(t + comm.rank, dst=(comm.rank + 1) % comm.world_size)
    return t.item()


def _token_twice(comm):
    """Right values, but rank 0 sends an extra message (one message per rank is the rule)."""
    value = good_token(comm)
    if comm.rank == 0:
        comm.send(torch.zeros(1), dst=1)
    elif comm.rank == 1:
        comm.recv(torch.zeros(1), src=0)
    return value


def test_lesson00_token_checker_names_the_mistake(capsys):
    assert ex.pass_the_token.grade(good_token)
    assert "correct" in capsys.readouterr().out
    assert not ex.pass_the_token.grade(_token_before_adding)
    assert "rank 1 returned 0, expected 1: it returned the token before adding" \
        in capsys.readouterr().out
    assert not ex.pass_the_token.grade(_token_everyone_waits)
    assert "every rank waits for a message nobody sends" in capsys.readouterr().out
    assert not ex.pass_the_token.grade(_token_twice)
    assert "each rank sends exactly one" in capsys.readouterr().out
    assert not ex.pass_the_token.grade(stub)
    assert "not attempted yet" in capsys.readouterr().out


# ------------------------------------------------ lesson 04
def test_lesson04_checkers(capsys):
    from syncedu.ps import exercises04 as ex4

    assert ex4.ssp_rule.grade(lambda c, clocks, tau: c - min(clocks) <= tau)
    assert "Exercise 2 (the bounded-staleness rule): correct" in capsys.readouterr().out
    assert not ex4.ssp_rule.grade(lambda c, clocks, tau: c - min(clocks) < tau)
    assert "next_step=0, clocks=[0, 0, 1], tau=0: got False, expected True" \
        in capsys.readouterr().out
    assert ex4.server_ingress.grade(lambda w, s, n: w * (-(-n // s) + 1) * 4)
    assert not ex4.server_ingress.grade(lambda w, s, n: w * n * 4 // s)
    assert ex4.sync_update.grade(lambda s, g, lr: s - lr * sum(g) / len(g))
    capsys.readouterr()
    assert not ex4.sync_update.grade(lambda s, g, lr: s - lr * sum(g))
    assert "Quick check (the synchronous update): not yet right" in capsys.readouterr().out
    assert not ex4.ssp_rule.grade(stub_any)
    assert "not attempted yet" in capsys.readouterr().out
