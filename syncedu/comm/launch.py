"""Start real ranks and run a worker on each: `run`, `Pool`, `from_env`.

    import torch
    from syncedu import launch

    def hello(comm):                       # may be defined in a notebook cell
        t = torch.ones(3) * comm.rank
        comm.all_reduce(t)
        return t

    res = launch.run(hello, world_size=4)  # four processes, Gloo on CPU
    res[0], res.ledger.sent, res.seconds

`fn` is serialized by value (cloudpickle), so a function written in a notebook
cell works in fresh processes. `Pool` keeps the ranks alive between runs (a
widget re-runs a worker in milliseconds); `from_env()` serves `torchrun`.

The error contract (DESIGN.md), the same for `run` and `Pool.run`:
1. a rank that raises gives `WorkerError` (`.rank`; its traceback in the message);
2. a rank that dies (a signal, `os._exit`, Gloo aborting on mismatched collectives) gives a
   `WorkerError` within seconds: its pipe to the launcher closes, which `procs.Ranks` sees;
3. a run past `timeout` gives `TimeoutError`, whose `.ranks` lists the ranks still running;
4. in every case, Ctrl-C included, every rank is killed and reaped: no process is left
   behind (a launcher killed with SIGKILL leaves its ranks to exit within a second, and its
   rendezvous folder to the next start, which removes it).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import types
import weakref

import cloudpickle
import torch

from .errors import TimeoutError, WorkerError
from .ledger import Ledger
from .network import Network
from .procs import Ranks, default_threads
from .runs import RunResult, check_call, check_choice, check_ranks, check_timeout
from .trace import Trace

__all__ = ["run", "Pool", "from_env", "free_port", "resolve_backend", "WorkerError", "TimeoutError",
           "RunResult", "MAX_WORLD_SIZE", "DEFAULT_TIMEOUT"]

MAX_WORLD_SIZE = 64  # real processes on one machine; use syncedu.sim for more
DEFAULT_TIMEOUT = 120.0
BACKENDS = ("auto", "gloo", "nccl", "shm")  # shm: local ranks over shared memory (shm.py)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (the OS picks it; never 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_backend(backend: str, world_size: int) -> str:
    """"auto" -> NCCL when every rank can have its own GPU, else Gloo (CPU)."""
    check_choice("backend", backend, BACKENDS)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = torch.distributed.is_nccl_available()
    if backend == "nccl" and (gpus < world_size or not nccl):
        raise ValueError(f"backend='nccl' needs one GPU per rank: world_size={world_size} but "
                         f"{gpus} GPU(s) visible{'' if nccl else ' and NCCL is not built in'}; "
                         "use backend='gloo' or 'auto'")
    if backend == "auto":
        return "nccl" if nccl and gpus >= world_size else "gloo"
    return backend


def _remember_submodule_scans(scan):
    """cloudpickle's `_find_imported_submodules` (1.5-4 ms, most of a warm `Pool.run`), kept
    per (code, modules, number of loaded modules): all its answer depends on."""
    seen: dict = {}

    def cached(code, deps):
        deps = list(deps)
        key = (code, tuple(id(m) for m in deps if isinstance(m, types.ModuleType)),
               len(sys.modules))
        if key not in seen:
            if len(seen) > 256:
                seen.clear()
            seen[key] = scan(code, deps)
        return list(seen[key])

    return cached


_SCAN = getattr(cloudpickle.cloudpickle, "_find_imported_submodules", None)  # None: plain
_REMEMBERED_SCAN = _remember_submodule_scans(_SCAN) if _SCAN else None


def _payload(fn, args, kwargs) -> bytes:
    # The remembered scan is swapped in for our own pickling only: other users of
    # cloudpickle in the caller's process keep the library as it is.
    module = cloudpickle.cloudpickle
    if _REMEMBERED_SCAN is not None:
        module._find_imported_submodules = _REMEMBERED_SCAN
    try:
        return cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as e:
        raise ValueError(f"fn and its arguments must be picklable to reach the ranks: {e}") from e
    finally:
        if _SCAN is not None:
            module._find_imported_submodules = _SCAN


def _result(replies: list) -> RunResult:
    values = [rep[1] for rep in replies]  # (unpickled with the reply, procs.Ranks._receive)
    ledger = Ledger([rep[2] for rep in replies])
    trace = Trace()
    for rep in replies:  # each rank's point-to-point sends, rank by rank
        trace.extend(rep[4])
    return RunResult(values, ledger, max(rep[3] for rep in replies), trace)


class Pool:
    """Live ranks with their process group, reused by every `pool.run` (a context manager);
    after a failure the next `run` starts fresh ones.

    Args:
        world_size: ranks to start, 1..64 (for more, `syncedu.sim.run`).
        backend: "auto" (default: NCCL when every rank has a GPU, else Gloo), "gloo",
            "nccl" or "shm"; see `resolve_backend`.
        timeout: default seconds each `run` may take (default 120.0; None: no limit).
        network: a `Network` to emulate on every message (default None: the machine's own).
        threads: torch threads per rank (None, default: a fair share of the cores; a number
            given is kept even in test runs, which otherwise vary it: comm/perturb.py).
        output: how ranks' prints reach `sys.stdout`: "live" (default, as they come, each
            line marked `[rank r]`), "ordered" (rank 0's lines, then rank 1's, ...) or
            "quiet" (dropped).
    """

    def __init__(self, world_size: int, *, backend: str = "auto",
                 timeout: float | None = DEFAULT_TIMEOUT, network: Network | None = None,
                 threads: int | None = None, output: str = "live"):
        check_ranks(world_size, MAX_WORLD_SIZE, network, timeout, output,
                    " (for more ranks use syncedu.sim.run)")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads={threads!r} must be an int >= 1 (or None for a fair share)")
        self.world_size = world_size
        self.backend = resolve_backend(backend, world_size)
        self.timeout = timeout
        self.network = network
        self.threads = threads or default_threads(world_size)
        self._pin_threads = threads is not None  # asked for: not perturbed (comm/perturb.py)
        self.output = output
        self._ranks: Ranks | None = None
        self._closed = False
        self._start()
        _live_pools.add(self)

    def _start(self) -> None:
        self._ranks = Ranks(self.world_size, backend=self.backend, threads=self.threads,
                            network=self.network, output=self.output,
                            pin_threads=self._pin_threads,
                            pg_timeout=max(self.timeout or 0, DEFAULT_TIMEOUT) + 30,
                            start_timeout=max(60.0, 10.0 * self.world_size))

    def run(self, fn, args=(), kwargs=None, timeout: float | None = ...) -> RunResult:
        """Run `fn(comm, *args, **kwargs)` on every rank; see `launch.run`."""
        timeout = self.timeout if timeout is ... else timeout
        check_call(fn, args, kwargs)
        check_timeout(timeout)
        if self._closed:
            raise RuntimeError("this Pool is closed; create a new one")
        payload = _payload(fn, args, kwargs)
        if self._ranks is None or not self._ranks.alive():  # first run, or a rank died
            if self._ranks is not None:
                self._ranks.kill()
            self._ranks = None
            self._start()
        try:
            return _result(self._ranks.run(payload, timeout))
        except BaseException:  # failed, timed out or interrupted: no rank survives it
            self._ranks.kill()
            self._ranks = None
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the live ranks (empty after a failure, until the next run)."""
        return [p.pid for p in self._ranks.procs] if self._ranks else []

    def close(self) -> None:
        """Stop every rank (idempotent)."""
        self._closed = True
        if self._ranks is not None:
            self._ranks.stop()
            self._ranks = None

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._ranks is not None:
                self._ranks.kill()
        except Exception:  # (at interpreter exit even `contextlib` may be gone)
            pass


_live_pools: weakref.WeakSet = weakref.WeakSet()
atexit.register(lambda: [p.close() for p in list(_live_pools)])


def run(fn, world_size: int, args=(), kwargs=None, *, backend: str = "auto",
        timeout: float | None = DEFAULT_TIMEOUT, network: Network | None = None,
        threads: int | None = None, output: str = "live") -> RunResult:
    """Start `world_size` ranks in a fresh process group, run `fn(comm, *args, **kwargs)` on
    each after a barrier, return a `RunResult`; reap every rank (the module's error contract).

    Args:
        fn: the worker, `fn(comm, *args, **kwargs)`; it may be defined in a notebook cell.
            Return tensors, numbers or plain data (not the comm: it works only on its rank).
        world_size: ranks, 1..64.
        args, kwargs: passed to `fn` on every rank (default none); they must pickle.
        backend, timeout, network, threads, output: as for `Pool` (timeout: seconds for the
            whole run, default 120.0).

    Returns the per-rank values in rank order, with `.ledger` (bytes each rank sent and
    received through its comm) and `.seconds` (the slowest rank's time in `fn`).
    """
    check_call(fn, args, kwargs)  # before any process starts; Pool checks the rest
    pool = Pool(world_size, backend=backend, timeout=timeout, network=network,
                threads=threads, output=output)
    try:
        return pool.run(fn, args, kwargs, timeout=timeout)
    finally:
        pool.close()


def from_env(backend: str = "auto", *, network: Network | None = None, timeout: float = 300.0):
    """A `TorchComm` for a script started by torchrun (joins the default group if not yet)."""
    import datetime

    import torch.distributed as dist

    from .shm import ShmComm
    from .torch_comm import TorchComm

    if not dist.is_initialized():
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
                   if k not in os.environ]
        if missing:
            raise RuntimeError(f"from_env() needs {missing} in the environment: start the script "
                               "with torchrun, or use launch.run from Python")
        world_size = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", 0))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        chosen = resolve_backend(backend, local_size)
        if chosen == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group("gloo" if chosen == "shm" else chosen,
                                timeout=datetime.timedelta(seconds=timeout))
    return (ShmComm if backend == "shm" else TorchComm)(network=network)  # shm: shm.py
