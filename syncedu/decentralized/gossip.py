"""Gossip averaging: every rank mixes its tensor with a few neighbours', no global collective.

One round is `x_i <- sum_j W[i, j] x_j`: rank i receives the tensors of the ranks j with
W[i, j] > 0 (its neighbours), point-to-point, and sends its own to the ranks that need it.
With a doubly stochastic W (rows and columns sum to 1) the average over the ranks never
changes, and the ranks' spread shrinks by at most |lambda_2| per round, the second largest
eigenvalue modulus of W (a bound for a normal W, as every W below is: symmetric or circulant;
Xiao & Boyd, "Fast linear iterations for distributed averaging", Systems & Control Letters
2004).

1. Topologies (`TOPOLOGIES`), each rank with the same number of neighbours d and weight
   1/(d+1) for itself and each neighbour (Metropolis weights on a regular graph):
   - "ring": i-1 and i+1;
   - "torus": a rows x cols grid (rows the largest divisor of n up to sqrt(n), both >= 2),
     wrapping around: up, down, left, right;
   - "exponential": rank i receives from i + 2^k (mod n) for every 2^k < n, so
     ceil(log2 n) peers, directed but circulant, hence doubly stochastic (Ying, Yuan, Chen,
     Hu, Pan & Yin, "Exponential Graph is Provably Efficient for Decentralized Deep
     Training", NeurIPS 2021, their W_ij definition in section 3);
   - "one_peer_exponential": in round t rank i receives only from i + 2^(t mod tau),
     tau = ceil(log2 n), weight 1/2 each (ibid., one-peer variant): pass `round=t`; for n
     a power of two, tau consecutive rounds average exactly (ibid., its product lemma);
   - "complete": everyone, weight 1/n: one round is an (all-to-all) allreduce.
2. `gossip(comm, tensor, topology, round=0)`: post every receive and send (`irecv`/`isend`),
   then wait (Gloo's point-to-point is rendezvous: a blocking send first on both sides
   hangs), then mix in place. The tensor is not touched until its sends complete.
3. Push-sum (Kempe, Dobra & Gehrke, FOCS 2003; SGP, Assran, Loizou, Ballas & Rabbat,
   ICML 2019) on a directed graph where each sender picks its own shares (a column-
   stochastic W): the values alone converge to a biased limit; values / weights, both
   mixed alike, converge to the true average.
"""

from __future__ import annotations

import math

import torch

from syncedu.comm.runs import check_int

TOPOLOGIES = ("ring", "torus", "exponential", "one_peer_exponential", "complete")
TAG = 12  # the point-to-point tag of a gossip round (lesson 12)


def check_topology(topology, n: int) -> None:
    """ValueError naming `topology` (or `n`) unless the pair makes a graph."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology={topology!r} is unknown; choose one of {TOPOLOGIES}")
    check_int("n", n)  # the number of ranks
    if topology == "torus" and torus_shape(n) is None:
        raise ValueError(f"topology='torus' needs n = rows x cols with rows, cols >= 2; n={n} "
                         f"is {'prime' if n > 1 else 'too small'}: use a composite n "
                         f"(4, 6, 8, 9, ...) or another topology")


def torus_shape(n: int) -> tuple[int, int] | None:
    """(rows, cols) with rows the largest divisor of n up to sqrt(n), or None if rows < 2."""
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return (rows, n // rows) if rows >= 2 else None


def in_peers(topology: str, n: int, i: int, round: int = 0) -> list[int]:
    """The ranks whose tensors rank i mixes in (W[i, j] > 0, j != i), in offset order: the
    same k-th offset on every rank, so that the k-th sends of all ranks form a permutation
    (each rank receives one message at a time, no port contention)."""
    check_topology(topology, n)
    tau = max(1, math.ceil(math.log2(n))) if n > 1 else 1
    if topology == "ring":
        peers = [(i - 1) % n, (i + 1) % n]
    elif topology == "torus":
        rows, cols = torus_shape(n)
        r, c = divmod(i, cols)
        peers = [((r - 1) % rows) * cols + c, ((r + 1) % rows) * cols + c,
                 r * cols + (c - 1) % cols, r * cols + (c + 1) % cols]
    elif topology == "exponential":
        peers = [(i + 2 ** k) % n for k in range(tau)]
    elif topology == "one_peer_exponential":
        peers = [(i + 2 ** (round % tau)) % n]
    else:
        peers = [(i + d) % n for d in range(1, n)]
    return [j for j in dict.fromkeys(peers) if j != i]


def out_peers(topology: str, n: int, i: int, round: int = 0) -> list[int]:
    """The ranks that need rank i's tensor (W[j, i] > 0, j != i), in offset order."""
    if topology in ("exponential", "one_peer_exponential"):  # i + d receives from i: reversed
        return [(2 * i - j) % n for j in in_peers(topology, n, i, round)]
    return in_peers(topology, n, i, round)  # undirected


def mixing_matrix(topology: str, n: int, round: int = 0) -> torch.Tensor:
    """W (n x n, float64): one gossip round is X <- W X. `round` selects the one-peer
    exponential graph's matrix of that round (the other topologies ignore it)."""
    check_topology(topology, n)
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        peers = in_peers(topology, n, i, round)
        w[i, [i, *peers]] = 1.0 / (len(peers) + 1)
    return w


def second_eigenvalue(w: torch.Tensor) -> float:
    """|lambda_2|: the largest eigenvalue modulus of W once the average (the eigenvalue 1 of
    the all-ones vector) is taken out: the per-round contraction of the ranks' spread."""
    n = w.shape[0]
    centred = w - torch.full_like(w, 1.0 / n)  # W - 11^T/n: W on the consensus subspace
    return float(torch.linalg.eigvals(centred).abs().max()) if n > 1 else 0.0


def consensus_distance(xs) -> float:
    """sqrt(mean_i ||x_i - mean||^2) over the ranks' tensors (rows of a matrix or a list)."""
    x = torch.stack([torch.as_tensor(t, dtype=torch.float64).reshape(-1) for t in xs])
    return float((x - x.mean(0)).pow(2).sum(1).mean().sqrt())


def _exchange(comm, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]],
              timeout: float | None) -> None:
    """Post every receive, then every send; wait for all (never send-then-recv blocking)."""
    works = [comm.irecv(buf, src=j, tag=TAG) for j, buf in recvs]
    works += [comm.isend(t, dst=j, tag=TAG) for j, t in sends]
    for work in works:
        work.wait(timeout)


def gossip(comm, tensor: torch.Tensor, topology: str, round: int = 0, *,
           timeout: float | None = 60.0) -> torch.Tensor:
    """One gossip round in place: `tensor <- sum_j W[rank, j] tensor_j` (Step 2)."""
    n, i = comm.world_size, comm.rank
    peers = in_peers(topology, n, i, round)
    if not peers:
        return tensor
    bufs = [torch.empty_like(tensor) for _ in peers]
    _exchange(comm, [(j, tensor) for j in out_peers(topology, n, i, round)],
              list(zip(peers, bufs)), timeout)
    with torch.no_grad():
        tensor.copy_((tensor + sum(bufs)) / (len(peers) + 1))
    return tensor


def push_shares(n: int, i: int, keep: float) -> dict[int, float]:
    """Step 3's column i: rank i keeps `keep` of its mass and splits the rest evenly over its
    out-neighbours in the exponential graph (it sends to i - 2^k)."""
    if not 0 < keep < 1:
        raise ValueError(f"keep={keep!r} must be in (0, 1): a rank keeps part of its mass")
    peers = out_peers("exponential", n, i) if n > 1 else []
    return {i: keep if peers else 1.0, **{j: (1 - keep) / len(peers) for j in peers}}


def push_matrix(keeps) -> torch.Tensor:
    """The column-stochastic W of `push_sum` with rank i keeping `keeps[i]` (float64)."""
    n = len(keeps)
    cols = [push_shares(n, i, keep) for i, keep in enumerate(keeps)]  # W[j, i]: i's share to j
    return torch.tensor([[col.get(j, 0.0) for col in cols] for j in range(n)], dtype=torch.float64)


def push_sum(comm, tensor: torch.Tensor, weight: torch.Tensor, keep: float, *,
             timeout: float | None = 60.0) -> None:
    """One push-sum round in place on `tensor` and its 1-element `weight` (Step 3): send
    share * (tensor, weight) to each out-neighbour in one message, keep the rest, add what
    arrives. The average estimate is `tensor / weight`."""
    n, i = comm.world_size, comm.rank
    shares = push_shares(n, i, keep)
    packed = torch.cat([tensor.reshape(-1), weight.reshape(-1).to(tensor.dtype)])
    peers = in_peers("exponential", n, i) if n > 1 else []
    bufs = [torch.empty_like(packed) for _ in peers]
    _exchange(comm, [(j, packed * s) for j, s in shares.items() if j != i],
              list(zip(peers, bufs)), timeout)
    with torch.no_grad():
        acc = packed * shares[i] + sum(bufs)
        tensor.copy_(acc[:-1].reshape(tensor.shape))
        weight.copy_(acc[-1:].reshape(weight.shape).to(weight.dtype))
