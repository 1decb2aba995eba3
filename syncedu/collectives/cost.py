"""The alpha-beta(-gamma) cost model at work: predictions, calibration, what-ifs.

The formulas themselves (transfer time; ring, tree, halving-doubling,
recursive doubling, hierarchical and chain times, flat and on a cluster; busbw
factors) live in one table, `syncedu/comm/alphabeta.py`; the simulator's
logical time equals them (tests/test_cost.py, tests/test_cluster.py). This
module adds what a lesson does with them: the (a, b, c) coefficients of
time = a alpha + b beta + c gamma on a flat network (`terms`, Thakur,
Rabenseifner & Gropp, IJHPCA 2005), the best algorithm per size, what-if
tables, and fitting alpha and beta to measurements (`calibrate`).
"""

from __future__ import annotations

import math
import statistics

from syncedu.collectives import ALGORITHMS, SEGMENT_BYTES, ring_segments
from syncedu.comm import alphabeta
from syncedu.comm.network import Network

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
BUS_FACTOR = alphabeta.BUS_FACTOR
_DEFAULT = object()  # segment_bytes not given: ring_pipelined's default, no segments for ring


def _check(nbytes, world_size) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r} must be >= 0")


def _algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is unknown; choose one of {list(ALGORITHMS)}")
    return algorithm


def _segments(algorithm, nbytes, n, itemsize, segment_bytes) -> int:
    if algorithm == "ring_pipelined" or (algorithm == "ring" and segment_bytes is not _DEFAULT):
        seg = SEGMENT_BYTES if segment_bytes is _DEFAULT else segment_bytes
        return ring_segments(int(nbytes // itemsize), n, itemsize, seg)
    return 1


def terms(algorithm: str, nbytes: float, world_size: int, *, itemsize: int = 4,
          segment_bytes=_DEFAULT) -> tuple[float, float, float]:
    """(a, b, c) with time = a*alpha + b*beta + c*gamma, flat network (alphabeta.py's table)."""
    _check(nbytes, world_size)
    n, s = world_size, float(nbytes)
    if n == 1:
        return 0.0, 0.0, 0.0
    _algorithm(algorithm)
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
                   gamma: float = 0.0, itemsize: int = 4, segment_bytes=_DEFAULT) -> float:
    """Predicted seconds of an allreduce of `nbytes` per rank on `network` (flat or cluster).

    `gamma` is seconds per byte reduced (0: arithmetic is free, as in the simulator).
    """
    _check(nbytes, world_size)
    g = _segments(_algorithm(algorithm), nbytes, world_size, itemsize, segment_bytes)
    seconds = alphabeta.allreduce_time(algorithm, nbytes, world_size, network, segments=g)
    if gamma:
        seconds += terms(algorithm, nbytes, world_size, itemsize=itemsize)[2] * gamma
    return seconds


def collective_time(op: str, nbytes: float, world_size: int, network: Network) -> float:
    """Seconds of a built-in collective as `Comm` charges and the simulator times it.

    all_reduce: a ring; reduce_scatter / all_gather: one ring phase, `nbytes`
    being the whole (input / output) tensor; broadcast / reduce: a chain of
    N-1 whole messages (alphabeta.collective_time, which emulation uses too).
    """
    _check(nbytes, world_size)
    if op not in COLLECTIVES:
        raise ValueError(f"op={op!r} is unknown; choose one of {COLLECTIVES}")
    return alphabeta.collective_time(op, nbytes, world_size, network)


def ps_time(nbytes: float, workers: int, network: Network, servers: int = 1) -> float:
    """Seconds of one synchronous parameter-server round: push gradients, pull parameters.

    Each worker sends S/K bytes to each of K servers and gets as much back; a
    server's port carries W messages each way, a worker's K. The busier port
    sets the pace (a bottleneck model): 2 * max(W (alpha + S/K beta), K alpha + S beta).
    """
    _check(nbytes, workers)
    if servers < 1:
        raise ValueError(f"servers={servers!r} must be >= 1")
    a, beta = network.latency, 1 / network.bandwidth
    server = workers * (a + nbytes / servers * beta)
    worker = servers * a + nbytes * beta
    return 2 * max(server, worker)


# ------------------------------------------------------------- bandwidths
def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth S / t in bytes per second (nccl-tests)."""
    return nbytes / seconds


def busbw(op: str, nbytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth: algbw times the op's factor, e.g. 2(N-1)/N for all_reduce (nccl-tests)."""
    return alphabeta.busbw(op, nbytes, seconds, world_size)


# ------------------------------------------------------------ what-ifs
def best_algorithm(nbytes: float, world_size: int, network: Network,
                   algorithms=tuple(ALGORITHMS)) -> str:
    """The fastest of `algorithms` for this size, world size and network."""
    return min(algorithms, key=lambda al: allreduce_time(al, nbytes, world_size, network))


def what_if(sizes, world_sizes, network: Network, algorithms=tuple(ALGORITHMS)) -> list[dict]:
    """One row per (world size, size): every algorithm's predicted seconds and the winner."""
    rows = []
    for n in world_sizes:
        for s in sizes:
            times = {al: allreduce_time(al, s, n, network) for al in algorithms}
            rows.append({"world_size": n, "nbytes": s, **times,
                         "best": min(times, key=times.get)})
    return rows


# ------------------------------------------------------------ calibration
def fit_alpha_beta(a, b, seconds) -> tuple[float, float]:
    """Robust (alpha, beta) for seconds ~ a * alpha + b * beta.

    Steps: 1. median of repeated trials at each point; 2. beta from the large
    half (by b): least-squares slope with an intercept, so a constant overhead
    does not leak into the bandwidth; 3. alpha from the small half: the median
    of (t - b beta) / a, never below 0.
    """
    points: dict[tuple, list[float]] = {}
    for ai, bi, ti in zip(a, b, seconds):
        points.setdefault((float(ai), float(bi)), []).append(float(ti))
    if len(points) < 2:
        raise ValueError("need measurements at two or more sizes to fit alpha and beta")
    pts = sorted(((ai, bi, statistics.median(ts)) for (ai, bi), ts in points.items()),
                 key=lambda p: p[1])  # Step 1
    half = len(pts) // 2
    big = pts[half:] if len(pts) - half >= 2 else pts
    mb = statistics.fmean(p[1] for p in big)
    mt = statistics.fmean(p[2] for p in big)
    var = sum((p[1] - mb) ** 2 for p in big)
    beta = sum((p[1] - mb) * (p[2] - mt) for p in big) / var if var else mt / mb
    beta = max(beta, 1e-18)  # Step 2
    small = [p for p in pts[: max(1, half)] if p[0] > 0]
    alpha = statistics.median((t - bi * beta) / ai for ai, bi, t in small) if small else 0.0
    return max(alpha, 0.0), beta  # Step 3


def fit_network(sizes, seconds, name: str = "calibrated") -> Network:
    """A `Network` from one-way point-to-point times: t(n) = alpha + n / bandwidth."""
    alpha, beta = fit_alpha_beta([1] * len(sizes), sizes, seconds)
    return Network(latency=alpha, bandwidth=1 / beta, name=name)


def pingpong(comm, sizes, repeats: int = 5, warmup: int = 1) -> dict[int, list[float]]:
    """Worker: one-way seconds (half a round trip) between ranks 0 and 1, per size.

    Rank 0 sends n bytes to rank 1, which sends them back; repeated `repeats`
    times after `warmup` rounds. Other ranks only join the barrier. Returns
    {nbytes: [seconds, ...]} on rank 0 (and on rank 1), {} elsewhere.
    """
    import torch

    out: dict[int, list[float]] = {}
    for n in sizes:
        buf = torch.zeros(max(1, int(n)), dtype=torch.uint8, device=comm.device)
        comm.barrier()
        if comm.rank > 1:
            continue
        peer = 1 - comm.rank
        for i in range(warmup + repeats):
            t0 = comm.now()  # logical time on simulated ranks
            if comm.rank == 0:
                comm.send(buf, peer)
                comm.recv(buf, peer)
            else:
                comm.recv(buf, peer)
                comm.send(buf, peer)
            if i >= warmup:
                out.setdefault(int(buf.numel()), []).append((comm.now() - t0) / 2)
    return out


def calibrate(run, sizes=(8, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22),
              repeats: int = 7) -> Network:
    """Measure ping-pong on real ranks and fit a `Network` (latency, bandwidth).

    `run` runs a worker on two or more ranks, e.g. `pool.run` of a
    `launch.Pool(2)` or `functools.partial(launch.run, world_size=2)`.
    """
    times = run(pingpong, args=(tuple(sizes), repeats))[0]
    xs = [n for n, ts in times.items() for _ in ts]
    ts = [t for _, tt in times.items() for t in tt]
    return fit_network(xs, ts)
