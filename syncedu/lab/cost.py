"""The alpha-beta(-gamma) cost model of every collective, calibration, and what-ifs.

A message of n bytes takes alpha + n * beta (alpha: latency, beta = 1 /
bandwidth); reducing n bytes costs n * gamma (Hockney 1994; Thakur, Rabenseifner
& Gropp, IJHPCA 2005). With N ranks and S bytes per rank, each algorithm's time
is a * alpha + b * beta + c * gamma, and `terms` gives (a, b, c):

| algorithm | a (messages in a row) | b (bytes in a row) | c (bytes reduced) |
|---|---|---|---|
| naive | 2(N-1) | 2(N-1) S | (N-1) S |
| ring | 2(N-1) G | 2(N-1) S/N | (N-1)/N S |
| tree | 2 ceil(log2 N) | 2 ceil(log2 N) S | ceil(log2 N) S |
| halving_doubling | 2 log2 p (+2) | 2(p-1)/p S (+2S) | (p-1)/p S (+S) |

G is the ring's pipeline segments per chunk (1 unless a chunk is over
`SEGMENT_BYTES`); p = 2^floor(log2 N), the (+...) terms only when N != p. These
are exactly what the simulator's clock charges (tests hold formula, simulator
and ledger together). Busbw follows nccl-tests' PERFORMANCE.md.

Used in: notebooks/02_allreduce_algorithms, 04_parameter_server, 09_tuning_playbook.
"""

from __future__ import annotations

import math
import statistics

from syncedu.comm.emulation import ring_seconds
from syncedu.comm.network import Network
from syncedu.strategies.collectives import ALGORITHMS, SEGMENT_BYTES, ring_segments

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
BUS_FACTOR = {  # nccl-tests: busbw = algbw * factor(N)
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def _check(nbytes, world_size) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r} must be >= 0")


def terms(algorithm: str, nbytes: float, world_size: int, *, itemsize: int = 4,
          segment_bytes: int | None = SEGMENT_BYTES) -> tuple[float, float, float]:
    """(a, b, c) with time = a*alpha + b*beta + c*gamma for an allreduce of `nbytes`."""
    _check(nbytes, world_size)
    n, s = world_size, float(nbytes)
    if n == 1:
        return 0.0, 0.0, 0.0
    if algorithm == "naive":
        return 2 * (n - 1), 2 * (n - 1) * s, (n - 1) * s
    if algorithm == "ring":
        g = ring_segments(int(s // itemsize), n, itemsize, segment_bytes)
        return 2 * (n - 1) * g, 2 * (n - 1) * s / n, (n - 1) / n * s
    if algorithm == "tree":
        k = math.ceil(math.log2(n))
        return 2 * k, 2 * k * s, k * s
    if algorithm == "halving_doubling":
        p = 1 << (n.bit_length() - 1)
        fold = 2 if n != p else 0
        return (2 * math.log2(p) + fold, 2 * (p - 1) / p * s + fold * s,
                (p - 1) / p * s + fold / 2 * s)
    raise ValueError(f"algorithm={algorithm!r} is unknown; choose one of {list(ALGORITHMS)}")


def allreduce_time(algorithm: str, nbytes: float, world_size: int, network: Network, *,
                   gamma: float = 0.0, itemsize: int = 4,
                   segment_bytes: int | None = SEGMENT_BYTES) -> float:
    """Predicted seconds of an allreduce of `nbytes` per rank on `network`.

    `gamma` is seconds per byte reduced (0: arithmetic is free, as in the simulator).
    """
    a, b, c = terms(algorithm, nbytes, world_size, itemsize=itemsize,
                    segment_bytes=segment_bytes)
    return a * network.latency + b / network.bandwidth + c * gamma


def collective_time(op: str, nbytes: float, world_size: int, network: Network) -> float:
    """Seconds of a built-in collective as `Comm` charges and the simulator times it.

    all_reduce: a ring; reduce_scatter / all_gather: one ring phase, `nbytes`
    being the whole (input / output) tensor; broadcast / reduce: a chain of
    N-1 whole messages.
    """
    _check(nbytes, world_size)
    if op not in COLLECTIVES:
        raise ValueError(f"op={op!r} is unknown; choose one of {COLLECTIVES}")
    return ring_seconds(op, nbytes, world_size, network)  # the one model emulation uses too


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
    if op not in BUS_FACTOR:
        raise ValueError(f"op={op!r} is unknown; choose one of {list(BUS_FACTOR)}")
    return algbw(nbytes, seconds) * BUS_FACTOR[op](world_size)


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
