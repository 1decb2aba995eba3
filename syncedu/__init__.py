"""syncedu: how data is synchronized in distributed training, run and measured.

Layers (each imports only the ones before it):

1. `syncedu.comm`: the `Comm` interface, real ranks (`launch`), simulated ranks
   (`sim`), the `Network` model and the ledger;
2. `syncedu.strategies`: collectives, data-parallel gradient sync, parameter
   servers, SyncBatchNorm, compression, all written once against `Comm`;
3. `syncedu.lab`: training loop, benchmarks, cost model, data and models;
4. `syncedu.ui`: plots and widgets for the notebooks.

The public modules are importable from here: `from syncedu import launch, sim,
collectives, cost, dp, syncbn, train`. They load on first use, so that a rank
process importing `syncedu.comm` does not pay for matplotlib.
"""

from __future__ import annotations

import importlib

from syncedu.comm.network import PRESETS, Network

__version__ = "0.1.0"

# Public name -> module that provides it (loaded on first attribute access).
_MODULES = {
    "launch": "syncedu.launch", "sim": "syncedu.sim", "collectives": "syncedu.collectives",
    "cost": "syncedu.cost", "dp": "syncedu.dp", "syncbn": "syncedu.syncbn",
    "train": "syncedu.train", "ps": "syncedu.ps", "bench": "syncedu.bench",
    "compress": "syncedu.compress", "data": "syncedu.data", "models": "syncedu.models",
    "plots": "syncedu.ui.plots", "widgets": "syncedu.ui.widgets",
}


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'syncedu' has no attribute {name!r}")


__all__ = ["Network", "PRESETS", *_MODULES]
