"""Simulated messages: the message in flight, the handles, the receive port.

See sim.py for the time model. A message's send-side times are fixed by its
sender, in the sender's program order; the receive port is booked by the
receiver, in its own program order. So logical time never depends on which
thread the operating system happens to run first.

Used in: notebooks/00_start_here (through `syncedu.sim`).
"""

from __future__ import annotations

from bisect import bisect_right

import torch

from .base import Work


class Message:
    """One message in flight: a private copy of the data and its timing."""

    __slots__ = ("data", "src", "chan", "start", "dur", "what")

    def __init__(self, data, src: int, chan, start: float, dur: float, what: str):
        self.data, self.src, self.chan, self.what = data, src, chan, what
        self.start = start  # when it left the sender's send port
        self.dur = dur  # latency + bytes / bandwidth (+ noise)


class RecvPort:
    """A rank's receive port: sorted, disjoint busy intervals, filled first-fit.

    The receiver reserves a slot when it waits for a message, in its program
    order. First-fit lets a message that left early but is waited for late
    (after a straggler's) still come in early, in a gap.
    """

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []

    def reserve(self, earliest: float, dur: float) -> float:
        """Book `dur` seconds at the first free slot from `earliest`; return its start."""
        if dur <= 0:
            return earliest
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, earliest)  # busy intervals before i end in time
        t = earliest
        while i < len(starts) and starts[i] < t + dur:
            t = max(t, ends[i])
            i += 1
        self._insert(i, t, t + dur)
        return t

    def _insert(self, i: int, t: float, end: float) -> None:
        starts, ends = self.starts, self.ends
        left = i > 0 and ends[i - 1] == t
        right = i < len(starts) and starts[i] == end
        if left and right:  # the new interval closes a gap: merge three into one
            ends[i - 1] = ends.pop(i)
            starts.pop(i)
        elif left:
            ends[i - 1] = end
        elif right:
            starts[i] = t
        else:
            starts.insert(i, t)
            ends.insert(i, end)


class SendWork(Work):
    """Handle of an `isend`: `wait()` moves the clock to when the send port is done."""

    __slots__ = ("comm", "end")

    def __init__(self, comm, end: float):
        self.comm, self.end = comm, end

    def wait(self, timeout: float | None = None) -> None:
        self.comm._advance(self.end)


class RecvWork(Work):
    """Handle of an `irecv`: `wait()` blocks until the message is in, then copies it.

    `timeout` is accepted for the `Work` interface but not needed: a simulated
    wait either completes or is reported at once as a `DeadlockError`.
    """

    __slots__ = ("comm", "src", "chan", "tensor", "nbytes", "what", "msg", "done")

    def __init__(self, comm, src: int, chan, tensor, what: str):
        self.comm, self.src, self.chan, self.tensor, self.what = comm, src, chan, tensor, what
        self.nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        self.msg: Message | None = None
        self.done = False

    def wait(self, timeout: float | None = None) -> None:
        if self.done:
            return
        data = self.comm._arrive(self)
        _check_match(self, data)
        flat_view(self.tensor).copy_(data)
        self.done = True


def _check_match(handle: RecvWork, data: torch.Tensor) -> None:
    t, comm = handle.tensor, handle.comm
    if data.dtype != t.dtype or data.numel() != t.numel():
        raise ValueError(
            f"rank {comm.rank} posted a receive of {t.numel()} x {t.dtype} from rank "
            f"{handle.src} (tag {handle.chan[1]}), but rank {handle.src} sent "
            f"{data.numel()} x {data.dtype}: sender and receiver must agree on dtype "
            "and number of elements")


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A flat view of `t` outside autograd (a parameter may be received into)."""
    return (t.detach() if t.requires_grad else t).view(-1)
