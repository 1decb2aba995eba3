"""Lesson 04, parameter servers: sync, async and bounded staleness on `Comm`.

Workers are ranks 0..W-1, servers ranks W..W+S-1 (server s owns the flat range s
of the parameters); messages are point-to-point (`isend`/`recv`, `recv_any` on the
servers), not `torch.distributed.rpc`. Open `config.py`, `worker.py`, `server.py`,
then `training.py` (`ps_rank`, `ps.run`); the notebook's helpers `lesson04.py`,
`plots.py`, `exercises04.py` need matplotlib and ipywidgets (import them by name).
Sources: Li et al., OSDI 2014 (the parameter server, bounded delay); Ho et al.,
NeurIPS 2013 (SSP); Dean et al., NeurIPS 2012 (Downpour, asynchronous SGD).
"""

from syncedu.ps.config import MODES, PULL_TAG, PUSH_TAG, PSConfig, shard_ranges
from syncedu.ps.training import PSHistory, numel, ps_rank, run, stragglers

__all__ = ["run", "PSHistory", "PSConfig", "MODES", "stragglers", "numel", "shard_ranges",
           "ps_rank", "PUSH_TAG", "PULL_TAG"]
