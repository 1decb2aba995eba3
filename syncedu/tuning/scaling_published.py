"""Published scaling results, predicted by the alpha-beta model from inputs stated first.

Every input is fixed from the source's hardware and a published step time *before*
the published efficiency is looked at, one rule for all rows; each `Comparison` asks
`scaling.efficiency`, relative to its base, for:

1. `predicted`: buckets, `timeline.DEFAULT_OVERLAP` of the backward hiding them;
2. `best_case`: buckets, the whole backward available (`overlap=1`);
3. `no_overlap`: every gradient byte after the backward;

then `miss = predicted - published`; `blind` names what the model has no term for.

Sources (their figures are in the rows of `scaling_published.json`, beside this module):
Horovod's docs/benchmarks (128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE, batch 64 per GPU);
TensorFlow's benchmarks page (DGX-1, P100, batch 64, May 2017: the 1-GPU rates); Goyal et
al. 2017 (servers of 8 P100 with NVLink, 50 Gbit/s Ethernet, ~120 ms backward); PyTorch's
DDP benchmark (benchmarks/distributed/ddp/README.md: DGX machines of 8 V100, "4x 100Gb
InfiniBand per machine", ResNet-50, batch 32 per GPU); parameter counts: torchvision / Keras.

The rows are numbers and prose copied from those sources, so they live in that data file,
one object per result with its source next to its numbers. `links` are the links they name
(latency in s, bandwidth in bytes/s: 25 Gbit/s RoCE is 3.125e9); a row's `network` (and
`base_network`) is a link's name or a `Network.cluster` of `nodes` x `gpus_per_node` with
`intra` and `inter` links (a name not in `links` is a preset). The step time is `batch` /
(`images_per_s` / `measured_on`, the GPUs that rate was measured on, default 1), or
`backward_seconds` / `timeline.BACKWARD_SHARE`; `published` is the efficiency, or
`published_images_per_s` is [per-GPU rate at world_size, at the base], rounded to 3 places.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from syncedu.comm.network import Network
from syncedu.dp import timeline
from syncedu.tuning import scaling

_DATA = json.loads(Path(__file__).with_name("scaling_published.json").read_text("utf-8"))
LINKS = {name: Network(name=name, **link) for name, link in _DATA["links"].items()}


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
                f"{self.network.name}, buckets {self.bucket_bytes / scaling.MB:g} MB")

    def row(self) -> dict:
        """The comparison as a dict of rounded values (one table row)."""
        return {"result": self.name, "GPUs": self.world_size, "published": self.published,
                "predicted": round(self.predicted, 3), "best case": round(self.best_case, 3),
                "no overlap": round(self.no_overlap, 3), "miss": round(self.miss, 3),
                "bracketed": self.bracketed, "model cannot see": self.blind}


def _network(spec) -> Network | str | None:
    """A link of `LINKS` by name (another name: a preset's; None: None), or a cluster dict."""
    if not isinstance(spec, dict):
        return LINKS.get(spec, spec)
    return Network.cluster(spec["nodes"], spec["gpus_per_node"], intra=_network(spec["intra"]),
                           inter=_network(spec["inter"]))


def _comparison(row: dict) -> Comparison:
    """One row of the data file as a `Comparison` (the fields: module docstring)."""
    r = dict(row)
    if "backward_seconds" in r:  # Goyal et al. state the backward, not a rate
        compute = r.pop("backward_seconds") / timeline.BACKWARD_SHARE
    else:
        compute = r.pop("batch") / (r.pop("images_per_s") / r.pop("measured_on", 1))
    if "published_images_per_s" in r:
        rate, base_rate = r.pop("published_images_per_s")
        r["published"] = round(rate / base_rate, 3)
    for key in ("network", "base_network"):  # an absent base_network: None, the network
        r[key] = _network(r.get(key))
    return Comparison(compute_seconds=compute, bucket_bytes=r.pop("bucket_mb") * scaling.MB, **r)


def published_comparisons() -> list[Comparison]:
    """The published scaling results of lesson 09 (six rows), each with the prediction."""
    return [_comparison(row) for row in _DATA["rows"]]
