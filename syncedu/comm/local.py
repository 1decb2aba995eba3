"""`LocalComm`: a `Comm` of world size 1 in this process; `compute` sleeps, as on real ranks."""

from __future__ import annotations

import torch

from .base import Comm


class LocalComm(Comm):
    """Rank 0 of 1: collectives are the identity, point-to-point has no peer."""

    backend = "local"

    def __init__(self, device: torch.device | str = "cpu", network=None):
        super().__init__(0, 1, network)
        self.device = torch.device(device)

    def _no_peer(self, *_args):  # never reached: `Comm` answers or rejects first
        raise RuntimeError("LocalComm has world size 1: there is no other rank")

    _isend = _irecv = _broadcast = _reduce = _all_reduce = _no_peer
    _reduce_scatter = _all_gather = _barrier = _no_peer
