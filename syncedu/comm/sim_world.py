"""What the threads of one simulated run share: mailboxes, ports and a watch.

`sim.py` runs each rank as a thread; this module holds everything those threads
share, guarded by one lock per run (nothing lives at module level, so several
runs can go on at once, even nested):

- **mailboxes**: per receiver, the messages not yet matched and the receives
  not yet matched, keyed by (source, channel) and matched first-in first-out,
  as MPI matches by (source, tag);
- **the receive port** of each rank (`RecvPort`), busy while a message comes
  in: the single-port, full-duplex model of Thakur, Rabenseifner & Gropp (2005),
  where a rank sends one message and receives one message at a time;
- **the watch**: which ranks are blocked and on what. When every unfinished
  rank is blocked the run stops with a `DeadlockError`; a failure, a deadlock or
  a timeout wakes every blocked rank with `Cancelled`, raised inside it.

Logical time never depends on which thread runs first: a message's times are
set by its sender in the sender's program order, and the receive port is
reserved by the receiver in its own program order.

Used in: notebooks/00_start_here (through `syncedu.sim`).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import deque

from .errors import DeadlockError, WorkerError
from .errors import TimeoutError as RunTimeoutError


class Cancelled(BaseException):
    """Raised inside a rank's thread when the run is being stopped.

    A `BaseException`, so a worker's `except Exception:` does not swallow it.
    """


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


class RankState:
    """One rank's mailbox and watch entry (touched only under the world lock)."""

    __slots__ = ("cond", "unmatched", "posted", "waiting", "done")

    def __init__(self, lock: threading.Lock):
        self.cond = threading.Condition(lock)
        self.unmatched: dict = {}  # (src, chan) -> deque of Message
        self.posted: dict = {}  # (src, chan) -> deque of receive handles
        self.waiting = None  # the receive handle this rank is blocked on
        self.done = False


class World:
    """The shared state of one run of `world_size` simulated ranks."""

    def __init__(self, world_size: int):
        self.n = world_size
        self.lock = threading.Lock()
        self.ranks = [RankState(self.lock) for _ in range(world_size)]
        self.results: list = [None] * world_size
        self.failures: dict[int, tuple[BaseException, str]] = {}
        self.error: BaseException | None = None  # why the run is stopping
        self.n_blocked = 0
        self.n_done = 0
        self.all_done = threading.Event()

    # ------------------------------------------------------------ messages
    def check(self) -> None:
        """Raise `Cancelled` in the calling rank if the run is stopping."""
        if self.error is not None:
            raise Cancelled()

    def deliver(self, msg: Message, dst: int) -> None:
        """Hand `msg` to rank `dst`: to a posted receive if one waits, else queue it."""
        key = (msg.src, msg.chan)
        with self.lock:
            self.check()
            st = self.ranks[dst]
            posted = st.posted.get(key)
            if not posted:
                st.unmatched.setdefault(key, deque()).append(msg)
                return
            handle = posted.popleft()
            handle.msg = msg
            if st.waiting is handle:  # wake the receiver; it is no longer blocked
                st.waiting = None
                self.n_blocked -= 1
                st.cond.notify()

    def post(self, rank: int, handle) -> None:
        """Match receive `handle` (fields src, chan) to a queued message or post it."""
        key = (handle.src, handle.chan)
        with self.lock:
            self.check()
            st = self.ranks[rank]
            queued = st.unmatched.get(key)
            if queued:
                handle.msg = queued.popleft()
            else:
                st.posted.setdefault(key, deque()).append(handle)

    def wait(self, rank: int, handle, timeout: float | None = None) -> Message:
        """Block rank `rank` until `handle` has its message; return the message."""
        if handle.msg is not None:
            return handle.msg
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            st = self.ranks[rank]
            while handle.msg is None:
                self.check()
                if st.waiting is not handle:
                    st.waiting = handle
                    self.n_blocked += 1
                    self._check_deadlock()
                    continue  # the check may have stopped the run
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    st.waiting = None
                    self.n_blocked -= 1
                    raise RunTimeoutError(f"rank {rank}: {describe(handle, self)} did not "
                                          f"complete within {timeout} s", [rank])
                st.cond.wait(left)
            return handle.msg

    # --------------------------------------------------------------- watch
    def finish(self, rank: int, result) -> None:
        """Rank `rank` returned `result`."""
        with self.lock:
            self.results[rank] = result
            self._mark_done(rank)
            if self.n_done == self.n:
                self.all_done.set()
            else:
                self._check_deadlock()

    def fail(self, rank: int, exc: BaseException | None, tb: str) -> None:
        """Rank `rank` raised `exc` (None: it was cancelled); stop the run."""
        with self.lock:
            self._mark_done(rank)
            if exc is not None:
                self.failures[rank] = (exc, tb)
                self._stop(WorkerError(rank, _one_line(exc), tb))
            elif self.n_done == self.n:
                self.all_done.set()

    def stop(self, error: BaseException) -> None:
        """Stop the run with `error` (kept only if it is the first reason)."""
        with self.lock:
            self._stop(error)

    def unfinished(self) -> list[int]:
        with self.lock:
            return [r for r, st in enumerate(self.ranks) if not st.done]

    def outcome(self) -> BaseException | None:
        """The error to raise: the lowest failed rank's, else deadlock or timeout."""
        if self.failures:
            rank = min(self.failures)
            exc, tb = self.failures[rank]
            return WorkerError(rank, _one_line(exc), tb)
        return self.error

    def _mark_done(self, rank: int) -> None:
        st = self.ranks[rank]
        if not st.done:
            st.done = True
            self.n_done += 1

    def _stop(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        for st in self.ranks:
            st.cond.notify_all()
        self.all_done.set()

    def _check_deadlock(self) -> None:
        if self.n_blocked == 0 or self.n_blocked + self.n_done < self.n or self.error:
            return
        waiting = {r: describe(st.waiting, self) for r, st in enumerate(self.ranks)
                   if st.waiting is not None and not st.done}
        self._stop(DeadlockError(waiting))


def describe(handle, world: World) -> str:
    """What a blocked receive waits for, e.g. 'recv from rank 3 (tag 0, 4000 bytes)'."""
    if handle.what == "recv":
        text = f"recv from rank {handle.src} (tag {handle.chan[1]}, {handle.nbytes} bytes)"
    else:
        text = f"{handle.what}: waiting for a message from rank {handle.src}"
    if world.ranks[handle.src].done:
        text += f"; rank {handle.src} has already returned"
    return text


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
