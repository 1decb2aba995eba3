"""Modeled compute, charged layer by layer as forward and backward actually run: a bucket's
allreduce can only hide behind the backward of the layers after it.

1. split `seconds` per micro-batch into forward (1/3) and backward (2/3): a layer's
   backward computes two products to forward's one (Kaplan et al. 2020, sec. 2.1);
2. give each layer with trainable parameters a share proportional to their count;
3. forward: after a layer's forward, `comm.compute(its forward share)`;
4. backward: a hook on the layer's output fires when the gradient reaches it,
   before its parameters' gradients are ready, and charges its backward share.

Simulated ranks move the logical clock; real ranks sleep (a slower device, no CPU taken).
The shares are fixed at construction, the hooks come with `attach()`: the harness builds
it before the strategy wraps the model (ZeRO-3 frees the parameters it counts) and attaches
it after (so a wrapper's hooks, e.g. ZeRO-3's all-gather, run before a layer computes).
"""

from __future__ import annotations

import torch
from torch import nn

from syncedu.comm.runs import check_number

FORWARD_SHARE = 1 / 3  # Step 1


class LayerCompute:
    """Charge `seconds` of modeled compute per forward+backward of `module` to `comm`."""

    def __init__(self, module: nn.Module, comm, seconds: float):
        check_number("seconds", seconds, 0)
        self.comm = comm
        layers = [m for m in module.modules()
                  if any(p.requires_grad for p in m.parameters(recurse=False))]
        sizes = [sum(p.numel() for p in m.parameters(recurse=False)) for m in layers]
        total = sum(sizes) or 1
        self.shares = {id(m): seconds * n / total for m, n in zip(layers, sizes)}  # Step 2
        self._layers, self._hooks = layers, []

    def attach(self) -> LayerCompute:
        """Hook every layer's forward so its modeled compute is charged as it runs; returns self."""
        self._hooks = [m.register_forward_hook(self._after_forward) for m in self._layers]
        return self

    def _after_forward(self, module: nn.Module, _inputs, output) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # evaluation is not part of a training step
        share = self.shares[id(module)]
        self.comm.compute(share * FORWARD_SHARE)  # Step 3
        if isinstance(output, torch.Tensor) and output.requires_grad:  # Step 4
            backward = share * (1 - FORWARD_SHARE)
            output.register_hook(lambda grad: self.comm.compute(backward))

    def close(self) -> None:
        """Remove the hooks `attach` installed."""
        for h in self._hooks:
            h.remove()
