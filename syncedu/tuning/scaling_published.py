"""Published scaling results, predicted by the alpha-beta model from inputs stated first.

Every input is fixed from the source's hardware and a published step time *before*
the published efficiency is looked at, one rule for all rows; each `Comparison` asks
`scaling.efficiency`, relative to its base, for:

1. `predicted`: buckets, `timeline.DEFAULT_OVERLAP` of the backward hiding them;
2. `best_case`: buckets, the whole backward available (`overlap=1`);
3. `no_overlap`: every gradient byte after the backward;

then `miss = predicted - published`; `blind` names what the model has no term for.

Sources (their figures are in the rows below): Horovod's docs/benchmarks (128
servers x 4 Pascal GPUs, 25 Gbit/s RoCE, batch 64 per GPU); TensorFlow's benchmarks
page (DGX-1, P100, batch 64, May 2017: the 1-GPU rates); Goyal et al. 2017 (servers
of 8 P100 with NVLink, 50 Gbit/s Ethernet, ~120 ms backward); PyTorch's DDP benchmark
(benchmarks/distributed/ddp/README.md: DGX machines of 8 V100, "4x 100Gb InfiniBand
per machine", ResNet-50, batch 32 per GPU); parameter counts: torchvision / Keras.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncedu.comm.network import Network
from syncedu.dp import timeline
from syncedu.tuning import scaling

MB = 2 ** 20
PCIE3 = Network(latency=5e-6, bandwidth=12e9, name="pcie3_x16")
ROCE_25G = Network(latency=5e-6, bandwidth=25e9 / 8, name="roce_25g")
NVLINK_P100 = Network(latency=5e-6, bandwidth=40e9, name="nvlink_p100")
NVLINK_V100 = Network(latency=5e-6, bandwidth=100e9, name="nvlink_v100")
ETH_50G = Network(latency=10e-6, bandwidth=50e9 / 8, name="ethernet_50g")
IB_4X100G = Network(latency=2e-6, bandwidth=4 * 100e9 / 8, name="4x_ib_100g")


@dataclass(frozen=True)
class Comparison:
    """One published scaling result and the model's prediction of it (module docstring)."""

    name: str
    source: str
    params: float  # parameters of the model (fp32 gradients: 4 bytes each)
    compute_seconds: float  # published per-GPU step time
    world_size: int
    network: Network
    bucket_bytes: float  # the framework's bucket / fusion buffer
    published: float
    blind: str  # what the model has no term for, in this row
    base_world_size: int = 1
    base_network: Network | None = None

    def _eff(self, **options) -> float:
        """Efficiency at (world_size, network) relative to the base (e.g. 8 -> 256 GPUs)."""
        s, c, base = 4 * self.params, self.compute_seconds, self.base_network or self.network
        return (scaling.efficiency(s, c, self.world_size, self.network, **options)
                / scaling.efficiency(s, c, self.base_world_size, base, **options))

    @property
    def predicted(self) -> float:
        """Step 1: the point prediction (buckets, the lesson's default overlap)."""
        return self._eff(overlap=timeline.DEFAULT_OVERLAP, bucket_bytes=self.bucket_bytes)

    @property
    def best_case(self) -> float:
        """Step 2: buckets, the whole backward available to hide them."""
        return self._eff(overlap=1.0, bucket_bytes=self.bucket_bytes)

    @property
    def no_overlap(self) -> float:
        """Step 3: every byte after the backward."""
        return self._eff(overlap=0.0)

    @property
    def miss(self) -> float:
        """predicted - published (positive: the model is optimistic)."""
        return self.predicted - self.published

    @property
    def bracketed(self) -> bool:
        """Whether the published figure lies between no_overlap and best_case."""
        return self.no_overlap - 1e-9 <= self.published <= self.best_case + 1e-9

    def inputs(self) -> str:
        """The inputs, one line, stated before anything is compared."""
        base = f"{self.base_world_size} GPU{'s' if self.base_world_size > 1 else ''}"
        return (f"{self.name:<34} {self.params / 1e6:6.1f} M params, "
                f"{self.compute_seconds * 1e3:5.1f} ms/step, {base} -> {self.world_size}, "
                f"{self.network.name}, buckets {self.bucket_bytes / MB:g} MB")

    def row(self) -> dict:
        """The comparison as a dict of rounded values (one table row)."""
        return {"result": self.name, "GPUs": self.world_size, "published": self.published,
                "predicted": round(self.predicted, 3), "best case": round(self.best_case, 3),
                "no overlap": round(self.no_overlap, 3), "miss": round(self.miss, 3),
                "bracketed": self.bracketed, "model cannot see": self.blind}


def _horovod(name: str, params: float, images_per_s: float, published: float,
             blind: str) -> Comparison:
    net = Network.cluster(128, 4, intra=PCIE3, inter=ROCE_25G)
    return Comparison(name=f"Horovod, {name}", source="Horovod docs/benchmarks",
                      params=params, compute_seconds=64 / images_per_s, world_size=512,
                      network=net, bucket_bytes=64 * MB, published=published, blind=blind)


_HOROVOD_BLIND = ("Horovod's fusion cycle and negotiation, stragglers, RoCE below line rate; "
                  "the 1-GPU base is TensorFlow's DGX-1 figure, another machine")


def published_comparisons() -> list[Comparison]:
    """The published scaling results of lesson 09 (six rows), each with the prediction."""
    dgx1 = Network.cluster(1, 8, intra=NVLINK_V100)
    return [
        _horovod("Inception V3", 23.8e6, 142, 0.90, _HOROVOD_BLIND),
        _horovod("ResNet-101", 44.5e6, 1656.82 / 16, 0.90,
                 _HOROVOD_BLIND + "; the step time is the 16-GPU run's (it holds some comm)"),
        _horovod("VGG-16", 138.4e6, 154, 0.68,
                 _HOROVOD_BLIND + "; VGG's gradients sit in a few huge FC layers at the end"),
        Comparison(name="Goyal et al., ResNet-50 8->256", source="Goyal et al. 2017",
                   params=25.6e6, compute_seconds=0.120 / timeline.BACKWARD_SHARE,
                   world_size=256, network=Network.cluster(32, 8, intra=NVLINK_P100,
                                                           inter=ETH_50G),
                   bucket_bytes=25 * MB, published=0.90, base_world_size=8,
                   base_network=NVLINK_P100,
                   blind="their allreduce (reduce in a server, halving-doubling across) and "
                         "its overlap; Ethernet below line rate"),
        Comparison(name="PyTorch DDP, ResNet-50 1->8", source="PyTorch DDP benchmark README",
                   params=25.6e6, compute_seconds=32 / 329, world_size=8, network=dgx1,
                   bucket_bytes=25 * MB, published=round(307 / 329, 3),
                   blind="DDP's own overhead: 1 GPU with DDP already runs 319/s against 329/s "
                         "without; NCCL kernels contending with the backward"),
        Comparison(name="PyTorch DDP, ResNet-50 8->16", source="PyTorch DDP benchmark README",
                   params=25.6e6, compute_seconds=32 / 329, world_size=16,
                   network=Network.cluster(2, 8, intra=NVLINK_V100, inter=IB_4X100G),
                   bucket_bytes=25 * MB, published=round(306 / 307, 3), base_world_size=8,
                   base_network=dgx1,
                   blind="little: from 8 to 16 GPUs the network is the only new cost, "
                         "and it has that"),
    ]
