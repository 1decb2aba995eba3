"""Widgets for lesson 07: top-k and PowerSGD on 2 simulated ranks, loss and bytes vs fp32."""

from __future__ import annotations

import functools

import ipywidgets as w

from syncedu import train
from syncedu.compress import PowerSGD, TopK
from syncedu.compress import plots as cplots
from syncedu.ui.widgets import Explorer

STEPS, LR = 80, 0.3


def trained(compressor, steps: int = STEPS, lr: float = LR):
    """The digits MLP on 2 simulated ranks, each layer its own bucket, through `compressor`."""
    return train.run("bucketed", 2, simulate=True, compression=compressor, bucket_cap_mb=1e-6,
                     steps=steps, global_batch=64, lr=lr, seed=0)


def sent_per_step(h) -> float:
    """Bytes rank 0 sent per step, counted by the ledger."""
    return h.ledger.sent[0] / len(h.loss)


@functools.lru_cache(maxsize=4)
def _reference(steps: int = STEPS):
    return trained(None, steps)


def _view(c, label: str, steps: int = STEPS):
    ref, h = _reference(steps), trained(c, steps)
    fig = cplots.side_by_side({"fp32 allreduce": ref, label: h},
                              {"fp32": sent_per_step(ref), label.split()[0]: sent_per_step(h)})
    text = (f"{label}: final loss {sum(h.loss[-10:]) / 10:.3f} (fp32 "
            f"{sum(ref.loss[-10:]) / 10:.3f}), accuracy {h.accuracy:.1%} "
            f"({ref.accuracy:.1%}), {sent_per_step(ref) / sent_per_step(h):.0f}x fewer bytes")
    return text, fig, h


def _topk_view(percent: float, error_feedback: bool):
    return _view(TopK(percent / 100, error_feedback=error_feedback),
                 f"top-{percent:g}% {'with' if error_feedback else 'without'} error feedback")


def topk_explorer() -> Explorer:
    """k% (of each layer's entries) and error feedback on/off."""
    return Explorer({"percent": w.FloatLogSlider(value=1, base=10, min=-1, max=2, step=0.25,
                                                 description="k %", continuous_update=False),
                     "error_feedback": w.Checkbox(value=True, description="error feedback")},
                    _topk_view)


def _powersgd_view(rank: int, start_iter: int):
    return _view(PowerSGD(rank, start_iter=start_iter), f"PowerSGD rank {rank}, start {start_iter}")


def powersgd_explorer() -> Explorer:
    """PowerSGD's rank and start iteration against accuracy and compression."""
    return Explorer({"rank": w.IntSlider(value=1, min=1, max=8, description="rank r",
                                         continuous_update=False),
                     "start_iter": w.IntSlider(value=2, min=0, max=60, step=2,
                                               description="start iter", continuous_update=False)},
                    _powersgd_view)
