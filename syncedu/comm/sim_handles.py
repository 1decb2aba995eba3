"""Step 4 of a simulated message: the handles a rank waits on, which copy data into place.

`isend` returns a `SendWork` (eager: `wait()` moves the clock to when the send
port is done) or a `RendezvousWork` (above `eager_limit`: `wait()` parks until the
receiver posted the matching receive); `irecv` returns a `RecvWork`, whose
`wait()` parks until the message is delivered (sim_delivery.py), books the
receive port (sim_links.py) and copies the data in. See sim.py for the story.
"""

from __future__ import annotations

import torch

from .base import Work
from .sim_links import Clock, Message


class SendWork(Work):
    """Handle of an `isend`: `wait()` moves the clock to when the send port is done."""

    __slots__ = ("clock", "end")

    def __init__(self, clock: Clock, end: float):
        self.clock, self.end = clock, end

    def wait(self, timeout: float | None = None) -> None:
        self.clock.advance(self.end)


class RendezvousWork(Work):
    """Handle of an `isend` above the network's `eager_limit` (see network.py).

    `wait()` parks the sender until the receiver has posted the matching receive
    (`matched`, called by sim_delivery.py), then moves its clock to the later of its
    send port's end and the moment that receive was posted.
    """

    __slots__ = ("world", "rank", "dst", "chan", "nbytes", "clock", "end", "msg", "posted")

    def __init__(self, world, rank: int, dst: int, chan, nbytes: int, clock: Clock, end: float):
        self.world, self.rank, self.dst, self.chan = world, rank, dst, chan
        self.nbytes, self.clock, self.end = nbytes, clock, end
        self.msg = None  # True once a receive matched it
        self.posted = 0.0

    def matched(self, posted: float) -> None:
        self.msg, self.posted = True, posted

    def wait(self, timeout: float | None = None) -> None:
        if self.msg is None:
            self.world.wait(self.rank, self)
        self.clock.advance(max(self.end, self.posted))

    def describe(self, world) -> str:
        text = (f"send to rank {self.dst} (tag {self.chan}, {self.nbytes} bytes > eager_limit "
                f"{world.wires.net.eager_limit:g}): waits for rank {self.dst} to post the "
                "matching receive")
        if world.ranks[self.dst].done:
            text += f"; rank {self.dst} has already returned"
        return text


class RecvWork(Work):
    """Handle of an `irecv`: `wait()` blocks until the message is in, then copies it.

    `arrive(handle)` (the comm's) waits, books the ports and returns the data.
    `timeout` is accepted for the `Work` interface but not needed: a simulated
    wait either completes or is reported at once as a `DeadlockError`.
    """

    __slots__ = ("arrive", "rank", "src", "chan", "tensor", "nbytes", "what", "msg", "done",
                 "at")

    def __init__(self, arrive, rank: int, src: int, chan, tensor, what: str, at: float = 0.0):
        self.arrive, self.rank, self.src, self.chan = arrive, rank, src, chan
        self.tensor, self.what = tensor, what
        self.nbytes = tensor.nbytes if tensor is not None else 0
        self.msg: Message | None = None
        self.done = False
        self.at = at  # the receiver's clock when it posted this receive

    def wait(self, timeout: float | None = None) -> None:
        if self.done:
            return
        data = self.arrive(self)
        t = self.tensor
        if data.dtype != t.dtype or data.numel() != t.numel():
            _mismatch(self, data)
        if data.numel():  # (at 1024 ranks most ring chunks of a small tensor are empty)
            if t.requires_grad:
                t = t.detach()
            (t if t.dim() == 1 else t.view(-1)).copy_(data)
        self.done = True

    def describe(self, world) -> str:
        text = f"recv from rank {self.src} (tag {self.chan}, {self.nbytes} bytes)"
        if world.ranks[self.src].done:
            text += f"; rank {self.src} has already returned"
        return text


def _mismatch(handle: RecvWork, data: torch.Tensor) -> None:
    t = handle.tensor
    raise ValueError(
        f"rank {handle.rank} posted a receive of {t.numel()} x {t.dtype} from rank "
        f"{handle.src} (tag {handle.chan}), but rank {handle.src} sent "
        f"{data.numel()} x {data.dtype}: sender and receiver must agree on dtype "
        "and number of elements")


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A flat view of `t` outside autograd (a parameter may be received into)."""
    if t.requires_grad:
        t = t.detach()
    return t if t.dim() == 1 else t.view(-1)  # the common 1-D case costs nothing
