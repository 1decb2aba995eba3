"""Lesson 08, Horovod next to DDP: the same job under both.

(Inside `syncedu`, `import horovod` still means the real Horovod: every import
here is absolute, and this package is only ever `syncedu.horovod`.)

Open in this order:

1. `training.py`: `train.run("horovod", ...)`: Horovod's recipe (`hvd.init`,
   `DistributedOptimizer`, `broadcast_parameters`) in the harness's loop, and
   `run_jobs`: several jobs (or functions) in one start of the ranks;
   `lines.py`: each line of the recipe left out, and tensor names that differ;
2. `launch.py`: `horovod.run` from a notebook (ranks' output, signals);
3. `timeline.py`: reading Horovod's timeline (fused collectives per cycle);
4. the notebook's helpers: `lesson08.py`, `exercises08.py` (import them by name).

Horovod itself is imported only inside the functions that need it.
"""

from __future__ import annotations

from syncedu.horovod.training import HorovodComm, HorovodSettings, run_jobs, run_ranks

__all__ = ["HorovodSettings", "HorovodComm", "run_ranks", "run_jobs"]
