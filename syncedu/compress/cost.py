"""When compression pays: time per step of each compressor from the alpha-beta model.

Top-k and signSGD travel by all-gather, so each rank's traffic grows with N. Compared
against the fp16 baseline, as arXiv 2407.01378 asks; Agarwal et al. (MLSys 2022) found
compression beat a tuned baseline in only 6 of over 200 setups.
"""

from __future__ import annotations

import math

from syncedu.collectives import cost
from syncedu.comm.network import Network

COMPRESSORS = ("fp32", "fp16", "topk", "signsgd", "powersgd")


def wire_seconds(name: str, nbytes: float, world_size: int, network: Network, *,
                 ratio: float = 0.01, powersgd_factor: float = 128.0) -> float:
    """Modelled seconds of `name`'s collective for `nbytes` of fp32 gradients."""
    n = world_size
    if name == "fp32":  # one ring allreduce of S (fp16: of S / 2)
        return cost.collective_time("all_reduce", nbytes, n, network)
    if name == "fp16":
        return cost.collective_time("all_reduce", nbytes / 2, n, network, itemsize=2)
    if name == "powersgd":  # two allreduces (P, then Q), about equal for square matrices
        return 2 * cost.collective_time("all_reduce", nbytes / powersgd_factor / 2, n, network)
    if name == "topk":  # two all-gathers, as topk.py sends them: values, then indices
        k = max(1, math.ceil(ratio * nbytes / 4))
        return 2 * cost.collective_time("all_gather", n * k * 4, n, network)
    if name == "signsgd":  # packed signs, then the scales
        return (cost.collective_time("all_gather", n * math.ceil(nbytes / 4 / 8), n, network,
                                     itemsize=1)
                + cost.collective_time("all_gather", n * 4, n, network))
    raise ValueError(f"name={name!r} is unknown; choose one of {COMPRESSORS}")


def step_seconds(name: str, nbytes: float, world_size: int, network: Network,
                 ms_per_mb: dict, compute_seconds: float = 0.0, **kwargs) -> float:
    """One step: max(backward compute, traffic) + the compressor's own compute.

    Traffic overlaps the backward; the compressor's compute (`ms_per_mb[name]` per MB of
    fp32 gradient, from `python -m syncedu.bench compression`) competes with it: it adds.
    """
    own = ms_per_mb.get(name, 0.0) * 1e-3 * nbytes / 2**20
    return max(compute_seconds, wire_seconds(name, nbytes, world_size, network, **kwargs)) + own


def winners(nbytes: float, world_sizes, bandwidths, latency: float, ms_per_mb: dict,
            compute_seconds: float = 0.0, names=("fp16", "topk", "signsgd", "powersgd"),
            **kwargs) -> list[list[str]]:
    """Fastest of `names` per (world size, bandwidth) cell: rows = world sizes."""
    def fastest(n, bw):
        net = Network(latency=latency, bandwidth=bw)
        return min(names, key=lambda c: step_seconds(c, nbytes, n, net, ms_per_mb,
                                                     compute_seconds, **kwargs))

    return [[fastest(n, bw) for bw in bandwidths] for n in world_sizes]


def dominating_bandwidth(nbytes: float, world_size: int, compute_seconds: float,
                         latency: float = 0.0) -> float:
    """Bandwidth (bytes/s) below which one fp32 allreduce takes longer than the compute.

    Solves the ring's 2(N-1) alpha + 2 (N-1)/N S / B = T_compute for B.
    """
    n = world_size
    room = compute_seconds - 2 * (n - 1) * latency
    if room <= 0:
        return float("inf")
    return 2 * (n - 1) / n * nbytes / room
