"""Benchmarks: `python -m benchmarks {launch,collectives,dp,...} [options]`, run from the
repository's root. They are programs beside the package, not part of it: they import
syncedu, and syncedu never imports them.

Each subcommand is `benchmarks/<name>.py` (`add_arguments(parser)`, `main(args) -> int`);
results, their commands and their logs are in `benchmarks/README.md`. Variants alternate round by round, so drift
on a busy machine hits all alike (DESIGN, "Traps already met").
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys


def rotated(names: list, i: int) -> list:
    """Round `i`'s order of the variants: `names` rotated by i."""
    return names[i % len(names):] + names[:i % len(names)]


def bar(total: int, desc: str):
    """A tqdm progress bar on stderr (what a terminal shows; stdout keeps the results)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr)


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Fixed-width text; `columns`: (header, key, format spec such as ">9.2f" or "<12")."""
    def head(h: str, spec: str) -> str:
        align, width = re.match(r"([<>^]?)(\d*)", spec).groups()
        return format(h, (align or ">") + width)

    lines = [" ".join(head(h, f) for h, _, f in columns)]
    lines += [" ".join(format(r[k], f) for _, k, f in columns) for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    modules = {}
    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            modules[m.name] = importlib.import_module(f"{__name__}.{m.name}")
            doc = (modules[m.name].__doc__ or "").strip().splitlines()[0]
            modules[m.name].add_arguments(sub.add_parser(m.name, help=doc, description=doc))
    args = parser.parse_args(argv)
    return modules[args.what].main(args)
