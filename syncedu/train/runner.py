"""Where the ranks of a training job run, and how two runs compare.

Every experiment writes one `fn(comm, *args)` against `Comm`; `where` picks "local" (this
process, a world-size-1 `LocalComm`: the reference), "sim" (simulated ranks, `network`
modeled), "pool" (your `launch.Pool`'s warm ranks, its own network emulated) or "fresh"
(new processes); `Placement` opens them for one job and closes what it opened.
"""

from __future__ import annotations

import torch

from syncedu.comm import launch, sim
from syncedu.comm.ledger import Ledger
from syncedu.comm.local import LocalComm
from syncedu.comm.runs import RunResult, check_bool


def where(world_size: int, *, pool=None, network=None, simulate: bool = False,
          local: bool = False, job: str = "the run") -> str:
    """"local", "sim", "pool" or "fresh"; a ValueError naming the bad parameter (and the
    caller, `job`, e.g. "strategy='single'")."""
    check_bool("simulate", simulate)
    limit = sim.MAX_WORLD_SIZE if simulate else launch.MAX_WORLD_SIZE
    if not local and isinstance(world_size, int) and world_size > limit:  # name the job's
        raise ValueError(f"{job} is {world_size} ranks, more than the {limit} "  # own terms
                         + ("simulated ranks a run can have" if simulate else
                            f"real ranks a run can have (simulate=True: {sim.MAX_WORLD_SIZE})"))
    if local:
        if world_size != 1:
            raise ValueError(f"{job} runs in this process: world_size={world_size} must be 1")
        if pool is not None or network is not None or simulate:
            raise ValueError(f"{job} runs in this process: pass no pool, network or simulate")
        return "local"
    if simulate:
        if pool is not None:
            raise ValueError("simulate=True starts simulated ranks: pass no pool")
        return "sim"
    if pool is None:
        return "fresh"
    if pool.world_size != world_size:
        raise ValueError(f"pool has world_size={pool.world_size}, {job} needs "
                         f"world_size={world_size}")
    if network is not None and network is not pool.network:
        raise ValueError("network= must be the pool's own network (create the Pool with "
                         "network=...)")
    return "pool"


class Placement:
    """The ranks of one job, wherever `where` put them (a context manager)."""

    def __init__(self, world_size: int, *, pool=None, network=None, simulate: bool = False,
                 local: bool = False, timeout: float = 600.0, job: str = "the run"):
        self.kind = where(world_size, pool=pool, network=network, simulate=simulate,
                          local=local, job=job)
        self.world_size, self.network, self.timeout = world_size, network, timeout
        self.pool = launch.Pool(world_size, network=network, timeout=timeout, output="live") \
            if self.kind == "fresh" else pool

    def run(self, fn, args=()) -> RunResult:
        """`fn(comm, *args)` on every rank: a `RunResult` (values, ledger, seconds)."""
        if self.kind == "local":
            return _run_local(fn, args)
        if self.kind == "sim":
            return sim.run(fn, self.world_size, args=args, network=self.network,
                           timeout=self.timeout)
        return self.pool.run(fn, args, timeout=self.timeout)

    def __enter__(self) -> Placement:
        return self

    def __exit__(self, *exc) -> None:
        if self.kind == "fresh":  # a pool passed in stays warm for the caller
            self.pool.close()


def run(fn, world_size: int, args=(), *, pool=None, network=None, simulate: bool = False,
        local: bool = False, timeout: float = 600.0, job: str = "the run") -> RunResult:
    """`fn(comm, *args)` on each rank of a job that calls its ranks once."""
    with Placement(world_size, pool=pool, network=network, simulate=simulate, local=local,
               timeout=timeout, job=job) as ranks:
        return ranks.run(fn, args)


def _run_local(fn, args) -> RunResult:
    """One rank in this process, on one torch thread, like one rank of a 2-rank job here."""
    comm = LocalComm()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = comm.now()
        value = fn(comm, *args)
        seconds = comm.now() - t0
    finally:
        torch.set_num_threads(threads)
    return RunResult([value], Ledger([comm.ledger]), seconds)


def max_param_diff(params, other) -> float:
    """Largest absolute difference between two runs' final parameters, over `params`' names
    (each a history with `.params` or a dict {name: tensor})."""
    mine, theirs = _params(params, "params"), _params(other, "other")
    missing = [k for k in mine if k not in theirs]
    if missing:
        raise ValueError(f"other has no parameters {missing}: compare runs of the same model")
    return max((mine[k] - theirs[k]).abs().max().item() for k in mine)


def _params(run, name: str) -> dict:
    found = getattr(run, "params", run)
    if not isinstance(found, dict):
        raise ValueError(f"{name}={type(run).__name__} must be a run's history (with .params) "
                         f"or a dict of parameters")
    return found
