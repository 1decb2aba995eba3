"""Test-only perturbation of real ranks: other thread counts, other arrival orders.

A notebook's checked output must not depend on either: both change from machine
to machine. With `SYNCEDU_PERTURB=<seed>` (the test run) every real rank:

1. uses 1 or 2 torch threads, chosen per rank from the seed, unless the caller asked for a
   count (`launch.Pool(threads=...)`): a wall-clock comparison on a loaded 2-core machine
   must not time two threads per rank fighting over the cores;
2. sleeps a seeded random 0-3 ms before each send and each built-in collective.
"""

from __future__ import annotations

import functools
import os
import random
import time

ENV = "SYNCEDU_PERTURB"
_WRAPPED = ("_raw_isend", "_broadcast", "_reduce", "_all_reduce", "_reduce_scatter",
            "_all_gather")


def seed() -> int | None:
    """The perturbation seed from the environment, or None when switched off."""
    value = os.environ.get(ENV, "").strip()
    if not value or value == "0":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{ENV}={value!r} must be an integer seed (or unset/0 to switch off)") \
            from None


def threads(default: int, rank: int, pinned: bool = False) -> int:
    """Step 1: this rank's torch thread count (1 or 2 when perturbed, else `default`;
    `pinned`: the caller asked for `default`, keep it)."""
    s = seed()
    if s is None or pinned:
        return default
    return 1 + random.Random(s * 7919 + rank).randrange(2)


def install(comm) -> None:
    """Step 2: make `comm` (a TorchComm) wait a seeded random moment before it sends."""
    s = seed()
    if s is None:
        return
    rng = random.Random(s * 104729 + comm.rank)

    def delayed(call):
        @functools.wraps(call)
        def wrapper(*args, **kwargs):
            time.sleep(rng.uniform(0.0, 0.003))
            return call(*args, **kwargs)
        return wrapper

    for name in _WRAPPED:
        setattr(comm, name, delayed(getattr(comm, name)))
