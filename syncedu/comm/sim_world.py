"""What the threads of one simulated run share: mailboxes, a baton and a watch.

`sim.py` runs each rank as a thread; this module holds everything those threads
share, in one `World` per run (nothing lives at module level, so several runs
can go on at once, even nested):

- **mailboxes**: per receiver, the messages not yet matched and the receives
  not yet matched, keyed by (source, channel) and matched first-in first-out,
  as MPI matches by (source, tag);
- **the baton**: only one rank's thread runs at a time. A rank runs until it
  must wait for a message that is not there, then hands the baton to the next
  ready rank (first come, first served), or when it has sent `BACKLOG` messages
  that nobody has received yet (memory). The threads never fight over the GIL
  or the cores, the run order (and so the order of prints) is the same every
  time, and a deadlock is exact: a rank that must wait finds nobody ready;
- **the watch**: when a rank raises, or a deadlock or timeout stops the run,
  every parked rank is woken and `Cancelled` is raised inside it.

Used in: notebooks/00_start_here (through `syncedu.sim`).
"""

from __future__ import annotations

import ctypes
import threading
import time
import traceback
from collections import deque

from . import rank_output
from .errors import DeadlockError, WorkerError
from .sim_messages import Message

BACKLOG = 64  # a sender with this many unreceived messages to one rank lets others run


class Cancelled(BaseException):
    """Raised inside a rank's thread when the run is being stopped.

    A `BaseException`, so a worker's `except Exception:` does not swallow it.
    """


class RankState:
    """One rank's mailbox, baton and watch entry (changed only under the world lock)."""

    __slots__ = ("baton", "parked", "unmatched", "posted", "waiting", "any_chan", "done")

    def __init__(self):
        self.baton = threading.Lock()  # held while the rank is parked
        self.baton.acquire()
        self.parked = True  # every rank starts parked, waiting for its first turn
        self.unmatched: dict = {}  # (src, chan) -> deque of Message
        self.posted: dict = {}  # (src, chan) -> deque of receive handles
        self.waiting = None  # the receive handle this rank is blocked on
        self.any_chan = None  # the channel this rank's recv_any waits on
        self.done = False


class World:
    """The shared state of one run of `world_size` simulated ranks."""

    def __init__(self, world_size: int, sink=None):
        self.n = world_size
        self.sink = sink  # where the rank threads' prints go (rank_output.RankSink)
        self.lock = threading.Lock()
        self.ranks = [RankState() for _ in range(world_size)]
        self.ready = deque(range(world_size))  # parked ranks that can run, in turn order
        self.idle: list[int] = []  # ranks in recv_any with a message to choose from
        self.results: list = [None] * world_size
        self.failures: dict[int, tuple[BaseException, str]] = {}
        self.error: BaseException | None = None  # why the run is stopping
        self.n_done = 0
        self.all_done = threading.Event()
        self.threads: list[threading.Thread] = []

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
                queue = st.unmatched.setdefault(key, deque())
                queue.append(msg)
                far_ahead = len(queue) % BACKLOG == 0
                if st.any_chan == msg.chan and st.parked and dst not in self.idle:
                    self.idle.append(dst)
            else:
                far_ahead = False
                handle = posted.popleft()
                handle.msg = msg
                if st.waiting is handle:  # dst was blocked on it: it is ready to run again
                    st.waiting = None
                    self.ready.append(dst)
        if far_ahead:
            self.pause(msg.src)

    def pause(self, rank: int) -> None:
        """Let the ready ranks run before `rank` goes on (it is far ahead of a receiver)."""
        with self.lock:
            self.check()
            if not self.ready:
                return
            self.ranks[rank].parked = True
            self.ready.append(rank)
            self._pass_baton()
        self._turn(rank)

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

    def wait(self, rank: int, handle) -> Message:
        """Park rank `rank` until `handle` has its message; return the message."""
        if handle.msg is not None:
            return handle.msg
        with self.lock:
            self.check()
            st = self.ranks[rank]
            st.waiting, st.parked = handle, True
            if not self._pass_baton():  # nobody can run: every unfinished rank waits
                self._stop(DeadlockError(self._waiting()))
        self._turn(rank)
        return handle.msg

    def recv_any(self, rank: int, chan) -> Message:
        """Park `rank` until no other rank can run; take its earliest message on `chan`.

        Any rank that can still run might send a message that arrives earlier in
        logical time, so the choice waits until every other rank is parked; then
        among the ranks in `recv_any`, the one whose earliest message arrives
        first goes on (`_pass_baton`). The choice never depends on thread timing.
        """
        with self.lock:
            self.check()
            st = self.ranks[rank]
            st.any_chan, st.parked = chan, True
            if self._earliest(rank) is not None:
                self.idle.append(rank)
            if not self._pass_baton():
                self._stop(DeadlockError(self._waiting()))
        self._turn(rank)
        with self.lock:
            key = self._earliest(rank)
            st.any_chan = None
            return st.unmatched[key].popleft()

    def _earliest(self, rank: int):
        """The (src, chan) key of `rank`'s earliest-arriving message on its any_chan."""
        st = self.ranks[rank]
        best, key = None, None
        for (src, chan), queue in st.unmatched.items():
            if chan == st.any_chan and queue:
                msg = queue[0]
                if best is None or (msg.start + msg.dur, src) < best:
                    best, key = (msg.start + msg.dur, src), (src, chan)
        return key

    # ------------------------------------------------------------- threads
    def launch(self, comms: list, fn, args: tuple, kwargs: dict) -> None:
        """Start one daemon thread per comm, running `fn(comm, *args, **kwargs)`."""
        for comm in comms:
            t = threading.Thread(target=self._main, args=(comm, fn, args, kwargs),
                                 name=f"sim-rank-{comm.rank}", daemon=True)
            try:
                t.start()
            except RuntimeError as exc:  # the operating system refused another thread
                self.stop(exc)
                self.join()
                raise RuntimeError(f"sim.run could start only {len(self.threads)} of "
                                   f"{len(comms)} rank threads: {exc}") from None
            self.threads.append(t)
        with self.lock:
            self._pass_baton()  # rank 0 goes first

    def _main(self, comm, fn, args: tuple, kwargs: dict) -> None:
        rank_output.bind(comm.rank, self.sink)  # this thread's prints: "[rank r] ..."
        try:
            self._turn(comm.rank)
            result = fn(comm, *args, **kwargs)
        except Cancelled:
            self.fail(comm.rank, None, "")
        except BaseException as exc:  # noqa: BLE001 - any failure is reported, not lost
            tb = exc.__traceback__.tb_next  # start at fn, not at this frame
            self.fail(comm.rank, exc, "".join(traceback.format_exception(type(exc), exc, tb)))
        else:
            self.finish(comm.rank, result)

    def _turn(self, rank: int) -> None:
        """Sleep until this rank holds the baton (or the run stops)."""
        self.ranks[rank].baton.acquire()
        self.check()

    def join(self, grace: float = 0.5) -> None:
        """Join every thread; one stuck outside the comm gets `Cancelled` raised in it."""
        deadline = time.monotonic() + grace
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in self.threads if t.is_alive()]
        for t in stuck:  # e.g. a pure-Python loop that never calls the comm again
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident),
                                                       ctypes.py_object(Cancelled))
        deadline = time.monotonic() + grace
        for t in stuck:
            t.join(max(0.0, deadline - time.monotonic()))

    # --------------------------------------------------------------- watch
    def finish(self, rank: int, result) -> None:
        """Rank `rank` returned `result`: pass the baton on."""
        with self.lock:
            self.results[rank] = result
            self._mark_done(rank)
            if self.n_done == self.n:
                self.all_done.set()
            elif not self._pass_baton() and self.error is None:
                self._stop(DeadlockError(self._waiting()))

    def fail(self, rank: int, exc: BaseException | None, tb: str) -> None:
        """Rank `rank` raised `exc` (None: it was cancelled); stop the run."""
        with self.lock:
            self._mark_done(rank)
            if exc is not None:
                self.failures[rank] = (exc, tb)
                self._stop(WorkerError(rank, _one_line(exc), tb))

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

    def _pass_baton(self) -> bool:
        """Wake the next ready rank, else the recv_any with the earliest message."""
        if self.ready:
            rank = self.ready.popleft()
        elif self.idle:
            rank = min(self.idle, key=lambda r: (self._arrival(r), r))
            self.idle.remove(rank)
        else:
            return False
        st = self.ranks[rank]
        st.parked = False
        st.baton.release()
        return True

    def _arrival(self, rank: int) -> float:
        msg = self.ranks[rank].unmatched[self._earliest(rank)][0]
        return msg.start + msg.dur

    def _mark_done(self, rank: int) -> None:
        st = self.ranks[rank]
        if not st.done:
            st.done = True
            self.n_done += 1

    def _stop(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        for st in self.ranks:  # wake every parked rank: each raises Cancelled
            if st.parked:
                st.parked = False
                st.baton.release()
        self.all_done.set()

    def _waiting(self) -> dict[int, str]:
        waiting = {r: describe(st.waiting, self) for r, st in enumerate(self.ranks)
                   if st.waiting is not None and not st.done}
        waiting.update({r: f"recv_any (tag {st.any_chan[1]}) from any rank"
                        for r, st in enumerate(self.ranks) if st.any_chan is not None})
        return waiting


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
