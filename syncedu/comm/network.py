"""`Network`: a small, validated model of the wires between ranks.

The alpha-beta model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005): a message of n
bytes takes latency + n / bandwidth (alphabeta.py), plus per-rank `slowdown` of compute,
seeded `jitter` and `loss`. `Network.cluster(...)`: consecutive ranks share a node (as
torchrun numbers them; `placement=` puts rank r in slot placement[r] instead, node-major); a
message between nodes uses `inter` and a NIC of each node, which carries one message's
bytes at a time (`nics="per_gpu"`: a rail-optimized DGX H100).
The simulator's assumptions are named fields:

- `latency_model`: "port" holds the sender's port for latency + n / bandwidth (k messages
  cost k (alpha + n beta)); "wire" makes latency a delay off the port (alpha + k n beta),
  as in LogGP (Alexandrov et al. 1995) and NCCL (collectives/nccl_model.py);
- `eager_limit`: a larger send's `wait()` returns once the matching receive is posted, so
  an unsafe exchange deadlocks. The default, "gloo" (0 bytes), is Gloo's rule: its TCP
  `Pair::send` transmits only once the peer has posted the receive, at every size (NCCL
  too: concurrent sends and receives must be grouped). "open_mpi" is 64 KiB, Open MPI's
  `btl_tcp_eager_limit`: below it an MPI send is copied out and returns at once;
- `builtin_algorithm`: broadcast and reduce as a "ring" chain or "binomial" trees (MPICH's
  choice for short messages, Thakur et al. 2005).

`PRESETS`: one link, one direction, from public specifications (nvlink4: H100 SXM, 900 GB/s
both ways; infiniband_ndr: 400 Gb/s; wan: ~40 ms one way).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import random
from dataclasses import dataclass

LATENCY_MODELS = ("port", "wire")
BUILTIN_ALGORITHMS = ("ring", "binomial")
EAGER_LIMITS = {"gloo": 0, "nccl": 0, "open_mpi": 64 * 1024}  # bytes sent without a receive


@dataclass(frozen=True)
class Network:
    """Latency (s), bandwidth (bytes/s), stragglers, jitter and loss of a network.

    Args:
        latency: seconds per message, alpha (default 0.0).
        bandwidth: bytes per second of one link in one direction, 1/beta (default inf).
        slowdown: one factor per rank multiplying its compute time (stragglers; default
            None). Charged through the comm's compute hook on simulated ranks, waited out on
            real ones.
        jitter: up to this many seconds added to a message at random (default 0.0).
        loss: probability a message is lost and resent after `retransmit` s (default 0.0).
        retransmit: seconds a lost message costs (default 0.2).
        seed: seeds jitter and loss, per rank (default 0).
        name: shown by `describe()` and in figures (default "custom").
        latency_model: "port" (default) or "wire", see the module docstring.
        eager_limit: bytes above which a send waits for its receive, or a named rule from
            EAGER_LIMITS (default "gloo": 0 bytes, every send waits; "open_mpi": 64 KiB).
        builtin_algorithm: how simulated broadcast/reduce run: "ring" (default) or "binomial".
    """

    latency: float = 0.0
    bandwidth: float = math.inf
    slowdown: tuple[float, ...] | None = None
    jitter: float = 0.0
    loss: float = 0.0
    retransmit: float = 0.2
    seed: int = 0
    name: str = "custom"
    latency_model: str = "port"
    eager_limit: float | str = "gloo"
    builtin_algorithm: str = "ring"

    def __post_init__(self) -> None:
        if self.slowdown is not None:  # any sequence, stored as a tuple (hashable)
            try:
                object.__setattr__(self, "slowdown", tuple(float(s) for s in self.slowdown))
            except TypeError:
                raise ValueError("slowdown must be a list of per-rank factors or None") from None
            if not self.slowdown or any(not s > 0 or math.isinf(s) for s in self.slowdown):
                raise ValueError(f"slowdown={list(self.slowdown)} must be finite factors > 0, "
                                 "one per rank")
        for name in ("latency", "bandwidth", "jitter", "loss", "retransmit"):  # "1e-6" too:
            value = getattr(self, name)  # a ValueError naming the field, not a TypeError
            _check(isinstance(value, numbers.Real) and not isinstance(value, bool), name,
                   value, "a number")
        _check(self.latency >= 0 and math.isfinite(self.latency), "latency",
               self.latency, "a finite number of seconds >= 0")
        _check(self.bandwidth > 0, "bandwidth", self.bandwidth, "bytes per second > 0")
        _check(0 <= self.jitter < math.inf, "jitter", self.jitter, "seconds >= 0")
        _check(0 <= self.loss < 1, "loss", self.loss, "a probability in [0, 1)")
        _check(0 <= self.retransmit < math.inf, "retransmit", self.retransmit, "seconds >= 0")
        _check(isinstance(self.seed, int), "seed", self.seed, "an int")
        _check(self.latency_model in LATENCY_MODELS, "latency_model", self.latency_model,
               f"one of {LATENCY_MODELS}")
        if isinstance(self.eager_limit, str):  # a named rule
            object.__setattr__(self, "eager_limit", EAGER_LIMITS.get(*[self.eager_limit] * 2))
        _check(not isinstance(self.eager_limit, bool) and isinstance(self.eager_limit, (int, float))
               and self.eager_limit >= 0, "eager_limit", self.eager_limit,
               "a number of bytes >= 0 (math.inf: every send is eager) or one of "
               f"{sorted(EAGER_LIMITS)}")
        _check(self.builtin_algorithm in BUILTIN_ALGORITHMS, "builtin_algorithm",
               self.builtin_algorithm, f"one of {BUILTIN_ALGORITHMS}")

    def transfer_time(self, nbytes: int) -> float:
        """alpha + n * beta: seconds one message of `nbytes` takes on one link."""
        return self.latency + nbytes / self.bandwidth

    # A flat network is one node: every rank is local, every message takes this link.
    is_cluster = False

    def node_of(self, rank: int) -> int:
        """The node `rank` sits on: 0 on a flat network (one node holds every rank)."""
        return 0

    def local_rank_of(self, rank: int) -> int:
        """`rank`'s index inside its node: the rank itself on a flat network."""
        return rank

    def local_world_size_of(self, rank: int, world_size: int) -> int:
        """Ranks on `rank`'s node: all `world_size` of them on a flat network."""
        return world_size

    def link(self, src: int, dst: int) -> Network:
        """The flat network a message from `src` to `dst` travels on (here: this one)."""
        return self

    @classmethod
    def cluster(cls, nodes: int, gpus_per_node: int, intra="nvlink4", inter="infiniband_ndr",
                nics_per_node: int = 1, nics: str | None = None, **changes) -> Network:
        """A `Cluster`; `intra`/`inter`: `Network`s or preset names; `nics`: per_node/per_gpu."""
        if nics is not None and nics not in NICS:
            raise ValueError(f"Network.cluster: nics={nics!r} must be one of {NICS} or None")
        if nics is not None:
            nics_per_node = gpus_per_node if nics == "per_gpu" else 1
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
        """True when no message is delayed at random (no jitter, no loss)."""
        return not self.jitter and not self.loss

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
        """One line for a figure or a print: name, latency in us, bandwidth in GB/s."""
        bw = "inf" if math.isinf(self.bandwidth) else f"{self.bandwidth / 1e9:g} GB/s"
        return f"{self.name}: latency {self.latency * 1e6:g} us, bandwidth {bw}"


NICS = ("per_node", "per_gpu")  # one NIC per node, shared by its GPUs; one per GPU


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


@dataclass(frozen=True)
class Cluster(Network):
    """`nodes` x `gpus_per_node` ranks; `intra` links inside a node, `inter` between nodes."""

    nodes: int = 1
    gpus_per_node: int = 1
    intra: Network | str = "nvlink4"
    inter: Network | str = "infiniband_ndr"
    nics_per_node: int = 1
    placement: tuple[int, ...] | None = None  # rank r runs in slot placement[r] (None: r)

    def __post_init__(self) -> None:
        if self.placement is not None:  # slots are node-major: slot // gpus_per_node
            object.__setattr__(self, "placement", tuple(self.placement))
            _check(sorted(self.placement) == list(range(self.nodes * self.gpus_per_node)),
                   "placement", self.placement, "a permutation of range(nodes * gpus_per_node)")
        for field in ("nodes", "gpus_per_node", "nics_per_node"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Network.cluster: {field}={value!r} is invalid: must be an "
                                 "int >= 1")
        if self.nics_per_node > self.gpus_per_node:
            raise ValueError(f"Network.cluster: nics_per_node={self.nics_per_node} must be "
                             f"<= gpus_per_node={self.gpus_per_node}")
        for field in ("intra", "inter"):
            object.__setattr__(self, field, _link(field, getattr(self, field)))
        object.__setattr__(self, "latency", self.inter.latency)
        object.__setattr__(self, "bandwidth", self.inter.bandwidth)
        if self.name == "custom":
            object.__setattr__(self, "name", f"cluster {self.nodes}x{self.gpus_per_node} "
                                             f"({self.intra.name} / {self.inter.name})")
        super().__post_init__()

    is_cluster = True

    @property
    def world_size(self) -> int:
        """nodes x gpus_per_node: the one world size this cluster fits."""
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        """The node of `rank`: its slot // gpus_per_node (slot = placement[rank], or rank:
        consecutive ranks share a node)."""
        return (self.placement[rank] if self.placement else rank) // self.gpus_per_node

    def local_rank_of(self, rank: int) -> int:
        """`rank`'s index inside its node (slot % gpus_per_node), torchrun's LOCAL_RANK."""
        return (self.placement[rank] if self.placement else rank) % self.gpus_per_node

    def local_world_size_of(self, rank: int, world_size: int) -> int:
        """Ranks per node (gpus_per_node), torchrun's LOCAL_WORLD_SIZE."""
        return self.gpus_per_node

    def nic_of(self, rank: int) -> int:
        """The NIC (0..nics_per_node-1) this rank's messages between nodes go through."""
        return self.local_rank_of(rank) % self.nics_per_node

    def link(self, src: int, dst: int) -> Network:
        """The link a message from `src` to `dst` takes: `intra` inside a node, else `inter`."""
        return self.intra if self.node_of(src) == self.node_of(dst) else self.inter

    def check_world_size(self, world_size: int) -> None:
        """Raise `ValueError` unless `world_size` is nodes x gpus_per_node (and `slowdown` fits)."""
        if world_size != self.world_size:
            raise ValueError(f"Network.cluster has nodes={self.nodes} x gpus_per_node="
                             f"{self.gpus_per_node} = {self.world_size} ranks but world_size="
                             f"{world_size}: nodes * gpus_per_node must equal world_size")
        super().check_world_size(world_size)

    def describe(self) -> str:
        """One line: nodes, ranks and NICs per node, then each link's own description."""
        return (f"{self.name}: {self.nodes} nodes x {self.gpus_per_node} ranks, "
                f"{self.nics_per_node} NIC(s) per node; inside {self.intra.describe()}; "
                f"between {self.inter.describe()}")


def _link(field: str, value) -> Network:
    if isinstance(value, str):
        if value not in PRESETS:
            raise ValueError(f"Network.cluster: {field}={value!r} is not a known preset; "
                             f"choose one of {sorted(PRESETS)} or pass a Network")
        return PRESETS[value]
    if isinstance(value, Cluster) or not isinstance(value, Network):
        raise ValueError(f"Network.cluster: {field} must be a flat Network or a preset name "
                         f"({sorted(PRESETS)}), got {value!r}")
    return value
