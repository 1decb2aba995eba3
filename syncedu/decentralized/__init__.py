"""Lesson 12, training without a global barrier: gossip, D-PSGD, push-sum, streaming DiLoCo.

Open `gossip.py` (one gossip round on ring, torus and exponential graphs, the mixing matrix,
its second eigenvalue, push-sum), `streaming.py` (streaming DiLoCo, on lesson 09's DiLoCo),
`adpsgd.py` (AD-PSGD: asynchronous pairwise averaging with an active/passive split, on
simulated ranks with stragglers), then `train_strategies.py` (registers "dpsgd" and
"streaming_diloco" with `train.run`) and
`torchft_check.py` (ours against torchft's `DiLoCo` with fragments, on real ranks); the
notebook's checkers are in `exercises12.py`.
"""

from syncedu.decentralized import train_strategies  # noqa: F401  ("dpsgd", "streaming_diloco")
from syncedu.decentralized.gossip import (TOPOLOGIES, consensus_distance, gossip, in_peers,
                                          mixing_matrix, out_peers, push_matrix, push_sum,
                                          second_eigenvalue)
from syncedu.decentralized.streaming import StreamingConfig, StreamingDiLoCo

__all__ = ["TOPOLOGIES", "mixing_matrix", "gossip", "in_peers", "out_peers", "second_eigenvalue",
           "consensus_distance", "push_matrix", "push_sum", "StreamingConfig", "StreamingDiLoCo"]
