"""When compression pays: time per step of each compressor from the alpha-beta model, and
`timed`, which measures a compressor's own compute (`Alone`) or its step on real ranks.

Top-k and signSGD travel by all-gather, so each rank's traffic grows with N; 1-bit Adam's
compressed allreduce ("onebit") does not. Compared
against the fp16 baseline, as arXiv 2407.01378 asks; Agarwal et al. (MLSys 2022) found
compression beat a tuned baseline in only 6 of over 200 setups.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from syncedu.collectives import cost
from syncedu.comm.network import Network
from syncedu.train.compression import resolve

COMPRESSORS = ("fp32", "fp16", "topk", "signsgd", "powersgd", "onebit")


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
    if name == "onebit":  # 1-bit Adam's: N chunks of signs + a scale, scattered, then gathered
        return 2 * cost.collective_time("all_gather", n * (math.ceil(nbytes / 4 / 8 / n) + 4), n,
                                        network, itemsize=1)
    raise ValueError(f"name={name!r} is unknown; choose one of {COMPRESSORS}")


def step_seconds(name: str, nbytes: float, world_size: int, network: Network,
                 ms_per_mb: dict, compute_seconds: float = 0.0, **kwargs) -> float:
    """One step: max(backward compute, traffic) + the compressor's own compute.

    Traffic overlaps the backward; the compressor's compute (`ms_per_mb[name]` per MB of
    fp32 gradient: `timed(Alone(), ...)`'s seconds per call over the MB) competes with it:
    it adds.
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


class Alone:
    """A one-rank stand-in for a `Comm` with no traffic: a compressor's compute alone."""

    rank, world_size, backend = 0, 1, "none"

    def all_reduce(self, t, op="sum"):
        """One rank: the sum is the tensor itself."""
        return t

    def all_gather(self, out, t):
        """One rank: gathering copies the tensor into the only slot."""
        out[0].copy_(t)
        return out

    def barrier(self):
        """One rank: nobody to wait for."""
        pass


def average(comm, spec, t: torch.Tensor) -> None:
    """Average `t` over the ranks with compressor `spec` (None: the fp32 allreduce)."""
    c = resolve(spec)
    if c is None:
        comm.all_reduce(t, op="avg")
    else:
        c.average_(comm, [t], key="timed")


def timed(comm, specs: dict, shape, repeats: int, rounds: int) -> dict:
    """Median seconds per `average` of each spec (name -> spec) on one `shape` gradient, the
    rounds alternating the specs (wall clock: `Alone()` times the compute alone)."""
    g = torch.Generator().manual_seed(comm.rank)
    grad = torch.randn(*shape, generator=g)
    specs = {name: resolve(spec) for name, spec in specs.items()}
    for c in specs.values():
        if c is not None:
            c.reset()  # a new size: no residual or warm start from the last one
    times = {name: [] for name in specs}
    for r in range(rounds + 1):  # round 0 warms up (allocator, first collective)
        for name, c in specs.items():
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(repeats):
                average(comm, c, grad.clone())
            if r:
                times[name].append((time.perf_counter() - t0) / repeats)
    return {name: statistics.median(v) for name, v in times.items()}
