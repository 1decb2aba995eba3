"""Simulated ranks: N ranks in one process, in-memory links, a logical clock.

`run(fn, world_size)` calls `fn(comm, *args, **kwargs)` on `world_size`
`SimComm`s (threads, or greenlets for large runs: sim_sched.py) and returns a
`RunResult` whose `.seconds` is logical time under a `Network` model, with
`.ledger` (every byte counted from a message) and `.trace` (every message).
The values are real, the time is the model's, and the same call always gives
the same values, ledger, trace and seconds: one rank runs at a time and hands
over when it must wait (sim_delivery.py), so even the order of prints repeats.

One send, in the order of the files it passes through:

1. the call (this file): `comm.isend(t, dst)` copies `t` (its buffer is free
   at once) and charges the ledger ("counted", base.py);
2. the links and the clock (sim_links.py, `Wires.depart`): it leaves when the
   sender's send port is free, start = max(clock, port free), and holds the
   port for latency + n / bandwidth under `latency_model="port"` (lockstep,
   Hockney 1994; single-port, full-duplex, Thakur, Rabenseifner & Gropp 2005),
   or n / bandwidth under "wire" (latency in flight: LogGP, NCCL), plus the
   seeded jitter and loss of the sender's random stream; between nodes of a
   cluster it also books n / inter bandwidth on its node's NIC;
3. delivery (sim_delivery.py): matched to the receiver's posted receive or
   queued in its mailbox, by (source, tag); a send above `eager_limit` is
   rendezvous: its `wait()` parks until the receive is posted, so an unsafe
   exchange raises `DeadlockError` naming each rank and what it waits for;
4. the handles (sim_handles.py): `recv` books the receiver's port (and NIC) at
   the first free slot from the message's start (`Wires.arrive`), moves its
   clock to max(clock, arrival), copies the data and traces the message; `send`
   moves the sender's clock to when its port is free again, so compute between
   `isend` and `wait` overlaps the transfer.

So two messages out of one rank (or into one) take turns, as on one NIC: a
naive allreduce at its root pays 2(N-1)(alpha + S/bandwidth), a ring
2(N-1)(alpha + S/(N bandwidth)), the textbook formulas (alphabeta.py).

Built-in collectives run as message schedules once every rank has joined
(sim_collectives.py; `Network.builtin_algorithm`), each message through steps
2-4: `all_reduce` a ring reduce-scatter then ring all-gather (Patarasuk & Yuan
2009), rank r owning chunk r in between; `reduce_scatter` and `all_gather` those
rings alone; `broadcast` and `reduce` a chain along the ring or a binomial
tree; `barrier` dissemination (Hensgen et al. 1988): ceil(log2 N) rounds of
empty messages. A ring on a flat, noiseless network takes a fast path with the
same results (sim_fast.py). Arithmetic is free in the model.
"""

from __future__ import annotations

import torch

from . import rank_output
from .base import Comm, Work
from .errors import DeadlockError, WorkerError  # noqa: F401 - public as sim.DeadlockError, ...
from .errors import TimeoutError as RunTimeoutError
from .ledger import Ledger
from .network import Network
from .runs import (
    RunResult,
    check_call,
    check_network,
    check_output,
    check_progress,
    check_timeout,
    check_world_size,
)
from .sim_collectives import Call
from .sim_delivery import PROGRESS_EVERY, World
from .sim_handles import RecvWork, RendezvousWork, SendWork, flat_view
from .sim_links import Message, Wires
from .sim_sched import make, pick

__all__ = ["SimComm", "run", "MAX_WORLD_SIZE", "DEFAULT_TIMEOUT"]
TimeoutError = RunTimeoutError  # public as sim.TimeoutError, like launch.TimeoutError

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

    def now(self) -> float:
        """This rank's logical clock, in seconds since the run started."""
        return self._clock.now

    def _compute(self, seconds: float) -> None:
        self._world.check()
        self._clock.now += seconds

    # A message's channel is its tag: built-in collectives send no messages here.
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        data = flat_view(tensor)
        if data.numel():  # copied now: the buffer is free at once (an empty one has no data)
            data = data.clone()
        nbytes = data.nbytes
        wires = self._wires
        start, dur, end = wires.depart(self.rank, dst, nbytes)  # Step 1
        left = wires.left
        op = self._scopes[-1] if self._scopes else "send"
        work = (SendWork(self._clock, end) if nbytes <= self._eager else
                RendezvousWork(self._world, self.rank, dst, tag, nbytes, self._clock, end))
        rdv = work if nbytes > self._eager else None
        self._world.deliver(Message(data, self.rank, tag, start, dur, op, nbytes, left, rdv), dst)
        return work

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        handle = RecvWork(self.arrive, self.rank, src, tag, tensor, "recv", self._clock.now)
        self._world.post(self.rank, handle)
        return handle

    def arrive(self, handle: RecvWork):
        """Wait for `handle`'s message, book the receive port, advance the clock."""
        msg = handle.msg or self._world.wait(self.rank, handle)
        t = self._wires.arrive(self.rank, msg.src, msg.start, msg.dur, msg.nbytes)  # Step 2
        self._clock.advance(t)  # Step 3
        self._world.trace.add(msg.src, self.rank, msg.nbytes, msg.chan, msg.what, msg.left, t)
        return msg.data

    def _recv_any(self, tensor: torch.Tensor, tag: int) -> int:
        msg = self._world.recv_any(self.rank, tag)  # earliest in logical time
        handle = RecvWork(self.arrive, self.rank, msg.src, msg.chan, tensor, "recv",
                          self._clock.now)
        handle.msg = msg
        handle.wait()  # books the receive port, advances the clock, checks, copies
        return msg.src

    def _charge_builtin(self, op: str, **charge) -> None:
        """Only the call: its bytes are counted from its messages (sim_collectives.py)."""
        self.ledger.record(self._scopes[-1] if self._scopes else op, kind="counted")

    def _collective(self, call: Call, async_op: bool) -> Work | None:
        call.name = self._scopes[-1] if self._scopes else call.kind
        handle = self._world.join(self.rank, call)
        if async_op:
            return handle
        handle.wait()
        return None

    def _all_reduce(self, tensor, op, async_op):
        return self._collective(Call("all_reduce", self.rank, tensor, op=op), async_op)

    def _reduce_scatter(self, output, inputs, op, async_op):
        return self._collective(Call("reduce_scatter", self.rank, output, list(inputs), op=op),
                                async_op)

    def _all_gather(self, outputs, tensor, async_op):
        return self._collective(Call("all_gather", self.rank, tensor, list(outputs)), async_op)

    def _broadcast(self, tensor, src, async_op):
        return self._collective(Call("broadcast", self.rank, tensor, root=src), async_op)

    def _reduce(self, tensor, dst, op, async_op):
        return self._collective(Call("reduce", self.rank, tensor, op=op, root=dst), async_op)

    def _barrier(self, async_op):
        return self._collective(Call("barrier", self.rank), async_op)


def run(fn, world_size: int, args=(), kwargs=None, *, network: Network | None = None,
        timeout: float | None = None, output: str = "live",
        scheduler: str = "auto", progress=None) -> RunResult:
    """Run `fn(comm, *args, **kwargs)` on `world_size` simulated ranks.

    Returns a `RunResult`: the values, `.ledger` (all "counted"), `.trace` (every
    message) and `.seconds`, the latest final logical clock under `network`
    (default `Network()`: no latency, infinite bandwidth, so 0.0 unless a rank
    calls `comm.compute`). Raises `WorkerError` (the lowest rank that raised),
    `DeadlockError` (every unfinished rank waits for a message that cannot come)
    or `TimeoutError` (`.ranks`) after `timeout` real seconds (default 300); every
    rank is stopped first. `output`: "live", "ordered" or "quiet", as for
    `launch.run`. `scheduler`: "thread" (safe for anything, e.g. collectives inside
    a backward), "greenlet" (thousands of ranks) or "auto" (threads up to 64
    ranks; sim_sched.py). `progress`: None/False, True (a tqdm bar of point-to-point
    messages) or anything with `.update(n)`, told every 4096 messages and of the
    rest at the end (built-in collectives are not counted).
    """
    network, timeout = _check_run(fn, world_size, args, kwargs, network, timeout)
    check_output(output)
    check_progress(progress)
    kind = pick(scheduler, world_size)
    bar = _bar(world_size) if progress is True else (None if progress is False else progress)
    try:
        with rank_output.capture(output) as sink:
            return _run(fn, world_size, args, kwargs, network, timeout, sink, kind, bar)
    finally:
        if progress is True:
            bar.close()


def _bar(world_size: int):
    from tqdm.auto import tqdm  # only when asked for: importing it costs a little

    return tqdm(desc=f"{world_size} simulated ranks", unit=" messages", unit_scale=True)


def _run(fn, world_size, args, kwargs, network, timeout, sink, kind, bar=None) -> RunResult:
    world = World(world_size, sink, make(kind, world_size), Wires(network, world_size))
    world.progress = bar
    world.timeout_error = lambda ranks: RunTimeoutError(
        f"sim.run: ranks {_some(ranks)} still running after {timeout} s of real time", ranks)
    comms = [SimComm(r, world_size, network, world) for r in range(world_size)]
    world.ledgers = [c.ledger for c in comms]  # built-ins count their messages here
    args, kwargs = tuple(args), dict(kwargs or {})
    world.launch(comms, lambda comm: fn(comm, *args, **kwargs))  # the arguments' one stop
    try:
        if not world.sched.drive(world, timeout) and world.error is None:
            world.stop_for_timeout()
    except BaseException:  # e.g. KeyboardInterrupt in a notebook: stop the ranks first
        world.stop(RuntimeError("sim.run was interrupted"))
        world.sched.join(world.Cancelled)
        raise
    world.sched.join(world.Cancelled)
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


def _check_run(fn, world_size, args, kwargs, network, timeout):
    check_world_size(world_size, MAX_WORLD_SIZE)
    check_call(fn, args, kwargs)
    check_network(network, world_size)
    check_timeout(timeout)
    return (network or Network()), float(DEFAULT_TIMEOUT if timeout is None else timeout)
