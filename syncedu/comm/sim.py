"""Simulated ranks: N threads in one process, in-memory links, a logical clock.

`run(fn, world_size)` calls `fn(comm, *args, **kwargs)` on `world_size`
`SimComm`s, one thread each, and returns a `RunResult` whose `.seconds` is
logical time under a `Network` model, not wall-clock time. This is how a laptop
"runs" 256 GPUs: the values are real, the time is the model's, and the same
call always gives the same values, ledger and seconds.

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

import ctypes
import threading
import traceback

import torch

from .base import Comm, Work
from .errors import TimeoutError as RunTimeoutError
from .ledger import Ledger, ring_chunks
from .network import Network
from .result import RunResult
from .sim_world import Cancelled, Message, RecvPort, World

__all__ = ["SimComm", "run", "MAX_WORLD_SIZE", "DEFAULT_TIMEOUT"]

MAX_WORLD_SIZE = 4096
DEFAULT_TIMEOUT = 300.0  # real seconds before a run is stopped
_COLL = "collective"  # the channel of built-in collectives, apart from user tags


class SendWork(Work):
    """Handle of an `isend`: `wait()` moves the clock to when the send port is done."""

    __slots__ = ("comm", "end")

    def __init__(self, comm: SimComm, end: float):
        self.comm, self.end = comm, end

    def wait(self, timeout: float | None = None) -> None:
        self.comm._advance(self.end)


class RecvWork(Work):
    """Handle of an `irecv`: `wait()` blocks until the message is in, then copies it."""

    __slots__ = ("comm", "src", "chan", "tensor", "nbytes", "what", "msg", "done")

    def __init__(self, comm: SimComm, src: int, chan, tensor, what: str):
        self.comm, self.src, self.chan, self.tensor, self.what = comm, src, chan, tensor, what
        self.nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        self.msg: Message | None = None
        self.done = False

    def wait(self, timeout: float | None = None) -> None:
        if self.done:
            return
        data = self.comm._arrive(self, timeout)
        _check_match(self, data)
        self.tensor.detach().view(-1).copy_(data)
        self.done = True


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
        self._op_name = "recv"

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

    def _arrive(self, handle: RecvWork, timeout: float | None = None):
        """Wait for `handle`'s message, book the receive port, advance the clock."""
        msg = self._world.wait(self.rank, handle, timeout)
        slot = self._recv_port.reserve(msg.start, msg.dur)  # Step 2
        self._advance(slot + msg.dur)  # Step 3
        return msg.data

    def _exchange(self, data, dst: int, src: int) -> torch.Tensor | None:
        """Send `data` (copied) to `dst` and receive from `src` at the same time."""
        what = self._op_name
        handle = self._post(src, _COLL, None, what)
        end = self._put(None if data is None else data.clone(), dst, _COLL, what)
        got = self._arrive(handle)
        if handle.msg.what != what:
            raise RuntimeError(f"rank {self.rank} called {what} but rank {src} called "
                               f"{handle.msg.what}: every rank must call the same "
                               "collectives in the same order")
        self._advance(end)
        return got

    # ------------------------------------------------------ point-to-point
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        self._world.check()
        data = tensor.detach().view(-1).clone()  # copied now: the buffer is free at once
        return SendWork(self, self._put(data, dst, ("tag", tag), "send"))

    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return self._post(src, ("tag", tag), tensor, "recv")

    # --------------------------------------------------------- collectives
    def _all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        self._op_name = "all_reduce"
        flat = tensor.detach().view(-1)
        chunks = flat.split(ring_chunks(flat.numel(), self.world_size))
        self._ring_reduce_scatter(list(chunks), op)
        self._ring_all_gather(list(chunks))

    def _reduce_scatter(self, output: torch.Tensor, inputs: list, op: str) -> None:
        self._op_name = "reduce_scatter"
        # Work on copies: the inputs stay as they were; chunk r ends up reduced.
        chunks = [t.detach().view(-1).clone() for t in inputs]
        self._ring_reduce_scatter(chunks, op)
        output.detach().view(-1).copy_(chunks[self.rank])

    def _all_gather(self, outputs: list, tensor: torch.Tensor) -> None:
        self._op_name = "all_gather"
        chunks = [t.detach().view(-1) for t in outputs]
        chunks[self.rank].copy_(tensor.detach().view(-1))
        self._ring_all_gather(chunks)

    def _ring_reduce_scatter(self, chunks: list, op: str) -> None:
        """N-1 steps; in step s rank r sends chunk r-1-s and adds in chunk r-2-s."""
        n, r = self.world_size, self.rank
        for s in range(n - 1):
            got = self._exchange(chunks[(r - 1 - s) % n], (r + 1) % n, (r - 1) % n)
            _combine(chunks[(r - 2 - s) % n], got, op)

    def _ring_all_gather(self, chunks: list) -> None:
        """N-1 steps; in step s rank r forwards chunk r-s and receives chunk r-1-s."""
        n, r = self.world_size, self.rank
        for s in range(n - 1):
            got = self._exchange(chunks[(r - s) % n], (r + 1) % n, (r - 1) % n)
            chunks[(r - 1 - s) % n].copy_(got)

    def _broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._op_name = "broadcast"
        n, r = self.world_size, self.rank
        flat = tensor.detach().view(-1)
        if r != src:
            flat.copy_(self._take((r - 1) % n))
        if r != (src - 1) % n:  # the chain ends at src - 1
            self._give(flat, (r + 1) % n)

    def _reduce(self, tensor: torch.Tensor, dst: int, op: str) -> None:
        self._op_name = "reduce"
        n, r = self.world_size, self.rank
        acc = tensor.detach().view(-1)
        if r != dst:
            acc = acc.clone()  # only dst's tensor changes
        if r != (dst + 1) % n:  # the chain starts at dst + 1
            _combine(acc, self._take((r - 1) % n), op)
        if r != dst:
            self._give(acc, (r + 1) % n)

    def _barrier(self) -> None:
        self._op_name = "barrier"
        n, r, dist = self.world_size, self.rank, 1
        while dist < n:  # after round k, each rank has heard from 2^k ranks
            self._exchange(None, (r + dist) % n, (r - dist) % n)
            dist *= 2

    def _take(self, src: int) -> torch.Tensor:
        handle = self._post(src, _COLL, None, self._op_name)
        data = self._arrive(handle)
        if handle.msg.what != self._op_name:
            raise RuntimeError(f"rank {self.rank} called {self._op_name} but rank {src} "
                               f"called {handle.msg.what}: every rank must call the same "
                               "collectives in the same order")
        return data

    def _give(self, data: torch.Tensor, dst: int) -> None:
        self._advance(self._put(data.clone(), dst, _COLL, self._op_name))


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


def _check_match(handle: RecvWork, data: torch.Tensor) -> None:
    t, comm = handle.tensor, handle.comm
    if data.dtype != t.dtype or data.numel() != t.numel():
        raise ValueError(
            f"rank {comm.rank} posted a receive of {t.numel()} x {t.dtype} from rank "
            f"{handle.src} (tag {handle.chan[1]}), but rank {handle.src} sent "
            f"{data.numel()} x {data.dtype}: sender and receiver must agree on dtype "
            "and number of elements")
