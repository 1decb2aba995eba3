"""Benchmarks: `python -m syncedu.bench {launch,collectives,dp,...} [options]`.

Each subcommand lives in `syncedu/bench/<name>.py`, which defines
`add_arguments(parser)` and `main(args) -> int`. Results and the commands that
produced them are in the README.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil


def _subcommands() -> dict[str, str]:
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return {n: f"{__name__}.{n}" for n in sorted(names)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncedu.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    modules = {}
    for name, path in _subcommands().items():
        modules[name] = importlib.import_module(path)
        doc = (modules[name].__doc__ or "").strip().splitlines()[0]
        modules[name].add_arguments(sub.add_parser(name, help=doc, description=doc))
    args = parser.parse_args(argv)
    return modules[args.what].main(args)

