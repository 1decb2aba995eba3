"""The alpha-beta formulas, in one place: what each collective costs on a `Network`.

One message of n bytes takes t(n) = alpha + n beta (Hockney 1994). With N ranks
and S bytes per rank on a flat network (Thakur, Rabenseifner & Gropp, IJHPCA
2005; Patarasuk & Yuan, JPDC 2009), p = 2^floor(log2 N) (the other ranks fold in):

| algorithm | time |
|---|---|
| naive | 2(N-1) t(S) |
| ring | 2(N-1) t(S/N) |
| ring_pipelined | 2(N-1) G t(S/(N G)), G segments per chunk |
| tree | 2 ceil(log2 N) t(S) |
| halving_doubling | 2 sum_k t(S/2^k), k = 1..log2 p; plus 2 t(S) if N != p |
| recursive_doubling | log2 p t(S); plus 2 t(S) if N != p |

`Comm`'s built-ins: a ring (reduce_scatter, all_gather: (N-1) t(S/N)), broadcast
and reduce a chain of N-1 whole messages, barrier ceil(log2 N) empty messages.
Bus bandwidth: nccl-tests' PERFORMANCE.md (`BUS_FACTOR`).

On a cluster (M nodes of L ranks, f = ceil(L / nics_per_node) ranks per NIC) a
message between nodes also queues at its NIC: a ring takes 2(N-1) max(t_intra(S/N),
t_inter(S/N)); hierarchical 2(L-1) t_intra(S/L) + max(alpha + 2(M-1) f w, 2(M-1)
t_inter(S/N) + (f-1) w), w = (S/N) beta_inter (the L rings share the NIC); the
log-depth ones sum their steps (a crossing one alpha + f' n beta_inter, f' flows per
NIC). The simulator equals these while no two flows meet at a NIC, else within 25%.
"""

from __future__ import annotations

import math

from .network import Network
from .runs import check_choice, check_int

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n,  # nccl-tests: busbw = algbw * factor(N)
              "reduce_scatter": lambda n: (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier")
ALLREDUCE = ("naive", "ring", "ring_pipelined", "tree", "halving_doubling",
             "recursive_doubling", "hierarchical")
SEGMENT_BYTES = 4 << 20  # default pipeline segment: 4 MiB (see ring_segments)


def _links(network):
    """(intra link, inter link, ranks per node, nodes, ranks per NIC) of any network."""
    if getattr(network, "is_cluster", False):
        f = -(-network.gpus_per_node // network.nics_per_node)
        return network.intra, network.inter, network.gpus_per_node, network.nodes, f
    return network, network, None, 1, 1


def check(nbytes, world_size) -> None:
    """The formulas' two inputs, checked once at their entry (`allreduce_time`,
    `collective_time`, `terms`, which `collectives.cost` hands on): a ValueError naming the
    parameter (a text such as "1MB" included)."""
    check_int("world_size", world_size)
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not nbytes >= 0:
        raise ValueError(f"nbytes={nbytes!r} must be a number of bytes >= 0")


def check_network(network, world_size: int) -> None:
    """A `Network` for `world_size` ranks: None, a preset's name or a cluster of another size
    (timed silently as its own size before) is refused, as `sim.run` refuses it."""
    if not isinstance(network, Network):
        hint = repr(network) if isinstance(network, str) else "'ethernet_10g'"
        raise ValueError(f"network must be a syncedu.Network, e.g. Network.preset({hint}); "
                         f"got {network!r}")
    if network.is_cluster:  # (a flat network's slowdown list is the runs' business)
        network.check_world_size(world_size)


def ring_segments(numel: int, world_size: int, element_size: int,
                  segment_bytes: int | None = SEGMENT_BYTES) -> int:
    """Segments G per ring chunk (1: no pipelining): the largest chunk, ceil(numel / N)
    elements, cut into pieces of at most `segment_bytes` (None: never cut)."""
    if segment_bytes is None:
        return 1
    if not isinstance(segment_bytes, int) or segment_bytes < 1:
        raise ValueError(f"segment_bytes={segment_bytes!r} must be an int >= 1 or None")
    biggest = -(-numel // world_size) * element_size
    return max(1, math.ceil(biggest / segment_bytes))


def ring_time(nbytes: float, n: int, network, segments: int = 1) -> float:
    """2(N-1) G t(S/(N G)); on a cluster the slower of the intra/inter link per step."""
    intra, inter, _, nodes, _ = _links(network)
    if n == 1:
        return 0.0
    piece = nbytes / n / segments
    slow = (inter if nodes > 1 else intra).transfer_time(piece)
    return 2 * (n - 1) * segments * max(intra.transfer_time(piece), slow)


def chain_time(nbytes: float, n: int, network) -> float:
    """N-1 whole messages one after the other (broadcast, reduce), M-1 of them across nodes."""
    intra, inter, _, nodes, _ = _links(network)
    crossing = nodes - 1
    inside = n - 1 - crossing
    return crossing * inter.transfer_time(nbytes) + inside * intra.transfer_time(nbytes)


def naive_time(nbytes: float, n: int, network) -> float:
    """Everyone to rank 0 and back: its port takes N-1 whole messages each way."""
    intra, inter, per_node, nodes, _ = _links(network)
    crossing = n - per_node if nodes > 1 else 0
    return 2 * (crossing * inter.transfer_time(nbytes)
                + (n - 1 - crossing) * intra.transfer_time(nbytes))


def _step(nbytes: float, mask: int, network, flows_per_nic: int) -> float:
    """One step of a log-depth algorithm between ranks `mask` apart (crossing nodes or not)."""
    intra, inter, per_node, nodes, f = _links(network)
    if nodes > 1 and mask >= per_node:
        return inter.latency + min(flows_per_nic, f) * nbytes / inter.bandwidth
    return intra.transfer_time(nbytes)


def tree_time(nbytes: float, n: int, network) -> float:
    """Binomial reduce + broadcast: 2 sum over rounds of t(S) (one flow per node per round)."""
    k = math.ceil(math.log2(n)) if n > 1 else 0
    return 2 * sum(_step(nbytes, 1 << i, network, 1) for i in range(k))


def _fold(nbytes: float, n: int, network) -> tuple[int, float]:
    """(p, time of folding in and out the N - p extra ranks: 2 t(S) if any)."""
    p = 1 << (n.bit_length() - 1)
    return p, (2 * _step(nbytes, 1, network, 1) if n != p else 0.0)


def halving_doubling_time(nbytes: float, n: int, network) -> float:
    """Rabenseifner: halving with distance p/2..1 on S/2..S/p, then doubling back."""
    p, fold = _fold(nbytes, n, network)
    steps, d, size = 0.0, p // 2, nbytes / 2
    while d:  # every rank of a node sends at once in a crossing step: f flows per NIC
        steps += 2 * _step(size, d, network, 1 << 30)
        d, size = d // 2, size / 2
    return fold + steps


def recursive_doubling_time(nbytes: float, n: int, network) -> float:
    """Thakur et al. 2005 (short messages): log2 p swaps of the whole vector."""
    p, fold = _fold(nbytes, n, network)
    return fold + sum(_step(nbytes, 1 << i, network, 1 << 30) for i in range(p.bit_length() - 1))


def hierarchical_time(nbytes: float, n: int, network) -> float:
    """Ring inside the node, L rings across nodes sharing the NICs, ring inside again."""
    intra, inter, per_node, nodes, f = _links(network)
    if per_node is None or nodes == 1:
        return ring_time(nbytes, n, intra)
    inside = 2 * (per_node - 1) * intra.transfer_time(nbytes / per_node)
    w = nbytes / n / inter.bandwidth
    steps = 2 * (nodes - 1)
    across = max(inter.latency + steps * f * w, steps * (inter.latency + w) + (f - 1) * w)
    return inside + across


def _segments(algorithm: str, nbytes: float, n: int, itemsize: int, segment_bytes) -> int:
    """G, the segments per chunk: the pipelined ring's (`ring_segments`); 1 for the rest."""
    if algorithm != "ring_pipelined":
        return 1
    return ring_segments(int(nbytes // itemsize), n, itemsize, segment_bytes)


def terms(algorithm: str, nbytes: float, world_size: int, *, itemsize: int = 4,
          segment_bytes: int | None = SEGMENT_BYTES) -> tuple[float, float, float]:
    """(a, b, c) with time = a*alpha + b*beta + c*gamma, flat network (the table above);
    c: the bytes each rank reduces (Thakur et al. 2005's gamma term)."""
    check(nbytes, world_size)
    check_choice("algorithm", algorithm, list(ALLREDUCE))
    n, s = world_size, float(nbytes)
    if n == 1:
        return 0.0, 0.0, 0.0
    if algorithm == "naive":
        return 2 * (n - 1), 2 * (n - 1) * s, (n - 1) * s
    if algorithm in ("ring", "ring_pipelined", "hierarchical"):  # one node: a ring
        g = _segments(algorithm, nbytes, n, itemsize, segment_bytes)
        return 2 * (n - 1) * g, 2 * (n - 1) * s / n, (n - 1) / n * s
    if algorithm == "tree":
        k = math.ceil(math.log2(n))
        return 2 * k, 2 * k * s, k * s
    p = 1 << (n.bit_length() - 1)
    fold = 2 if n != p else 0
    if algorithm == "recursive_doubling":
        k = math.log2(p)
        return k + fold, k * s + fold * s, k * s + fold / 2 * s
    return (2 * math.log2(p) + fold, 2 * (p - 1) / p * s + fold * s,
            (p - 1) / p * s + fold / 2 * s)


def allreduce_time(algorithm: str, nbytes: float, world_size: int, network: Network, *,
                   gamma: float = 0.0, itemsize: int = 4,
                   segment_bytes: int | None = SEGMENT_BYTES) -> float:
    """Seconds of `algorithm` (see the table above) for `nbytes` per rank on `network` (flat
    or cluster); `gamma`: seconds per byte reduced (0: arithmetic is free, as in the
    simulator); `itemsize`, `segment_bytes`: the pipelined ring's G (`ring_segments`)."""
    check(nbytes, world_size)
    check_network(network, world_size)
    check_choice("algorithm", algorithm, list(ALLREDUCE))
    n = world_size
    if n == 1:
        return 0.0
    formulas = {"naive": naive_time, "tree": tree_time, "halving_doubling": halving_doubling_time,
                "recursive_doubling": recursive_doubling_time, "hierarchical": hierarchical_time}
    if algorithm in formulas:
        seconds = formulas[algorithm](nbytes, n, network)
    else:  # the rings
        seconds = ring_time(nbytes, n, network, _segments(algorithm, nbytes, n, itemsize,
                                                          segment_bytes))
    return seconds + (terms(algorithm, nbytes, n, itemsize=itemsize)[2] * gamma if gamma else 0.0)


def collective_time(op: str, nbytes: float, world_size: int, network: Network, *,
                    itemsize: int = 4) -> float:
    """Seconds of a built-in collective as `Comm` charges it and the simulator times it;
    `nbytes`: the whole tensor of `itemsize`-byte elements (a ring step is set by its largest
    chunk: ceil(S / itemsize / N) elements, as `ring_chunks` cuts them; 8,970 floats on 4
    ranks: 2,243 elements, 8,972 B)."""
    check(nbytes, world_size)
    check_network(network, world_size)
    check_choice("op", op, COLLECTIVES)
    n = world_size
    if n == 1:
        return 0.0
    chunk = -(-math.ceil(nbytes / itemsize) // n) * itemsize
    if op == "all_reduce":
        return ring_time(chunk * n, n, network)
    if op in ("reduce_scatter", "all_gather"):
        return ring_time(chunk * n, n, network) / 2
    if op in ("broadcast", "reduce"):
        return chain_time(nbytes, n, network)
    intra, inter, _, nodes, _ = _links(network)  # barrier: ceil(log2 N) empty messages
    return math.ceil(math.log2(n)) * max(intra.latency, inter.latency if nodes > 1 else 0.0)


def busbw(kind: str, nbytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth: algbw S / t times the op's factor, e.g. 2(N-1)/N for all_reduce."""
    check_choice("op", kind, list(BUS_FACTOR))
    return nbytes / seconds * BUS_FACTOR[kind](world_size)
