"""Simulated ranks: N ranks in one process, in-memory links, a logical clock.

`run(fn, world_size)` returns a `RunResult` whose `.seconds` is logical time under a
`Network` model, `.ledger` counted from the messages and `.trace` every message. One rank
runs at a time and hands over when it must wait, so a run always repeats exactly.
One send, in the order of the files it passes through:

1. the call (this file): `comm.isend(t, dst)` copies `t` and charges the ledger (`wait()`
   fails if `t` changed before it, and so does a rank that never waits on a send);
2. the links and clocks (sim_links.py): the sender's port, NIC and latency model;
3. delivery (sim_delivery.py): matched to a posted receive by (source, tag), or queued;
4. the handles (sim_handles.py): `recv` books the receiver's port and moves its clock to
   the arrival; `send` moves the sender's clock to when its port is free (so compute
   between `isend` and `wait` overlaps the transfer).

Built-in collectives are message schedules through steps 2-4 (sim_collectives.py).
"""

from __future__ import annotations

import torch

from . import rank_output
from .base import Comm, Work
from .errors import DeadlockError, TimeoutError, WorkerError  # noqa: F401 - public as sim.*
from .ledger import Ledger
from .network import Network
from .runs import RunResult, check_call, check_progress, check_ranks
from .sim_collectives import Call
from .sim_delivery import PROGRESS_EVERY, World
from .sim_handles import RecvWork, RendezvousWork, SendWork, flat_view
from .sim_links import Message, Wires
from .sim_sched import make

__all__ = ["SimComm", "run", "MAX_WORLD_SIZE", "DEFAULT_TIMEOUT"]

MAX_WORLD_SIZE = 4096
DEFAULT_TIMEOUT = 300.0  # real seconds before a run is stopped


class SimComm(Comm):
    """One simulated rank; made by `run`, one per rank."""

    backend = "sim"
    counts_builtins = True  # built-ins run as messages, counted as they move
    device = torch.device("cpu")

    def __init__(self, rank: int, world_size: int, network: Network, world: World):
        super().__init__(rank, world_size, network)
        self._world = world
        self._wires = world.wires
        self._clock = world.wires.clocks[rank]
        self._eager = network.eager_limit
        self._unwaited: dict = {}  # isend handles not yet waited on (SendWork.guard)

    def now(self) -> float:
        """This rank's logical clock, in seconds since the run started."""
        return self._clock.now

    def _compute(self, seconds: float) -> None:
        self._world.check()
        self._clock.now += seconds

    # A message's channel is its tag: built-in collectives send no messages here.
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        view = flat_view(tensor)
        data = view.clone() if view.numel() else view  # the bytes as posted (SendWork checks)
        guard = (self, view, data, view._version, dst, tag) if view.numel() else None
        nbytes = data.nbytes
        start, dur, end = self._wires.depart(self.rank, dst, nbytes)  # Step 2
        op = self._scopes[-1] if self._scopes else "send"
        rdv = (None if nbytes <= self._eager else  # rendezvous: waits for its receive
               RendezvousWork(self._world, self.rank, dst, tag, nbytes, self._clock, end, guard))
        self._world.deliver(Message(data, self.rank, tag, start, dur, op, nbytes,
                                    self._wires.left, rdv), dst)
        return rdv or SendWork(self._clock, end, guard)

    def _returned(self, result):
        """`fn`'s result, unless this rank left sends never waited on (see SendWork)."""
        for g in self._unwaited.values():  # the first one is enough to name the mistake
            raise RuntimeError(
                f"rank {self.rank} returned with {len(self._unwaited)} isend(s) never waited on "
                f"(first to rank {g[4]}, tag {g[5]}): on Gloo and NCCL a send is complete, and "
                "its buffer free, only once wait() returns; wait() on every isend handle")
        return result

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        handle = RecvWork(self.arrive, self.rank, src, tag, tensor, self._clock.now)
        self._world.post(self.rank, handle)
        return handle

    def arrive(self, handle: RecvWork):
        """Wait for `handle`'s message, book the receive port, advance the clock."""
        msg = handle.msg or self._world.wait(self.rank, handle)
        t = self._wires.arrive(self.rank, msg.src, msg.start, msg.dur, msg.nbytes)  # Step 4
        self._clock.advance(t)
        self._world.trace.add(msg.src, self.rank, msg.nbytes, msg.chan, msg.what, msg.left, t)
        return msg.data

    def _recv_any(self, tensor: torch.Tensor, tag: int) -> int:
        msg = self._world.recv_any(self.rank, tag)  # earliest in logical time
        handle = RecvWork(self.arrive, self.rank, msg.src, msg.chan, tensor, self._clock.now)
        handle.msg = msg
        handle.wait()  # books the receive port, advances the clock, checks, copies
        return msg.src

    def _collective(self, call: Call) -> Work:
        call.name = self._scopes[-1] if self._scopes else call.kind
        return self._world.join(self.rank, call)

    def _all_reduce(self, tensor, op, async_op):
        return self._collective(Call("all_reduce", self.rank, tensor, op=op))

    def _reduce_scatter(self, output, inputs, op, async_op):
        return self._collective(Call("reduce_scatter", self.rank, output, list(inputs), op=op))

    def _all_gather(self, outputs, tensor, async_op):
        return self._collective(Call("all_gather", self.rank, tensor, list(outputs)))

    def _broadcast(self, tensor, src, async_op):
        return self._collective(Call("broadcast", self.rank, tensor, root=src))

    def _reduce(self, tensor, dst, op, async_op):
        return self._collective(Call("reduce", self.rank, tensor, op=op, root=dst))

    def _barrier(self, async_op):
        return self._collective(Call("barrier", self.rank))


def run(fn, world_size: int, args=(), kwargs=None, *, network: Network | None = None,
        timeout: float | None = None, output: str = "live",
        scheduler: str = "auto", progress=None) -> RunResult:
    """Run `fn(comm, *args, **kwargs)` on `world_size` simulated ranks; return a `RunResult`.

    Raises `WorkerError` (the lowest rank that raised), `DeadlockError` (every unfinished rank
    waits; it names what each waits for) or, after `timeout` real seconds, `TimeoutError`.

    Args:
        fn: the worker, the same function `launch.run` takes.
        world_size: simulated ranks, 1..4096.
        args, kwargs: passed to `fn` on every rank (default none).
        network: the `Network` the logical clock follows (default None: zero latency,
            infinite bandwidth, so only the counts matter).
        timeout: real seconds before the run is stopped (default None: 300.0).
        output: "live" (default), "ordered" or "quiet", as for `launch.Pool`.
        scheduler: "auto" (default: threads up to 64 ranks, then greenlets), "thread" or
            "greenlet" (sim_sched.py).
        progress: None/False (default, no bar), True (a tqdm bar) or anything with
            `.update(n)`, told of point-to-point messages.

    `.seconds` of the result is the logical time of the slowest rank.
    """
    check_ranks(world_size, MAX_WORLD_SIZE, network, timeout, output)
    check_call(fn, args, kwargs)
    check_progress(progress)
    network = network or Network()
    timeout = float(DEFAULT_TIMEOUT if timeout is None else timeout)
    sched = make(scheduler, world_size)
    if progress is True:
        from tqdm.auto import tqdm  # only when asked for: importing it costs a little

        bar = tqdm(desc=f"{world_size} simulated ranks", unit=" messages", unit_scale=True)
    else:
        bar = None if progress is False else progress
    try:
        with rank_output.capture(output) as sink:
            return _run(fn, world_size, args, kwargs, network, timeout, sink, sched, bar)
    finally:
        if progress is True:
            bar.close()


def _run(fn, world_size, args, kwargs, network, timeout, sink, sched, bar) -> RunResult:
    world = World(world_size, sink, sched, Wires(network, world_size), bar)
    world.timeout_error = lambda ranks: TimeoutError(
        f"sim.run: ranks {_some(ranks)} still running after {timeout} s of real time", ranks)
    comms = [SimComm(r, world_size, network, world) for r in range(world_size)]
    world.ledgers = [c.ledger for c in comms]  # built-ins count their messages here
    args, kwargs = tuple(args), dict(kwargs or {})
    # the arguments' one stop
    world.launch(comms, lambda comm: comm._returned(fn(comm, *args, **kwargs)))
    try:
        if not world.sched.drive(world, timeout) and world.error is None:
            world.stop_for_timeout()
    except BaseException:  # e.g. KeyboardInterrupt in a notebook: stop the ranks first
        world.stop(RuntimeError("sim.run was interrupted"))
        raise
    finally:
        world.sched.join()
    error = world.outcome()
    if error is not None:
        raise error
    if bar is not None:
        bar.update(world.sent % PROGRESS_EVERY)  # the messages since the last update
    seconds = max(c.now() for c in comms)
    return RunResult(world.results, Ledger([c.ledger for c in comms]), seconds, world.trace)


def _some(ranks: list[int]) -> str:
    """[0, 1, 2] or, for long lists, [0, 1, ..., 1023] (the error's .ranks has them all)."""
    if len(ranks) <= 16:
        return str(ranks)
    return "[" + ", ".join(map(str, ranks[:8])) + f", ... {ranks[-1]}] ({len(ranks)} ranks)"
