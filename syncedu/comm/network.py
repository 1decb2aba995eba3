"""`Network`: a small, validated model of the wires between ranks.

The alpha-beta model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005): a
message of n bytes takes

    t(n) = alpha + n / bandwidth          (alpha = latency, 1/bandwidth = beta)

`Network.cluster(nodes, gpus_per_node, intra, inter)` builds a hierarchical
one (cluster.py); the formulas for every collective are in alphabeta.py.
On top of it: per-rank `slowdown` factors that multiply each rank's compute time
(stragglers), seeded `jitter` (extra delay drawn uniformly in [0, jitter) s per
message) and `loss` (each message is lost with that probability and resent after
`retransmit` seconds). The simulator uses it for its logical clock; on real
processes the launcher's comm waits as the model says (emulation).

Presets (`Network.preset(name)`, listed in `PRESETS`) are round figures for one
link, one direction, from public specifications:

- nvlink4: NVIDIA H100 SXM datasheet, NVLink 900 GB/s per GPU both ways -> 450 GB/s.
- infiniband_ndr: InfiniBand NDR, 400 Gb/s per port -> 50 GB/s; ~2 us end to end.
- ethernet_100g: 100 GbE -> 12.5 GB/s; ~10 us through a TCP/RoCE stack.
- ethernet_10g: 10 GbE -> 1.25 GB/s; ~50 us.
- ethernet_1g: 1 GbE -> 125 MB/s; ~100 us.
- wan: a cross-region link, ~1 Gb/s usable and ~40 ms one way.
- loopback: roughly Gloo over loopback on a laptop (~1 GB/s, ~50 us).

Used in: notebooks/00_start_here, 02_allreduce_algorithms, 04_parameter_server, 09_tuning_playbook.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Network:
    """Latency (s), bandwidth (bytes/s), stragglers, jitter and loss of a network.

    Example: `Network(latency=50e-6, bandwidth=1.25e9, slowdown=[1, 1, 1, 3])`
    is a 10 GbE cluster of four ranks whose rank 3 computes three times slower.
    """

    latency: float = 0.0
    bandwidth: float = math.inf
    slowdown: tuple[float, ...] | None = None
    jitter: float = 0.0
    loss: float = 0.0
    retransmit: float = 0.2
    seed: int = 0
    name: str = "custom"

    def __post_init__(self) -> None:
        # Accept any sequence for slowdown, store a tuple so the object stays hashable.
        if self.slowdown is not None:
            try:
                object.__setattr__(self, "slowdown", tuple(float(s) for s in self.slowdown))
            except TypeError:
                raise ValueError("slowdown must be a list of per-rank factors or None") from None
            if not self.slowdown or any(not s > 0 or math.isinf(s) for s in self.slowdown):
                raise ValueError(f"slowdown={list(self.slowdown)} must be finite factors > 0, "
                                 "one per rank")
        _check(self.latency >= 0 and math.isfinite(self.latency), "latency",
               self.latency, "a finite number of seconds >= 0")
        _check(self.bandwidth > 0, "bandwidth", self.bandwidth, "bytes per second > 0")
        _check(0 <= self.jitter < math.inf, "jitter", self.jitter, "seconds >= 0")
        _check(0 <= self.loss < 1, "loss", self.loss, "a probability in [0, 1)")
        _check(0 <= self.retransmit < math.inf, "retransmit", self.retransmit, "seconds >= 0")
        _check(isinstance(self.seed, int), "seed", self.seed, "an int")

    # ------------------------------------------------------------- model
    def transfer_time(self, nbytes: int) -> float:
        """alpha + n * beta: seconds one message of `nbytes` takes on one link."""
        return self.latency + nbytes / self.bandwidth

    # A flat network is one node: every rank is local, every message takes this link.
    is_cluster = False

    def node_of(self, rank: int) -> int:
        return 0

    def local_rank_of(self, rank: int) -> int:
        return rank

    def local_world_size_of(self, rank: int, world_size: int) -> int:
        return world_size

    def link(self, src: int, dst: int) -> Network:
        """The flat network a message from `src` to `dst` travels on (here: this one)."""
        return self

    @classmethod
    def cluster(cls, nodes: int, gpus_per_node: int, intra="nvlink4", inter="infiniband_ndr",
                nics_per_node: int = 1, **changes) -> Network:
        """A hierarchical network of `nodes` x `gpus_per_node` ranks (see cluster.py).

        `intra` (inside a node) and `inter` (between nodes) are `Network`s or preset
        names; `changes` sets the other fields (slowdown, jitter, loss, seed, name).
        """
        from .cluster import Cluster  # cluster.py builds on this module

        return Cluster(nodes=nodes, gpus_per_node=gpus_per_node, intra=intra, inter=inter,
                       nics_per_node=nics_per_node, **changes)

    def slowdown_of(self, rank: int) -> float:
        """Compute slowdown of `rank` (1.0 when no slowdown was given)."""
        if self.slowdown is None:
            return 1.0
        if rank >= len(self.slowdown):
            raise ValueError(f"slowdown has {len(self.slowdown)} entries but rank {rank} "
                             "exists: give one factor per rank")
        return self.slowdown[rank]

    def check_world_size(self, world_size: int) -> None:
        """Raise `ValueError` if `slowdown` does not have one entry per rank."""
        if self.slowdown is not None and len(self.slowdown) != world_size:
            raise ValueError(f"slowdown has {len(self.slowdown)} entries; world_size is "
                             f"{world_size}: give one factor per rank")

    def noise(self, rng: random.Random) -> float:
        """Extra delay of one message: jitter plus, if it is lost, a retransmit."""
        extra = rng.uniform(0.0, self.jitter) if self.jitter else 0.0
        if self.loss and rng.random() < self.loss:
            extra += self.retransmit
        return extra

    def rng(self, rank: int) -> random.Random:
        """A per-rank random stream, so runs repeat exactly for a given seed."""
        return random.Random(self.seed * 1_000_003 + rank)

    @property
    def deterministic(self) -> bool:
        return not self.jitter and not self.loss

    # ----------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **changes) -> Network:
        """A named network (see `PRESETS`), optionally with fields changed."""
        if name not in PRESETS:
            raise ValueError(f"network preset {name!r} is unknown; choose one of {sorted(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **changes)

    def replace(self, **changes) -> Network:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        bw = self.bandwidth
        bw_s = "inf" if math.isinf(bw) else f"{bw / 1e9:g} GB/s"
        return f"{self.name}: latency {self.latency * 1e6:g} us, bandwidth {bw_s}"


def _check(ok: bool, field: str, value, allowed: str) -> None:
    if not ok:
        raise ValueError(f"Network.{field}={value!r} is invalid: must be {allowed}")


PRESETS: dict[str, Network] = {
    p.name: p
    for p in [
        Network(latency=2e-6, bandwidth=450e9, name="nvlink4"),
        Network(latency=2e-6, bandwidth=50e9, name="infiniband_ndr"),
        Network(latency=10e-6, bandwidth=12.5e9, name="ethernet_100g"),
        Network(latency=50e-6, bandwidth=1.25e9, name="ethernet_10g"),
        Network(latency=100e-6, bandwidth=125e6, name="ethernet_1g"),
        Network(latency=40e-3, bandwidth=125e6, name="wan"),
        Network(latency=50e-6, bandwidth=1e9, name="loopback"),
    ]
}
