"""syncedu: how data is synchronized in distributed training, run and measured.

Layers (each imports only the ones before it):

1. `syncedu.comm`: the `Comm` interface, real ranks (`launch`), simulated ranks
   (`sim`), the `Network` model and the ledger;
2. `syncedu.strategies`: collectives, data-parallel gradient sync, parameter
   servers, SyncBatchNorm, compression, all written once against `Comm`;
3. `syncedu.lab`: training loop, benchmarks, cost model, data and models;
4. `syncedu.ui`: plots and widgets for the notebooks.

The public modules are short names for the files that hold them:
`from syncedu import launch, sim, collectives, cost, dp, syncbn, train, ps,
compress, data, models` (see `PUBLIC`). Each short name is the real module
itself, not a copy that re-exports it: `syncedu.sim is syncedu.comm.sim`, so a
reader who opens `PUBLIC[name]`'s file reads the code behind the name. They
load on first use, so that a rank process importing `syncedu.comm` does not pay
for matplotlib.

How (the import system's documented hooks, PEP 451):

1. `_AliasFinder`, first on `sys.meta_path`, answers only for the public short
   names (and modules inside them), with a spec whose loader is `_AliasLoader`;
2. `_AliasLoader.create_module` imports the real module and returns it, so
   `sys.modules["syncedu.sim"]` is the same object as
   `sys.modules["syncedu.comm.sim"]`; its `exec_module` has nothing left to run;
3. the import system then binds it as `syncedu.sim`, so `import syncedu.sim`,
   `from syncedu.sim import run` and `from syncedu import sim` all agree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

from syncedu.comm.network import PRESETS, Network

__version__ = "0.1.0"

# Public short name -> the module that holds it.
PUBLIC = {
    "launch": "syncedu.comm.launch",
    "sim": "syncedu.comm.sim",
    "collectives": "syncedu.strategies.collectives",
    "cost": "syncedu.lab.cost",
    "dp": "syncedu.strategies.dp",
    "syncbn": "syncedu.strategies.syncbn",
    "train": "syncedu.lab.train",
    "ps": "syncedu.lab.ps_train",
    "compress": "syncedu.strategies.compress",
    "data": "syncedu.lab.data",
    "models": "syncedu.lab.models",
}
# Also reachable as attributes (older notebooks), but not what `import *` brings.
_OTHER = {"bench": "syncedu.bench", "plots": "syncedu.ui.plots",
          "widgets": "syncedu.ui.widgets"}


def _real_name(fullname: str) -> str | None:
    """"syncedu.sim" -> "syncedu.comm.sim" (also "syncedu.compress.x" -> "...compress.x")."""
    parts = fullname.split(".")
    if len(parts) < 2 or parts[0] != __name__ or parts[1] not in PUBLIC:
        return None
    return ".".join([PUBLIC[parts[1]], *parts[2:]])


class _AliasLoader(importlib.abc.Loader):
    """Step 2: the "module" of a short name is the real module, imported."""

    def __init__(self, real: str):
        self.real = real

    def create_module(self, spec):
        return importlib.import_module(self.real)

    def exec_module(self, module) -> None:
        pass  # the real module already ran its code when it was imported


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Step 1: a spec for a public short name; None (not ours) for every other import."""

    syncedu_aliases = True  # how a reload of this package recognizes an installed finder

    def find_spec(self, fullname, path=None, target=None):
        real = _real_name(fullname)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


# First, so the short names never reach the file system; replaced, not added, on reload.
sys.meta_path[:] = [_AliasFinder()] + [f for f in sys.meta_path
                                       if not getattr(f, "syncedu_aliases", False)]


def __getattr__(name: str):
    # Step 3 for `syncedu.sim` used before anything imported it.
    if name in PUBLIC:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _OTHER:
        return importlib.import_module(_OTHER[name])
    raise AttributeError(f"module 'syncedu' has no attribute {name!r}")


__all__ = ["Network", "PRESETS", *PUBLIC]
