"""Simulated ranks: N threads in one process, in-memory links, a logical clock.

`run(fn, world_size)` calls `fn(comm, *args, **kwargs)` on `world_size`
`SimComm`s, one thread each, and returns a `RunResult` whose `.seconds` is
logical time under a `Network` model, not wall-clock time. This is how a laptop
"runs" 256 GPUs: the values are real, the time is the model's, and the same
call always gives the same values, ledger and seconds. One rank runs at a time
and hands over when it must wait (sim_world.py), so even the order of prints
repeats.

The time model (alpha-beta, Hockney 1994; single-port, full-duplex, Thakur,
Rabenseifner & Gropp 2005): every rank has a logical clock, a send port and a
receive port. A message of n bytes sent at clock t:

1. leaves when the sender's send port is free: start = max(t, port free);
   it holds the port for d = latency + n / bandwidth (+ the network's seeded
   jitter and loss-retransmit delay, drawn from the sender's random stream);
2. comes in at the first free slot of d seconds at the receiver's receive port,
   from `start` on: arrival = slot + d. Messages to one rank queue there;
3. `recv` (or `irecv(...).wait()`) moves the receiver's clock to
   max(clock, arrival); `send` (or `isend(...).wait()`) moves the sender's
   clock to start + d, when its buffer could be reused. `isend` itself returns
   at once, so compute between `isend` and `wait` overlaps the transfer;
4. `comm.compute(seconds)` adds seconds times the rank's slowdown factor.

So a rank sends one message and receives another at the same time, but two
messages out of one rank (or into one) take turns, as on one NIC: a naive
allreduce at its root pays 2(N-1)(alpha + S/bandwidth), a ring
2(N-1)(alpha + S/(N bandwidth)), as in the textbook formulas.

The built-in collectives of `SimComm` are charged as a ring would send them:
the ledger by `Comm` (base.py), the time by running that ring (or chain) here
on internal messages that the ledger does not see. Steps:

- `all_reduce`: ring reduce-scatter then ring all-gather over `ring_chunks`
  (Patarasuk & Yuan 2009), rank r owning chunk r after the reduce-scatter;
- `reduce_scatter`, `all_gather`: the same two rings on their own;
- `broadcast`: a chain src -> src+1 -> ... -> src-1, one whole message each;
- `reduce`: a chain dst+1 -> ... -> dst, each rank adding its own tensor;
- `barrier`: dissemination (Hensgen et al. 1988): ceil(log2 N) rounds of empty
  messages, so it costs ceil(log2 N) latencies and no bytes.

Arithmetic is free in the model: only the wires cost time.

Used in: notebooks/00_start_here, 02_allreduce_algorithms, 04_parameter_server.
"""

from __future__ import annotations

import torch

from . import rank_output
from .base import Comm, Work
from .checks import check_call, check_network, check_output, check_timeout, check_world_size
from .errors import TimeoutError as RunTimeoutError
from .ledger import Ledger
from .network import Network
from .result import RunResult
from .sim_messages import Message, RecvPort, RecvWork, SendWork, flat_view
from .sim_world import World

__all__ = ["SimComm", "run", "MAX_WORLD_SIZE", "DEFAULT_TIMEOUT"]

MAX_WORLD_SIZE = 4096
DEFAULT_TIMEOUT = 300.0  # real seconds before a run is stopped
_COLL = "collective"  # the channel of built-in collectives, apart from user tags


class SimComm(Comm):
    """One simulated rank; made by `run`, one per thread."""

    backend = "sim"
    device = torch.device("cpu")

    def __init__(self, rank: int, world_size: int, network: Network, world: World):
        super().__init__(rank, world_size, network)
        self._world = world
        self._clock = 0.0
        self._send_free = 0.0
        self._recv_port = RecvPort()
        self._rng = None if network.deterministic else network.rng(rank)
        self._op_name = ""  # the built-in collective running now

    # ------------------------------------------------------------ the clock
    def now(self) -> float:
        """This rank's logical clock, in seconds since the run started."""
        return self._clock

    def _compute(self, seconds: float) -> None:
        self._world.check()
        self._clock += seconds

    def _advance(self, t: float) -> None:
        if t > self._clock:
            self._clock = t

    # ------------------------------------------------- internal messages
    def _put(self, data: torch.Tensor | None, dst: int, chan, what: str) -> float:
        """Send a private copy `data` to `dst`; return when the send port is free."""
        net = self.network
        nbytes = data.numel() * data.element_size() if data is not None else 0
        dur = net.latency + nbytes / net.bandwidth
        if self._rng is not None:
            dur += net.noise(self._rng)
        start = max(self._clock, self._send_free)  # Step 1: wait for the send port
        self._send_free = start + dur
        self._world.deliver(Message(data, self.rank, chan, start, dur, what), dst)
        return start + dur

    def _post(self, src: int, chan, tensor, what: str) -> RecvWork:
        handle = RecvWork(self, src, chan, tensor, what)
        self._world.post(self.rank, handle)
        return handle

    def _arrive(self, handle: RecvWork):
        """Wait for `handle`'s message, book the receive port, advance the clock."""
        msg = self._world.wait(self.rank, handle)
        slot = self._recv_port.reserve(msg.start, msg.dur)  # Step 2
        self._advance(slot + msg.dur)  # Step 3
        return msg.data

    def _exchange(self, data, dst: int, src: int, like=None) -> torch.Tensor | None:
        """Send `data` (copied) to `dst` and receive from `src` at the same time."""
        handle = self._post(src, _COLL, None, self._op_name)
        end = self._put(None if data is None else data.clone(), dst, _COLL, self._op_name)
        got = self._take(handle, like)
        self._advance(end)
        return got

    def _take(self, handle: RecvWork, like=None) -> torch.Tensor | None:
        """Wait for a collective's message; check it is from the same call and size."""
        data = self._arrive(handle)
        what, theirs = handle.what, handle.msg.what
        if theirs != what:
            raise RuntimeError(f"rank {self.rank} called {what} but rank {handle.src} called "
                               f"{theirs}: every rank must call the same collectives in the "
                               "same order")
        if like is not None and (data.numel() != like.numel() or data.dtype != like.dtype):
            raise RuntimeError(f"rank {self.rank}'s {what} got {data.numel()} x {data.dtype} "
                               f"from rank {handle.src} where it expected {like.numel()} x "
                               f"{like.dtype}: every rank must pass tensors of the same shape "
                               "and dtype")
        return data

    def _take_from(self, src: int, like: torch.Tensor) -> torch.Tensor:
        return self._take(self._post(src, _COLL, None, self._op_name), like)

    def _give(self, data: torch.Tensor, dst: int) -> None:
        self._advance(self._put(data.clone(), dst, _COLL, self._op_name))

    # ------------------------------------------------------ point-to-point
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        data = flat_view(tensor).clone()  # copied now: the buffer is free at once
        return SendWork(self, self._put(data, dst, ("tag", tag), "send"))

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return self._post(src, ("tag", tag), tensor, "recv")

    def _recv_any(self, tensor: torch.Tensor, tag: int) -> int:
        msg = self._world.recv_any(self.rank, ("tag", tag))  # earliest in logical time
        handle = RecvWork(self, msg.src, msg.chan, tensor, "recv")
        handle.msg = msg
        handle.wait()  # books the receive port, advances the clock, checks, copies
        return msg.src

    # --------------------------------------------------------- collectives
    def _all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        self._op_name = "all_reduce"
        flat = flat_view(tensor)
        n = self.world_size
        part = self._ring_reduce_scatter(lambda k: _chunk(flat, k, n), op)
        _chunk(flat, self.rank, n).copy_(part)
        self._ring_all_gather(lambda k: _chunk(flat, k, n))

    def _reduce_scatter(self, output: torch.Tensor, inputs: list, op: str) -> None:
        self._op_name = "reduce_scatter"
        flat_view(output).copy_(self._ring_reduce_scatter(lambda k: flat_view(inputs[k]), op))

    def _all_gather(self, outputs: list, tensor: torch.Tensor) -> None:
        self._op_name = "all_gather"
        flat_view(outputs[self.rank]).copy_(flat_view(tensor))
        self._ring_all_gather(lambda k: flat_view(outputs[k]))

    def _ring_reduce_scatter(self, mine, op: str) -> torch.Tensor:
        """N-1 steps; in step s rank r sends its partial chunk r-1-s and adds its own
        `mine(k)` to the partial chunk k = r-2-s it receives. Returns chunk r, reduced."""
        n, r = self.world_size, self.rank
        part = mine((r - 1) % n)
        for s in range(n - 1):
            own = mine((r - 2 - s) % n)
            part = self._exchange(part, (r + 1) % n, (r - 1) % n, own)
            _combine(part, own, op)  # `part` is the message's private copy
        return part

    def _ring_all_gather(self, chunk) -> None:
        """N-1 steps; in step s rank r forwards chunk r-s and receives chunk r-1-s."""
        n, r = self.world_size, self.rank
        for s in range(n - 1):
            into = chunk((r - 1 - s) % n)
            into.copy_(self._exchange(chunk((r - s) % n), (r + 1) % n, (r - 1) % n, into))

    def _broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._op_name = "broadcast"
        n, r = self.world_size, self.rank
        flat = flat_view(tensor)
        if r != src:
            flat.copy_(self._take_from((r - 1) % n, flat))
        if r != (src - 1) % n:  # the chain ends at src - 1
            self._give(flat, (r + 1) % n)

    def _reduce(self, tensor: torch.Tensor, dst: int, op: str) -> None:
        self._op_name = "reduce"
        n, r = self.world_size, self.rank
        acc = flat_view(tensor)
        if r != dst:
            acc = acc.clone()  # only dst's tensor changes
        if r != (dst + 1) % n:  # the chain starts at dst + 1
            _combine(acc, self._take_from((r - 1) % n, acc), op)
        if r != dst:
            self._give(acc, (r + 1) % n)

    def _barrier(self) -> None:
        self._op_name = "barrier"
        n, r, dist = self.world_size, self.rank, 1
        while dist < n:  # after round k, each rank has heard from 2^k ranks
            self._exchange(None, (r + dist) % n, (r - dist) % n)
            dist *= 2


def _chunk(flat: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """Chunk k of `n` of `flat`, as `ring_chunks` splits it (first chunks one longer)."""
    base, extra = divmod(flat.numel(), n)
    return flat.narrow(0, k * base + min(k, extra), base + (k < extra))


def _combine(acc: torch.Tensor, data: torch.Tensor, op: str) -> None:
    """acc = acc (op) data, in place and in acc's dtype."""
    if op == "sum":
        acc.add_(data)
    elif op == "prod":
        acc.mul_(data)
    elif op == "max":
        torch.maximum(acc, data, out=acc)
    else:
        torch.minimum(acc, data, out=acc)


# ------------------------------------------------------------------ run
def run(fn, world_size: int, args=(), kwargs=None, *, network: Network | None = None,
        timeout: float | None = None, output: str = "live") -> RunResult:
    """Run `fn(comm, *args, **kwargs)` on `world_size` simulated ranks (threads).

    Returns a `RunResult`: the ranks' return values, `.ledger`, and `.seconds`,
    the latest final logical clock under `network` (default `Network()`: zero
    latency, infinite bandwidth, so 0.0 unless a rank calls `comm.compute`).
    Raises `WorkerError` if a rank raised (the lowest such rank), `DeadlockError`
    if every unfinished rank waits for a message that cannot come, and
    `TimeoutError` (`.ranks`: the unfinished ones) after `timeout` real seconds
    (default 300). Every rank's thread is stopped before it returns or raises.
    What ranks print is marked `[rank r]`; `output` is "live", "ordered" (rank 0's
    lines first, then rank 1's, ...) or "quiet", as for `launch.run`.
    """
    network, timeout = _check_run(fn, world_size, args, kwargs, network, timeout)
    check_output(output)
    with rank_output.capture(output) as sink:
        return _run(fn, world_size, args, kwargs, network, timeout, sink)


def _run(fn, world_size, args, kwargs, network, timeout, sink) -> RunResult:
    world = World(world_size, sink)
    comms = [SimComm(r, world_size, network, world) for r in range(world_size)]
    world.launch(comms, fn, tuple(args), dict(kwargs or {}))
    try:
        if not world.all_done.wait(timeout):
            ranks = world.unfinished()
            world.stop(RunTimeoutError(f"sim.run: ranks {ranks} still running after "
                                       f"{timeout} s of real time", ranks))
    except BaseException:  # e.g. KeyboardInterrupt in a notebook: stop the ranks first
        world.stop(RuntimeError("sim.run was interrupted"))
        world.join()
        raise
    world.join()
    error = world.outcome()
    if error is not None:
        raise error
    seconds = max(c.now() for c in comms)
    return RunResult(world.results, Ledger([c.ledger for c in comms]), seconds)


def _check_run(fn, world_size, args, kwargs, network, timeout):
    check_world_size(world_size, MAX_WORLD_SIZE)
    check_call(fn, args, kwargs)
    check_network(network, world_size)
    check_timeout(timeout)
    return (network or Network()), float(DEFAULT_TIMEOUT if timeout is None else timeout)
