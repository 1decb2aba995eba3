"""Published scaling results beside the alpha-beta model's prediction of them.

Each row takes a published efficiency and the inputs that produced it: the
model's parameter count (fp32 gradients, 4 bytes each), a published per-GPU
step time, and the cluster's network, then asks `scaling.efficiency` for:

- `no_overlap`: every gradient byte sent after the backward (a lower bound);
- `predicted`: the framework's buckets (fusion buffer) sent as the backward
  produces them, the model's point prediction;

and checks the published figure against the stated `band` around the
prediction. `note` says why they differ where they do.

Sources (cite these, not this file):
- Horovod, docs/benchmarks: 128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE,
  tf_cnn_benchmarks at batch 64 per GPU: 90% for Inception V3 and ResNet-101,
  68% for VGG-16 on 512 GPUs. Its example run: ResNet-101 on 16 GPUs, 1656.82
  images/s.
- TensorFlow's benchmarks page (DGX-1, P100, synthetic data, batch 64 per GPU,
  May 2017): one GPU does 142 images/s (Inception V3), 154 (VGG-16).
- Goyal et al. 2017, "Accurate, Large Minibatch SGD": ResNet-50 on Big Basin
  servers (8 P100 with NVLink, 50 Gbit/s Ethernet), 32 images per GPU, ~90%
  scaling efficiency from 8 to 256 GPUs; ~100 MB of gradients, ~120 ms backward.
- PyTorch's DDP benchmark (pytorch/pytorch, benchmarks/distributed/ddp/README.md,
  example output): ResNet-50, batch 32 per V100, 329 images/s on 1 GPU, 306 per
  GPU on 16 (~93%).
Parameter counts: torchvision / Keras application models (Inception V3
23.8 M, ResNet-50 25.6 M, ResNet-101 44.5 M, VGG-16 138.4 M).
"""

from __future__ import annotations

from dataclasses import dataclass

from syncedu.comm.network import Network
from syncedu.tuning import scaling

MB = 2 ** 20
PCIE3 = Network(latency=5e-6, bandwidth=12e9, name="pcie3_x16")
ROCE_25G = Network(latency=5e-6, bandwidth=25e9 / 8, name="roce_25g")
NVLINK_P100 = Network(latency=5e-6, bandwidth=40e9, name="nvlink_p100")
NVLINK_V100 = Network(latency=5e-6, bandwidth=100e9, name="nvlink_v100")
ETH_50G = Network(latency=10e-6, bandwidth=50e9 / 8, name="ethernet_50g")


@dataclass(frozen=True)
class Comparison:
    """One published scaling result and the model's prediction of it."""

    name: str
    source: str
    params: float  # parameters of the model (fp32 gradients: 4 bytes each)
    compute_seconds: float  # published per-GPU step time
    world_size: int
    network: Network
    bucket_bytes: float  # the framework's bucket / fusion buffer
    published: float
    band: float  # |predicted - published| allowed
    note: str
    base_world_size: int = 1
    base_network: Network | None = None

    @property
    def model_bytes(self) -> float:
        return 4 * self.params

    def _eff(self, **options) -> float:
        target = (self.world_size, self.network)
        base = (self.base_world_size, self.base_network or self.network)
        return scaling.relative_efficiency(self.model_bytes, self.compute_seconds, base,
                                           target, **options)

    @property
    def predicted(self) -> float:
        return self._eff(overlap=1.0, bucket_bytes=self.bucket_bytes)

    @property
    def no_overlap(self) -> float:
        return self._eff(overlap=0.0)

    @property
    def within(self) -> bool:
        return abs(self.predicted - self.published) <= self.band

    def row(self) -> dict:
        return {"result": self.name, "GPUs": self.world_size, "published": self.published,
                "predicted": round(self.predicted, 3), "no overlap": round(self.no_overlap, 3),
                "band": self.band, "within": self.within, "why they differ": self.note}


def _horovod(name: str, params: float, images_per_s: float, published: float, band: float,
             note: str) -> Comparison:
    net = Network.cluster(128, 4, intra=PCIE3, inter=ROCE_25G)
    return Comparison(name=f"Horovod, {name}", source="Horovod docs/benchmarks",
                      params=params, compute_seconds=64 / images_per_s, world_size=512,
                      network=net, bucket_bytes=64 * MB, published=published, band=band,
                      note=note)


def published_comparisons() -> list[Comparison]:
    """The published scaling results of lesson 09 (five rows), each with the prediction."""
    return [
        _horovod("Inception V3", 23.8e6, 142, 0.90, 0.08,
                 "model 5 points high: it has no term for Horovod's fusion cycle and "
                 "negotiation, stragglers, or RoCE below line rate"),
        _horovod("ResNet-101", 44.5e6, 1656.82 / 16, 0.90, 0.08,
                 "as Inception V3; the step time is the 16-GPU example run's, so it "
                 "already contains some communication"),
        _horovod("VGG-16", 138.4e6, 154, 0.68, 0.08,
                 "553 MB over 25 Gbit/s is ~0.35 s per 0.42 s step: bandwidth-bound; the "
                 "model spreads gradients evenly, VGG's sit in a few huge FC layers"),
        Comparison(name="Goyal et al., ResNet-50 8->256", source="Goyal et al. 2017",
                   params=25.6e6, compute_seconds=0.120 / scaling.BACKWARD_SHARE,
                   world_size=256, network=Network.cluster(32, 8, intra=NVLINK_P100,
                                                           inter=ETH_50G),
                   bucket_bytes=25 * MB, published=0.90, band=0.08,
                   base_world_size=8, base_network=NVLINK_P100,
                   note="model 4 points high: their allreduce (reduce inside a server, "
                        "halving-doubling across) overlapped less than the ideal buckets"),
        Comparison(name="PyTorch DDP, ResNet-50", source="Li et al. 2020 (DDP benchmark)",
                   params=25.6e6, compute_seconds=32 / 329, world_size=16,
                   network=Network.cluster(2, 8, intra=NVLINK_V100, inter="ethernet_100g"),
                   bucket_bytes=25 * MB, published=0.93, band=0.06,
                   note="assumes 2 nodes x 8 V100 on 100 Gbit/s; model 3 points high: NCCL "
                        "kernels contend with the backward for the GPU"),
    ]
