"""Lesson 04, parameter servers: sync, async and bounded staleness, point-to-point on `Comm`
(not `torch.distributed.rpc`). Sources: Li et al., OSDI 2014 (the parameter server, bounded
delay); Ho et al., NeurIPS 2013 (SSP); Dean et al., NeurIPS 2012 (Downpour, async SGD).
"""

from syncedu.ps.config import MODES, PULL_TAG, PUSH_TAG, PSConfig, shard_ranges
from syncedu.ps.training import PSHistory, numel, ps_rank, run, stragglers

__all__ = ["run", "PSHistory", "PSConfig", "MODES", "stragglers", "numel", "shard_ranges",
           "ps_rank", "PUSH_TAG", "PULL_TAG"]
