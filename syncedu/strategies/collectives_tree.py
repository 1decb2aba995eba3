"""Latency-friendly allreduces: binomial tree, and recursive halving-doubling.

Both take about log2(N) rounds instead of the ring's 2(N-1), so they win when
messages are small and latency dominates (Thakur, Rabenseifner & Gropp,
"Optimization of collective communication operations in MPICH", IJHPCA 2005).

- `tree_allreduce`: binomial-tree reduce to rank 0, then binomial-tree
  broadcast back; ceil(log2 N) rounds each, the whole tensor every time, so
  ~2 ceil(log2 N)(alpha + S beta).
- `halving_doubling_allreduce` (Rabenseifner 2004): reduce-scatter by recursive
  halving, then all-gather by recursive doubling: 2 log2(p) rounds and the
  ring's 2(p-1)/p * S bytes. For N that is not a power of two, the standard
  fold: the first 2r ranks (r = N - p, p the largest power of two <= N) pair
  up, each even one hands its tensor to the odd one next to it and sits out,
  and gets the result back at the end (two extra whole-tensor messages).

Used in: notebooks/02_allreduce_algorithms.
"""

from __future__ import annotations

import torch

from syncedu.comm.ledger import ring_chunks

from .collectives_ring import _flat


def tree_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """Binomial-tree allreduce (sum) in place; returns `tensor`.

    1. Reduce: in round k (mask = 2^k) a rank whose lowest set bit is k sends
       its partial sum to rank - mask and is done; a rank with bits 0..k clear
       receives from rank + mask (if it exists) and adds.
    2. Broadcast: the reverse; a rank receives the sum from rank - lowbit(rank),
       then sends it to rank + mask for each smaller mask, largest first.
    """
    flat = _flat(tensor)
    n, r = comm.world_size, comm.rank
    with comm.scope("tree_allreduce"):
        if n == 1:
            return tensor
        low = r & -r if r else 1 << (n - 1).bit_length()  # the root "receives" above the top
        tmp = torch.empty_like(flat) if r + 1 < n and (r % 2 == 0) else None
        mask = 1
        while mask < low and r + mask < n:  # Step 1: gather the subtree's sums
            comm.recv(tmp, r + mask)
            flat.add_(tmp)
            mask <<= 1
        if r:
            comm.send(flat, r - low)
            comm.recv(flat, r - low)  # Step 2: the total comes back down
        works = []
        mask = low >> 1
        while mask:
            if r + mask < n:
                works.append(comm.isend(flat, r + mask))
            mask >>= 1
        for w in works:
            w.wait()
    return tensor


def _fold(r: int, n: int) -> tuple[int, int]:
    """(p, new rank) after folding N ranks onto p = 2^floor(log2 N); new rank -1 sits out."""
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    if r < 2 * extra:
        return p, (r // 2 if r % 2 else -1)
    return p, r - extra


def _real(nr: int, n: int, p: int) -> int:
    """Real rank of folded rank `nr` (inverse of `_fold`)."""
    extra = n - p
    return 2 * nr + 1 if nr < extra else nr + extra


def _exchange(comm, send: torch.Tensor, recv: torch.Tensor, peer: int) -> None:
    """Send `send` to `peer` and receive `recv` from it at the same time (skip if empty)."""
    works = []
    if recv.numel():
        works.append(comm.irecv(recv, peer))
    if send.numel():
        works.append(comm.isend(send, peer))
    for w in works:
        w.wait()


def halving_doubling_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """Recursive halving-doubling (Rabenseifner) allreduce (sum) in place.

    1. Fold: if N is not a power of two, ranks 0..2r-1 pair up; the even one
       sends its whole tensor to the odd one, which adds it. p ranks remain,
       renumbered 0..p-1; the tensor is cut into p blocks (`ring_chunks`).
    2. Recursive halving (reduce-scatter): with distance d = p/2, p/4, ..., 1,
       exchange half of the current block range with new rank ^ d and add the
       half you keep. Afterwards new rank i holds block i, fully summed.
    3. Recursive doubling (all-gather): d = 1, 2, ..., p/2, swap ranges with
       new rank ^ d; each round doubles what every rank holds.
    4. Unfold: each odd rank of step 1 sends the result to its even partner.
    """
    flat = _flat(tensor)
    n, r = comm.world_size, comm.rank
    with comm.scope("halving_doubling_allreduce"):
        if n == 1:
            return tensor
        p, nr = _fold(r, n)
        if nr == -1:  # Step 1 (even partner): hand over, then wait for the result
            comm.send(flat, r + 1)
            comm.recv(flat, r + 1)
            return tensor
        if r < 2 * (n - p):  # Step 1 (odd partner): take the even one's tensor
            tmp = torch.empty_like(flat)
            flat.add_(comm.recv(tmp, r - 1))
        sizes = ring_chunks(flat.numel(), p)
        starts = [sum(sizes[:k]) for k in range(p + 1)]

        def blocks(lo: int, hi: int) -> torch.Tensor:
            return flat.narrow(0, starts[lo], starts[hi] - starts[lo])

        _halving(comm, nr, p, n, blocks)
        _doubling(comm, nr, p, n, blocks)
        if r < 2 * (n - p):  # Step 4: give the even partner the result
            comm.send(flat, r - 1)
    return tensor


def _halving(comm, nr: int, p: int, n: int, blocks) -> None:
    """Step 2: recursive-halving reduce-scatter; new rank nr ends with block nr."""
    lo, hi, d = 0, p, p // 2
    first = blocks(0, p // 2)  # the biggest half (ring_chunks puts longer blocks first)
    tmp = torch.empty(first.numel(), dtype=first.dtype, device=first.device)
    while d:
        peer, mid = nr ^ d, (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if nr & d else ((lo, mid), (mid, hi))
        mine = blocks(*keep)
        got = tmp[: mine.numel()]
        _exchange(comm, blocks(*give), got, _real(peer, n, p))
        mine.add_(got)
        lo, hi = keep
        d //= 2


def _doubling(comm, nr: int, p: int, n: int, blocks) -> None:
    """Step 3: recursive-doubling all-gather over the same blocks."""
    d = 1
    while d < p:
        peer = nr ^ d
        mine, theirs = (nr // d) * d, (peer // d) * d
        _exchange(comm, blocks(mine, mine + d), blocks(theirs, theirs + d), _real(peer, n, p))
        d *= 2
