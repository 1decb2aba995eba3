"""Public face of `syncedu.strategies.syncbn`: SyncBatchNorm on any `Comm`."""

from syncedu.strategies.syncbn import *  # noqa: F401,F403
from syncedu.strategies.syncbn import (  # noqa: F401
    BACKWARD_OP,
    CHECK_OP,
    FORWARD_OP,
    SyncBatchNorm,
    convert,
    global_stats,
)
