"""Public face of parameter servers: `syncedu.lab.ps_train` and `syncedu.strategies.ps`."""

from syncedu.lab.ps_train import *  # noqa: F401,F403
from syncedu.lab.ps_train import (  # noqa: F401
    History,
    PSConfig,
    allreduce_baseline,
    numel,
    rank_main,
    run,
    stragglers,
)
from syncedu.strategies.ps import (  # noqa: F401
    MODES,
    Applied,
    ServerLog,
    WorkerLog,
    ps_rank,
    shard_ranges,
)
