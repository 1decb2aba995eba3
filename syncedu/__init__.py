"""syncedu: how data is synchronized in distributed training, run and measured.

The package reads like the course (imports run one way, top to bottom):

1. `syncedu/comm/`, the engine: the `Comm` interface, real ranks (`launch`),
   simulated ranks (`sim`), the `Network` model and the ledger;
2. `syncedu/train/`, the one training harness: `train.run`, its config, the
   per-rank loop, where ranks run, data, models; it imports no topic, topics
   register their strategies with it;
3. one package per topic, in course order, each opening with its algorithm
   files, then its experiments, then its notebook helpers (figures, widgets,
   exercise checkers, imported by name only):
   `collectives/` (01-02, with the cost model), `dp/` (03, 05), `ps/` (04),
   `syncbn/` (06), `compress/` (07), `horovod/` (08), `tuning/` (09),
   `zero/` (10);
4. `syncedu/ui/`: what every lesson shares (`show`, the widget base, the
   ledger figure, the checkers' helpers).

Beside the package, not in it: `benchmarks/` (`python -m benchmarks ...` from the
repository's root) and `examples/` (whole programs for torchrun); they import syncedu,
never the other way round.

The short names are the real packages and modules, bound here eagerly:
`from syncedu import launch, sim, collectives, cost, dp, syncbn, train, ps,
compress, data, models, zero, Network, PRESETS`. Importing the topics also
registers their `train.run` strategies. Nothing here imports matplotlib or
ipywidgets: a rank process that imports `syncedu.comm` (which imports this
package first) stays light.
"""

from __future__ import annotations

# horovod: imported to register train.run's "horovod"; not in __all__ (see below).
from syncedu import collectives, compress, dp, horovod, ps, syncbn, train, tuning, zero  # noqa: F401
from syncedu.collectives import cost
from syncedu.comm import launch, sim
from syncedu.comm.network import PRESETS, Network
from syncedu.train import data, models

__version__ = "0.1.0"

# Not "horovod": `from syncedu import *` must never rebind the name of the real Horovod.
__all__ = ["Network", "PRESETS", "launch", "sim", "collectives", "cost", "dp", "syncbn", "train",
           "ps", "compress", "data", "models", "tuning", "zero"]
