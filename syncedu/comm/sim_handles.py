"""Step 4 of a simulated message: the handles a rank waits on, which copy data into place."""

from __future__ import annotations

import torch

from .base import Work
from .sim_links import Clock, Message


class SendWork(Work):
    """Handle of an `isend`: `wait()` moves the clock to when the send port is done.

    `guard` = (comm, view, copy, version, dst, tag): the sent tensor and the bytes posted.
    Gloo and NCCL may read a send buffer until the request completes (torch: changing it
    before is undefined), so `wait()` fails if those bytes changed, and a rank that returns
    with sends never waited on fails too (`SimComm._returned`)."""

    __slots__ = ("clock", "end", "guard")

    def __init__(self, clock: Clock, end: float, guard=None):
        self.clock, self.end, self.guard = clock, end, guard
        if guard:
            guard[0]._unwaited[self] = guard

    def wait(self, timeout: float | None = None) -> None:
        """A posted eager send: the sender's clock moves to when its port is free again."""
        self.clock.advance(self.end)
        comm, view, copy, version, dst, tag = self.guard or (None,) * 6
        # any view of the same storage moves the version: then compare the bytes themselves
        if (comm and comm._unwaited.pop(self, None) and view._version != version
                and not torch.equal(view.view(torch.uint8), copy.view(torch.uint8))):
            raise RuntimeError(
                f"rank {comm.rank} changed the tensor it isend to rank {dst} (tag {tag}) before "
                "that send's wait(): on Gloo and NCCL the data may leave after the change; "
                "receive into another buffer, or wait() before reusing this one")


class RendezvousWork(SendWork):
    """Handle of an `isend` above `eager_limit`: `wait()` parks until the receive is posted."""

    __slots__ = ("world", "rank", "dst", "chan", "nbytes", "msg", "posted")

    def __init__(self, world, rank: int, dst: int, chan, nbytes: int, clock: Clock, end: float,
                 guard=None):
        super().__init__(clock, end, guard)
        self.world, self.rank, self.dst, self.chan, self.nbytes = world, rank, dst, chan, nbytes
        self.msg = None  # True once a receive matched it (posted at `posted`)
        self.posted = 0.0

    def wait(self, timeout: float | None = None) -> None:
        """A rendezvous send: wait for the matching receive, then for the bytes to leave."""
        if self.msg is None:
            self.world.wait(self.rank, self)
        self.clock.advance(self.posted)
        super().wait()

    def describe(self, world) -> str:
        """For a deadlock report: the receive this send waits for."""
        return (f"send to rank {self.dst} (tag {self.chan}, {self.nbytes} bytes > eager_limit "
                f"{world.wires.net.eager_limit:g}): waits for rank {self.dst} to post the "
                "matching receive" + returned(world, self.dst))


class RecvWork(Work):
    """Handle of an `irecv`: `wait()` gets the data from `arrive(handle)` (the comm's), then
    copies it (`timeout` is not needed: a simulated wait completes or deadlocks)."""

    __slots__ = ("arrive", "rank", "src", "chan", "tensor", "nbytes", "msg", "done", "at")

    def __init__(self, arrive, rank: int, src: int, chan, tensor, at: float):
        self.arrive, self.rank, self.src, self.chan = arrive, rank, src, chan
        self.tensor, self.nbytes = tensor, tensor.nbytes
        self.msg: Message | None = None
        self.done = False
        self.at = at  # the receiver's clock when it posted this receive

    def wait(self, timeout: float | None = None) -> None:
        """Copy the matching message (dtype and size checked) in, at its arrival time."""
        if self.done:
            return
        data = self.arrive(self)
        t = self.tensor
        if data.dtype != t.dtype or data.numel() != t.numel():
            raise ValueError(
                f"rank {self.rank} posted a receive of {t.numel()} x {t.dtype} from rank "
                f"{self.src} (tag {self.chan}), but rank {self.src} sent "
                f"{data.numel()} x {data.dtype}: sender and receiver must agree on dtype "
                "and number of elements")
        if data.numel():  # (at 1024 ranks most ring chunks of a small tensor are empty)
            flat_view(t).copy_(data)
        self.done = True

    def describe(self, world) -> str:
        """For a deadlock report: the message this receive waits for."""
        return (f"recv from rank {self.src} (tag {self.chan}, {self.nbytes} bytes)"
                + returned(world, self.src))


def returned(world, rank: int) -> str:
    """A deadlock report's note that `rank` has already returned (so it sends nothing more),
    or "" while it runs."""
    return f"; rank {rank} has already returned" if world.ranks[rank].done else ""


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A flat view of `t` outside autograd (a parameter may be received into)."""
    t = t.detach() if t.requires_grad else t
    return t if t.dim() == 1 else t.view(-1)  # the common 1-D case costs nothing
