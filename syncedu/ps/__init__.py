"""Lesson 04, parameter servers: sync, async and bounded staleness on `Comm`.

    ranks 0 .. W-1      workers: compute a gradient, push it, pull parameters
    ranks W .. W+S-1    servers: server s owns the flat range s of the parameters

Messages are plain point-to-point sends (`isend`/`recv`, and `recv_any` on the
servers), not `torch.distributed.rpc`. Open in this order: `config.py`
(`PSConfig`, the modes), `worker.py`, `server.py`, then `training.py`
(`ps_rank`, one rank of the protocol, and `ps.run`, which trains `train.run`'s
model on its data through it); the notebook's helpers `lesson04.py`, `plots.py`,
`exercises04.py` need matplotlib and ipywidgets (import them by name).
Sources: Li et al., OSDI 2014 (the parameter server, bounded delay); Ho et al.,
NeurIPS 2013 (SSP); Dean et al., NeurIPS 2012 (Downpour, asynchronous SGD).
"""

from __future__ import annotations

from syncedu.ps.config import MODES, PULL_TAG, PUSH_TAG, PSConfig, shard_ranges
from syncedu.ps.training import PSHistory, numel, ps_rank, run, stragglers

__all__ = ["run", "PSHistory", "PSConfig", "MODES", "stragglers", "numel", "shard_ranges",
           "ps_rank", "PUSH_TAG", "PULL_TAG"]
