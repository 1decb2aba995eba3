"""syncedu: how data is synchronized in distributed training, run and measured.

The package reads like the course, imports running one way: `syncedu/comm/` (the engine:
`Comm`, real and simulated ranks, the `Network` model, the ledger) <- `syncedu/train/` (the
one training harness, which imports no topic) <- one package per topic, in course order,
each opening with its algorithm files (`collectives/` 01-02, `dp/` 03 and 05, `ps/` 04,
`syncbn/` 06, `compress/` 07, `horovod/` 08, `tuning/` 09, `zero/` 10, `faults/` 11,
`decentralized/` 12) <-
their notebook helpers; `syncedu/ui/` holds what every lesson shares. Beside the package,
not in it: `benchmarks/` and `examples/` (README, "The package in one screen").

The short names are the real packages and modules, bound here eagerly:
`from syncedu import launch, sim, collectives, cost, dp, syncbn, train, ps, compress, data,
models, zero, decentralized, Network, PRESETS`. Importing the topics also registers their
`train.run` strategies. Nothing here imports matplotlib or ipywidgets: a rank process that imports
`syncedu.comm` (which imports this package first) stays light.
"""

from __future__ import annotations

# horovod: imported to register train.run's "horovod"; not in __all__ (see below).
from syncedu import (collectives, compress, decentralized, dp, horovod, ps, syncbn,  # noqa: F401
                     train, tuning, zero)
from syncedu.collectives import cost
from syncedu.comm import launch, sim
from syncedu.comm.network import PRESETS, Network
from syncedu.train import data, models

__version__ = "0.1.0"

# Not "horovod": `from syncedu import *` must never rebind the name of the real Horovod.
__all__ = ["Network", "PRESETS", "launch", "sim", "collectives", "cost", "dp", "syncbn", "train",
           "ps", "compress", "data", "models", "tuning", "zero", "decentralized"]
