"""NCCL's own prediction of an all-reduce's time: a port of its tuning model.

NCCL picks an algorithm (ring, tree) and a protocol (LL, LL128, Simple) per call
by predicting each one's time (`ncclTopoTuneModel`, `ncclTopoGetAlgoTime` in
`src/graph/tuning.cc`). This is that model for all-reduce, written from the source
of NCCL 2.30.7 (github.com/NVIDIA/nccl, commit 5067397c); microseconds and GB/s.

1. Bus bandwidth: `n_channels` x the per-channel bandwidth (`bw_intra` up to 2
   nodes, `bw_inter` beyond), capped per protocol and algorithm.
2. Algorithm bandwidth: a ring's busBw x nRanks / (2 (nRanks - 1)); a tree's half.
3. Latency: a base latency plus a hardware latency per hop: a ring makes
   2 (nRanks - 1) hops, 2 (nNodes - 1) of them across the network; a tree
   2 ((nRanks / nNodes - 1) + log2(nNodes)).
4. Time: latency + bytes / (1000 x algBw), with the ring's plateau (Simple,
   several nodes) and the tree's per-size correction factors.

So NCCL charges a ring's latency once per hop, not per message at each sender's port
(`Network(latency_model="wire")`). Out of scope: NVLS, CollNet, PAT, pipelined ops.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from syncedu.comm.runs import check_choice, check_int

ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper", "blackwell")  # NCCL's compute-capability index

# The tables are numbers copied from tuning.cc (NCCL 2.30.7), so they live in the data file
# nccl_tuning.json beside this module, by these names in lower case:
_TABLES = json.loads(Path(__file__).with_name("nccl_tuning.json").read_text("utf-8"))
# ncclTunerConstantsDefaults, per protocol (LL, LL128, Simple): BASE_LATENCY[algorithm] in us;
# HW_LATENCY[hardware of the hop: "nvlink", "pci", "net"][algorithm], us per hop.
BASE_LATENCY, HW_LATENCY = _TABLES["base_latency"], _TABLES["hw_latency"]
# Indexed [arch][nodes index: 1, 2, >2 nodes]; llMaxBws' first index is the arch on
# one node and the CPU (0 Intel, 1 AMD) on several.
LL_MAX_BW, PER_CH_MAX_TREE_BW = _TABLES["ll_max_bw"], _TABLES["per_ch_max_tree_bw"]
PER_CH_MAX_RING_LL128_BW = _TABLES["per_ch_max_ring_ll128_bw"]
PER_CH_MAX_TREE_LL128_BW = _TABLES["per_ch_max_tree_ll128_bw"]
# ncclTopoGetAlgoTime's treeCorrectionFactor[protocol][log2(bytes / 64)], 0..22 used.
TREE_CORRECTION = _TABLES["tree_correction"]
NET_OVERHEAD = _TABLES["net_overhead"]  # us, getNetOverhead (other CPUs: 1.0)


@dataclass(frozen=True)
class NcclSystem:
    """What NCCL's tuning model reads about a system (GB/s per channel, us)."""

    n_ranks: int
    n_nodes: int = 1
    bw_intra: float = 20.0
    bw_inter: float = 20.0
    n_channels: int = 2
    arch: str = "hopper"
    intra: str = "nvlink"  # "nvlink" or "pci": the links inside a node
    cpu: str = "intel"  # "intel" or "amd"
    latency_inter: float = 0.0  # the graph's latencyInter (us), 0 on plain InfiniBand
    tree_pattern: bool = False  # NCCL_TOPO_PATTERN_TREE: tree bandwidth x 0.85

    def __post_init__(self) -> None:
        rules = {  # field: (valid, what is allowed)
            "n_ranks": (isinstance(self.n_ranks, int) and self.n_ranks >= 2, "an int >= 2"),
            "n_nodes": (isinstance(self.n_nodes, int) and 1 <= self.n_nodes <= self.n_ranks
                        and self.n_ranks % self.n_nodes == 0, "an int dividing n_ranks"),
            "bw_intra": (self.bw_intra > 0, "GB/s > 0"),
            "bw_inter": (self.bw_inter > 0, "GB/s > 0"),
            "n_channels": (isinstance(self.n_channels, int) and self.n_channels > 0, "an int >= 1"),
            "arch": (self.arch in ARCHS, f"one of {ARCHS}"),
            "intra": (self.intra in ("nvlink", "pci"), "'nvlink' or 'pci'"),
            "cpu": (self.cpu in NET_OVERHEAD, f"one of {tuple(NET_OVERHEAD)}"),
            "latency_inter": (self.latency_inter >= 0, "us >= 0")}
        for name, (good, allowed) in rules.items():
            if not good:
                raise ValueError(f"NcclSystem.{name}={getattr(self, name)!r} is invalid: must "
                                 f"be {allowed}")


def _log2i(x: int) -> int:
    return x.bit_length() - 1  # floor(log2 x); -1 for 0


def bandwidth(sys: NcclSystem, algorithm: str, protocol: str) -> float:
    """Steps 1-2: the algorithm bandwidth (GB/s) NCCL assumes for an all-reduce."""
    _check(algorithm, protocol)
    p, a = PROTOCOLS.index(protocol), ARCHS.index(sys.arch)
    nodes_i = sys.n_nodes - 1 if sys.n_nodes <= 2 else 2
    ll_i = a if sys.n_nodes == 1 else (1 if sys.cpu == "amd" else 0)
    ll_max = LL_MAX_BW[ll_i][nodes_i]
    bus = sys.n_channels * (sys.bw_intra if sys.n_nodes <= 2 else sys.bw_inter)
    if algorithm == "ring":
        if p == 0:
            bus = min(ll_max, bus * 0.5)
        elif p == 1:
            bus = min(bus * 0.92, sys.n_channels * PER_CH_MAX_RING_LL128_BW[a][nodes_i])
        return bus * sys.n_ranks / (2 * (sys.n_ranks - 1))
    bus = min(bus * 0.92, sys.n_channels * PER_CH_MAX_TREE_BW[a][nodes_i])
    if p == 0:
        bus = min(bus / 3.8, ll_max)
    elif p == 1:
        bus = min(bus * (7.0 / 9.0 if sys.n_nodes == 1 else 120.0 / 128.0),
                  sys.n_channels * PER_CH_MAX_TREE_LL128_BW[a][nodes_i])
    if sys.tree_pattern:
        bus *= 0.85
    return bus * 0.5


def latency(sys: NcclSystem, algorithm: str, protocol: str) -> float:
    """Step 3: the latency (us) NCCL assumes for one all-reduce."""
    _check(algorithm, protocol)
    p = PROTOCOLS.index(protocol)
    ppn = sys.n_ranks // sys.n_nodes
    intra = HW_LATENCY[sys.intra][algorithm][p]
    inter = HW_LATENCY["net"]["tree" if ppn == 1 else algorithm][p] + sys.latency_inter
    if protocol == "Simple":
        inter += sys.latency_inter  # the flush
    lat = BASE_LATENCY[algorithm][p]
    if algorithm == "tree":
        return lat + 2 * ((ppn - 1) * intra + _log2i(sys.n_nodes) * inter)
    if sys.n_nodes > 1:
        overhead = NET_OVERHEAD[sys.cpu] * (3 if protocol == "Simple" else 1)
        intra = max(intra, overhead)
    steps = 2 * (sys.n_ranks - 1)
    inter_steps = 0 if sys.n_nodes == 1 else 2 * (sys.n_nodes - 1)
    return lat + (steps - inter_steps) * intra + inter_steps * inter


def predict(sys: NcclSystem, nbytes: int, algorithm: str = "ring",
            protocol: str = "Simple") -> float:
    """Step 4: NCCL's predicted all-reduce time of `nbytes` bytes, in seconds."""
    check_int("nbytes", nbytes, 0)
    bw, lat = bandwidth(sys, algorithm, protocol), latency(sys, algorithm, protocol)
    p = PROTOCOLS.index(protocol)
    log_size = _log2i(nbytes >> 6)
    if algorithm == "tree" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[p][log_size]
    if (algorithm == "ring" and protocol == "Simple" and sys.n_nodes > 1
            and nbytes // (sys.n_channels * sys.n_ranks) >= 64):
        lat *= 1.4 if ARCHS.index(sys.arch) >= 1 else 1.9  # the ring's plateau
    return (lat + nbytes / (1000 * bw)) * 1e-6


def table(sys: NcclSystem, nbytes: int) -> dict[tuple[str, str], float]:
    """{(algorithm, protocol): seconds} for every pair; NCCL would take the fastest."""
    return {(a, p): predict(sys, nbytes, a, p) for a in ALGORITHMS for p in PROTOCOLS}


def best(sys: NcclSystem, nbytes: int) -> tuple[str, str, float]:
    """(algorithm, protocol, seconds) of the fastest prediction."""
    (a, p), t = min(table(sys, nbytes).items(), key=lambda kv: kv[1])
    return a, p, t


def from_network(network, n_channels: int | None = None, **changes) -> NcclSystem:
    """An `NcclSystem` for a `Network.cluster` (our mapping, not NCCL's topology search):
    `n_channels` (default max(2, nics_per_node)) share the intra and the NICs' bandwidth."""
    if not network.is_cluster:
        raise ValueError("from_network needs a Network.cluster(...) (a flat Network has no "
                         "nodes to map onto NCCL's); build an NcclSystem directly")
    nodes, nics = network.nodes, network.nics_per_node
    ch = n_channels or max(2, nics)
    base = dict(n_ranks=nodes * network.gpus_per_node, n_nodes=nodes,
                bw_intra=network.intra.bandwidth / 1e9 / ch,
                bw_inter=nics * network.inter.bandwidth / 1e9 / ch, n_channels=ch)
    base.update(changes)
    return NcclSystem(**base)


def _check(algorithm: str, protocol: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} must be one of {ALGORITHMS} (NVLS, CollNet "
                         "and PAT are out of scope: see the module docstring)")
    check_choice("protocol", protocol, PROTOCOLS)

