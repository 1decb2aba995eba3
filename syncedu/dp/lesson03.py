"""Widgets for notebooks/03_data_parallel: what overlap and bucket size buy, on the model
in dp/timeline.py, on a network you pick."""

from __future__ import annotations

import ipywidgets as w

from syncedu.comm.network import Network
from syncedu.dp import plots as dplots
from syncedu.dp import timeline
from syncedu.dp.buckets import MB
from syncedu.ui.widgets import Explorer


def _bucket_view(gbit: float, bucket_mb: float, world_size: int, overlap: bool):
    """A ResNet-50-like step: 100 MB of gradients, 60 ms forward, 120 ms backward, 20 us."""
    net = Network(latency=20 * 1e-6, bandwidth=gbit * 1e9 / 8)
    buckets = timeline.bucket_sizes(100 * MB, int(bucket_mb * MB))
    s = timeline.schedule(buckets, world_size, net, forward=0.060, backward=0.120, overlap=overlap)
    text = (f"{len(buckets)} bucket(s), step {s.seconds * 1e3:.1f} ms = compute "
            f"{s.compute * 1e3:.1f} ms + exposed communication {s.exposed_comm * 1e3:.1f} ms "
            f"(allreduce busy {s.comm * 1e3:.1f} ms)")
    fig = dplots.timeline({f"{world_size} ranks, {gbit:g} Gbit/s": s.segments},
                          title="one step on the model")
    return text, fig, s


def bucket_explorer() -> Explorer:
    """Bandwidth, bucket size, world size and overlap on/off for a ResNet-50-like step."""
    controls = {
        "gbit": w.FloatLogSlider(value=10, base=10, min=0, max=2.5, step=0.1,
                                 description="Gbit/s", continuous_update=False),
        "bucket_mb": w.FloatLogSlider(value=25, base=2, min=-2, max=7, step=1,
                                      description="bucket MB", continuous_update=False),
        "world_size": w.IntSlider(value=8, min=2, max=256, description="ranks",
                                  continuous_update=False),
        "overlap": w.Checkbox(value=True, description="overlap with backward"),
    }
    return Explorer(controls, _bucket_view)
