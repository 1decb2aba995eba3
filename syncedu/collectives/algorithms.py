"""AllReduce from scratch against `Comm`: each `(comm, tensor)` sums in place (any N and
length, the dtypes in `DTYPES`) under a ledger op of its own name; naive is the oracle."""

from __future__ import annotations

import itertools

import torch

from syncedu.comm.ledger import ring_chunks

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def flat_view(tensor: torch.Tensor) -> torch.Tensor:
    """A flat view of `tensor`, outside autograd, that receives write straight into."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (call .contiguous() first, or allreduce())")
    return (tensor.detach() if tensor.requires_grad else tensor).view(-1)


def _pieces(flat: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """`flat` cut into `parts` consecutive views whose sizes differ by at most one."""
    return list(torch.split(flat, ring_chunks(flat.numel(), parts)))


def _sendrecv(comm, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int,
              skip_empty: bool = False) -> None:
    """Send `send` to `dst` while receiving `recv` from `src`; wait for both. `skip_empty`:
    an empty piece sends no message (ZeRO's uneven shards: both sides know its size)."""
    works = [comm.irecv(recv, src)] if recv.numel() or not skip_empty else []
    for work in works + ([comm.isend(send, dst)] if send.numel() or not skip_empty else []):
        work.wait()


def naive_allreduce(comm, tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
    """Reduce to `root` with send/recv, then send the sum back to everyone: the oracle.

    1. Every other rank sends its whole tensor to `root`.
    2. `root` adds them up in rank order (so the result is the same every run).
    3. `root` sends the sum to every other rank: (N-1) S bytes through one port.
    """
    flat = flat_view(tensor)
    n, r = comm.world_size, comm.rank
    with comm.scope("naive_allreduce"):
        if n > 1 and r != root:
            comm.send(flat, root)  # Step 1
            comm.recv(flat, root)  # Step 3 (receiving side)
        elif n > 1:
            got = torch.empty_like(flat)
            for src in range(n):  # Step 2
                if src != root:
                    flat.add_(comm.recv(got, src))
            for work in [comm.isend(flat, dst) for dst in range(n) if dst != root]:  # Step 3
                work.wait()
    return tensor


def ring_reduce_scatter_chunks(comm, chunks: list[torch.Tensor], ring: list[int],
                               skip_empty: bool = False) -> None:
    """Ring reduce-scatter over the ranks `ring`: chunk i ends summed on ring[i].

    With i this rank's place in the ring, step s sends chunk (i-1-s) to the
    right and adds chunk (i-2-s) from the left: each chunk goes round once.
    `skip_empty`: empty chunks send no message (see `_sendrecv`).
    """
    n, i = len(ring), ring.index(comm.rank)
    if n == 1:
        return
    right, left = ring[(i + 1) % n], ring[(i - 1) % n]
    # One receive view per distinct chunk size (usually two), made once:
    # a simulated 1024-rank ring runs this loop two million times.
    buffer = chunks[0].new_empty(max(c.numel() for c in chunks))
    inbox = {k: buffer[:k] for k in {c.numel() for c in chunks}}
    for s in range(n - 1):
        into = chunks[(i - 2 - s) % n]
        got = inbox[into.numel()]
        _sendrecv(comm, chunks[(i - 1 - s) % n], right, got, left, skip_empty)
        into.add_(got)


def ring_all_gather_chunks(comm, chunks: list[torch.Tensor], ring: list[int],
                           skip_empty: bool = False) -> None:
    """Ring all-gather: ring[i] brings chunk i; step s passes chunk (i-s) to the right."""
    n, i = len(ring), ring.index(comm.rank)
    right, left = ring[(i + 1) % n], ring[(i - 1) % n]
    for s in range(n - 1):
        _sendrecv(comm, chunks[(i - s) % n], right, chunks[(i - 1 - s) % n], left, skip_empty)


def ring_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """The two-phase ring allreduce (Patarasuk & Yuan, JPDC 2009), sum in place.

    1. Cut the tensor into N chunks (sizes differ by at most one).
    2. Reduce-scatter, N-1 steps: send chunk (r-1-s) to rank r+1, add the one from r-1;
       rank r ends with chunk r summed, as `reduce_scatter` promises (the paper: from r).
    3. All-gather, N-1 steps: pass the finished chunks around the same ring.
    Each rank sends 2(N-1)/N * S bytes in 2(N-1) messages.
    """
    flat, ring = flat_view(tensor), list(range(comm.world_size))
    with comm.scope("ring_allreduce"):
        chunks = _pieces(flat, comm.world_size)  # Step 1
        ring_reduce_scatter_chunks(comm, chunks, ring)  # Step 2
        ring_all_gather_chunks(comm, chunks, ring)  # Step 3
    return tensor


def ring_reduce_scatter(comm, tensor: torch.Tensor) -> torch.Tensor:
    """Steps 1-2 of the ring in place; returns chunk `comm.rank`, now the sum over ranks."""
    chunks = _pieces(flat_view(tensor), comm.world_size)
    with comm.scope("ring_reduce_scatter"):
        ring_reduce_scatter_chunks(comm, chunks, list(range(comm.world_size)))
    return chunks[comm.rank]


def ring_all_gather(comm, tensor: torch.Tensor) -> torch.Tensor:
    """Steps 1 and 3 of the ring in place: rank r brings chunk r, all end with all."""
    chunks = _pieces(flat_view(tensor), comm.world_size)
    with comm.scope("ring_all_gather"):
        ring_all_gather_chunks(comm, chunks, list(range(comm.world_size)))
    return tensor


def tree_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """Binomial-tree allreduce (Thakur, Rabenseifner & Gropp, IJHPCA 2005), sum in place.

    Let low be the lowest set bit of r (for rank 0: a power of two >= N).
    1. Reduce: for mask = 1, 2, ... below low, add the subtree sum of rank
       r + mask, then send the total to the parent r - low.
    2. Broadcast back: receive the sum from the parent, send it on to
       r + mask for mask = low/2, ..., 1. ceil(log2 N) whole-tensor rounds each way.
    """
    flat = flat_view(tensor)
    n, r = comm.world_size, comm.rank
    with comm.scope("tree_allreduce"):
        low = r & -r if r else 1 << (n - 1).bit_length()
        got, mask = torch.empty_like(flat), 1
        while mask < low and r + mask < n:  # Step 1
            flat.add_(comm.recv(got, r + mask))
            mask <<= 1
        if r:
            comm.send(flat, r - low)
            comm.recv(flat, r - low)  # Step 2
        children = [r + (low >> k) for k in range(1, low.bit_length()) if r + (low >> k) < n]
        for work in [comm.isend(flat, child) for child in children]:  # largest subtree first
            work.wait()
    return tensor


def _real(new: int, n: int, p: int) -> int:
    """The real rank behind rank `new` of the p = 2^floor(log2 N) left after folding."""
    return 2 * new + 1 if new < n - p else new + (n - p)


def folded(comm, flat: torch.Tensor, name: str, body) -> None:
    """Fold N ranks onto p = 2^floor(log2 N), run `body(p, new rank)` there, unfold:
    of ranks 0..2(N-p)-1, each even one hands its tensor to the odd one after it and
    gets the result back from it at the end."""
    n, r = comm.world_size, comm.rank
    p = 1 << (n.bit_length() - 1)
    with comm.scope(name):
        if r < 2 * (n - p) and r % 2 == 0:  # even partner: hand over, wait for the result
            comm.send(flat, r + 1)
            comm.recv(flat, r + 1)
            return
        if r < 2 * (n - p):  # odd partner: fold
            flat.add_(comm.recv(torch.empty_like(flat), r - 1))
        body(p, r // 2 if r < 2 * (n - p) else r - (n - p))
        if r < 2 * (n - p):  # unfold
            comm.send(flat, r - 1)


def halving_doubling_allreduce(comm, tensor: torch.Tensor,
                               order: str = "far_first") -> torch.Tensor:
    """Recursive halving-doubling allreduce (Rabenseifner, ICCS 2004), sum in place.

    1. Fold if N is not a power of two p (`folded`).
    2. Recursive halving (reduce-scatter) over p blocks: for d = p/2, ..., 1
       (`order="far_first"`, as written by Thakur et al. 2005) or d = 1, ..., p/2
       ("near_first"), give half your block range to new rank ^ d, add the half it
       gives you: the step at distance d moves S/2, the next S/4, ...
    3. Recursive doubling (all-gather): the same exchanges in reverse order, each
       swapping the halves the step split. 2 log2 p rounds, the ring's 2(p-1)/p * S bytes.
    4. Unfold (`folded`).
    On node-major ranks, far-first sends the largest halves between nodes; near-first
    keeps them inside and sends only S/L and less across (Goyal et al.'s layout).
    """
    flat, n = flat_view(tensor), comm.world_size
    if order not in ("far_first", "near_first"):
        raise ValueError(f"order={order!r} must be 'far_first' or 'near_first'")

    def halving_doubling(p: int, me: int) -> None:
        starts = [0, *itertools.accumulate(ring_chunks(flat.numel(), p))]
        inbox, lo, hi, path = flat.new_empty(starts[p // 2]), 0, p, []  # the longest half first
        far = [p >> k for k in range(1, p.bit_length())]  # p/2, ..., 1
        for d in far if order == "far_first" else far[::-1]:  # Step 2
            peer, mid = _real(me ^ d, n, p), (lo + hi) // 2
            path.append((peer, lo, hi))
            (lo, hi), (glo, ghi) = ((mid, hi), (lo, mid)) if me & d else ((lo, mid), (mid, hi))
            got = inbox[: starts[hi] - starts[lo]]
            _sendrecv(comm, flat[starts[glo]:starts[ghi]], peer, got, peer)
            flat[starts[lo]:starts[hi]].add_(got)
        for peer, plo, phi in reversed(path):  # Step 3: my half out, the other half in
            olo, ohi = (plo, lo) if lo > plo else (hi, phi)
            _sendrecv(comm, flat[starts[lo]:starts[hi]], peer,
                      flat[starts[olo]:starts[ohi]], peer)
            lo, hi = plo, phi

    folded(comm, flat, "halving_doubling_allreduce", halving_doubling)  # Steps 1 and 4
    return tensor


def recursive_doubling_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """Recursive-doubling allreduce (Thakur, Rabenseifner & Gropp 2005, short messages).

    1. Fold if N is not a power of two p (`folded`).
    2. For d = 1, 2, ..., p/2: swap the whole tensor with new rank ^ d, add.
       log2 p rounds, few latencies but S bytes each: for short messages.
    3. Unfold (`folded`).
    """
    flat, n = flat_view(tensor), comm.world_size

    def doubling(p: int, me: int) -> None:
        got = torch.empty_like(flat)
        for d in (1 << k for k in range(p.bit_length() - 1)):  # Step 2: d = 1, ..., p/2
            _sendrecv(comm, flat, _real(me ^ d, n, p), got, _real(me ^ d, n, p))
            flat.add_(got)  # a + b == b + a: both partners hold the same bits

    folded(comm, flat, "recursive_doubling_allreduce", doubling)  # Steps 1 and 3
    return tensor


def _node_of(comm) -> tuple[int, int, int]:
    """(first rank of my node, its size, a full node's size). Nodes hold consecutive ranks,
    all but the last full; a comm without `local_rank` and `node` is one node."""
    n, r = comm.world_size, comm.rank
    if getattr(comm.network, "placement", None):
        raise ValueError("hierarchical_allreduce needs nodes of consecutive ranks: a Network "
                         "with placement=None")
    first, node = r - getattr(comm, "local_rank", r), getattr(comm, "node", 0)
    full = first // node if node else getattr(comm, "local_world_size", n)
    return first, min(full, n - first), full


def hierarchical_allreduce(comm, tensor: torch.Tensor) -> torch.Tensor:
    """Hierarchical allreduce, sum in place: inside each node, across nodes, inside again.

    Cut the tensor into L shards, L = ranks per node (`comm.local_world_size`,
    `comm.node`); on a smaller last node of m ranks the last one holds shards m-1..L-1.
    1. Ring reduce-scatter inside the node: local rank j gets shard j's node sum.
    2. Ring allreduce of each held shard across nodes, among its holders (the
       ranks with the same local rank): 2(M-1) latencies on M nodes, not 2(N-1).
    3. Ring all-gather inside the node: every rank ends with every shard.
    """
    flat, n = flat_view(tensor), comm.world_size
    first, size, full = _node_of(comm)
    shards, local = _pieces(flat, full), comm.rank - first
    inside = [*shards[: size - 1], flat[sum(s.numel() for s in shards[: size - 1]):]]
    node_ring = list(range(first, first + size))
    held = [local] if local < size - 1 else range(size - 1, full)  # the shards this rank owns
    with comm.scope("hierarchical_allreduce"):
        ring_reduce_scatter_chunks(comm, inside, node_ring)  # Step 1
        for j in held:  # Step 2: one ring per shard, through shard j's holder on each node
            across = [f + min(j, n - f - 1) for f in range(0, n, full)]
            pieces = _pieces(shards[j], len(across))
            ring_reduce_scatter_chunks(comm, pieces, across)
            ring_all_gather_chunks(comm, pieces, across)
        ring_all_gather_chunks(comm, inside, node_ring)  # Step 3
    return tensor
