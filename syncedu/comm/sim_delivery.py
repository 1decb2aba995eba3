"""Step 3 of a simulated message: delivery, and what the ranks of one run share.

One `World` per run (nothing at module level, so runs may nest) holds:

- **mailboxes**: per receiver, unmatched messages and receives keyed by (source, channel),
  matched first-in first-out as MPI matches by (source, tag);
- **collective rendezvous**: built-ins matched by call number; the last rank to join runs
  the message schedule (sim_collectives.py);
- **the baton**: one rank runs until it must wait or has sent `BACKLOG` messages nobody
  received, then the next ready one: runs repeat, and deadlocks are exact;
- **the watch**: a failure, deadlock or timeout wakes every parked rank with `Cancelled`.
"""

from __future__ import annotations

import threading
import traceback
from collections import deque

from . import rank_output
from .errors import DeadlockError, WorkerError
from .sim_collectives import Call, SimCollectiveWork, check, resolve
from .sim_links import Message
from .sim_sched import Cancelled, RankState
from .trace import Trace

BACKLOG = 64  # a sender with this many unreceived messages to one rank lets others run
PROGRESS_EVERY = 4096  # messages between two updates of a progress bar


class World:
    """The shared state of one run of `world_size` simulated ranks."""

    def __init__(self, world_size: int, sink, sched, wires, progress=None):
        self.n = world_size
        self.sink = sink  # where the ranks' prints go (rank_output.RankSink)
        self.sched = sched  # sim_sched: threads or greenlets
        self.wires = wires  # sim_links.Wires: clocks, ports, NICs
        self.lock = threading.Lock()
        self.ranks = [RankState() for _ in range(world_size)]
        self.ready = deque(range(world_size))  # parked ranks that can run, in turn order
        self.idle: list[int] = []  # ranks in recv_any with a message to choose from
        self.rendezvous: dict[int, dict] = {}  # call number -> {rank: handle}
        self.results: list = [None] * world_size
        self.failures: dict[int, WorkerError] = {}  # rank -> what it raised
        self.error: BaseException | None = None  # why the run is stopping
        self.timeout_error = None  # made by sim.run: the error a timeout stops the run with
        self.n_done = 0
        self.all_done = threading.Event()
        self.progress = progress  # a tqdm bar (.update(n)), told every PROGRESS_EVERY messages
        self.sent = 0  # messages delivered so far (counted only with a progress bar)
        self.trace = Trace()  # every message, as it comes in (res.trace)
        self.ledgers: list = []  # the ranks' RankLedgers (set by sim.run)

    def check(self) -> None:
        """Raise `Cancelled` in the calling rank if the run is stopping."""
        if self.error is not None:
            raise Cancelled()

    def deliver(self, msg: Message, dst: int) -> None:
        """Hand `msg` to rank `dst`: to a posted receive if one waits, else queue it."""
        key = (msg.src, msg.chan)
        with self.lock:
            self.check()
            if self.progress is not None:
                self.sent += 1
                if self.sent % PROGRESS_EVERY == 0:
                    self.progress.update(PROGRESS_EVERY)
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
                if msg.rdv is not None:
                    self._matched(msg.rdv, handle.at)
                self._complete(dst, handle, msg)
        if far_ahead:
            self.pause(msg.src)

    def pause(self, rank: int) -> None:
        """Let the ready ranks run before `rank` goes on (it is far ahead of a receiver)."""
        if not self.ready:
            return
        try:
            self.sched.check_can_park(rank)
        except RuntimeError:
            return  # inside autograd on a greenlet: keep running instead
        with self.lock:
            self.check()
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
                if handle.msg.rdv is not None:
                    self._matched(handle.msg.rdv, handle.at)
            else:
                st.posted.setdefault(key, deque()).append(handle)

    def wait(self, rank: int, handle) -> Message:
        """Park rank `rank` until `handle` has its message (`.msg`); return it."""
        if handle.msg is not None:
            return handle.msg
        self.sched.check_can_park(rank)
        with self.lock:
            self.check()
            st = self.ranks[rank]
            st.waiting, st.parked = handle, True
            self._pass_or_deadlock()
        self._turn(rank)
        return handle.msg

    def join(self, rank: int, call: Call) -> SimCollectiveWork:
        """Join rank `rank`'s next built-in collective; the last rank to join does it."""
        with self.lock:
            self.check()
            st = self.ranks[rank]
            number, st.calls = st.calls, st.calls + 1
            pending = self.rendezvous.setdefault(number, {})
            if pending:
                check(next(iter(pending.values())).call, call)
            call.now = self.wires.clocks[rank].now
            handle = pending[rank] = SimCollectiveWork(self, rank, call, pending)
            if len(pending) < self.n:
                return handle
            del self.rendezvous[number]
            resolve([pending[r].call for r in range(self.n)], self.wires, self.ledgers,
                    self.trace)
            for r in range(self.n):
                self._complete(r, pending[r], True)
        return handle

    def recv_any(self, rank: int, chan) -> Message:
        """Park `rank` until no other rank can run (any might still send an earlier message);
        then take its earliest message on `chan`.

        Why wait for every other rank: a receive from any source must return the message that
        arrives first in logical time, and a rank still running may yet send one stamped
        earlier than anything queued now. Only when every other rank is parked or done is the
        earliest queued message final, so the answer is deterministic (MPI_ANY_SOURCE picks
        by wall-clock arrival, which a simulator must not).
        """
        self.sched.check_can_park(rank)
        with self.lock:
            self.check()
            st = self.ranks[rank]
            st.any_chan, st.parked = chan, True
            if self._earliest(rank):
                self.idle.append(rank)
            self._pass_or_deadlock()
        self._turn(rank)
        with self.lock:
            key = self._earliest(rank)[1:]
            st.any_chan = None
            msg = st.unmatched[key].popleft()
            if msg.rdv is not None:
                self._matched(msg.rdv, self.wires.clocks[rank].now)
            return msg

    def _matched(self, rdv, posted: float) -> None:
        """A receive matched rendezvous send `rdv` (posted at `posted`): its sender may go on."""
        rdv.posted = posted
        self._complete(rdv.rank, rdv, True)

    def _complete(self, rank: int, handle, msg) -> None:
        """Give `handle`, one of rank `rank`'s, its `msg` (a message, or True: done); if the
        rank was blocked on it, it is ready to run again."""
        handle.msg = msg
        st = self.ranks[rank]
        if st.waiting is handle:
            st.waiting = None
            self.ready.append(rank)

    def _earliest(self, rank: int) -> tuple:
        """(arrival, src, chan) of `rank`'s earliest-arriving message on its any_chan, or ()."""
        st = self.ranks[rank]
        return min(((q[0].start + q[0].dur, src, chan) for (src, chan), q in st.unmatched.items()
                    if chan == st.any_chan and q), default=())

    def launch(self, comms: list, body) -> None:
        """Start every rank (parked) running `body(comm)`; rank 0 goes first."""
        try:
            self.sched.start(comms, lambda comm: self._main(comm, body))
        except RuntimeError as exc:  # the operating system refused another thread
            self.stop(exc)
            self.sched.join()
            raise RuntimeError(f"sim.run could not start {len(comms)} ranks: {exc}") from None
        with self.lock:
            self._pass_baton()

    def _main(self, comm, body) -> None:
        rank_output.bind(comm.rank, self.sink)  # this rank's prints: "[rank r] ..."
        try:
            self.sched.first_turn(comm.rank)
            self.check()
            result = body(comm)
        except Cancelled:
            self.fail(comm.rank, None, "")
        except KeyboardInterrupt:  # greenlet ranks run on the caller's thread: pass it on
            self.fail(comm.rank, None, "")
            self.stop(RuntimeError("sim.run was interrupted"))
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure is reported, not lost
            tb = exc.__traceback__.tb_next  # start at fn, not at this frame
            self.fail(comm.rank, exc, "".join(traceback.format_exception(type(exc), exc, tb)))
        else:
            self.finish(comm.rank, result)

    def _turn(self, rank: int) -> None:
        """Sleep until this rank holds the baton (or the run stops)."""
        self.sched.park(rank)
        self.check()

    def finish(self, rank: int, result) -> None:
        """Rank `rank` returned `result`: pass the baton on."""
        with self.lock:
            self.results[rank] = result
            if not self._mark_done(rank) and not self._pass_baton() and self.error is None:
                self._stop(DeadlockError(self._waiting()))

    def fail(self, rank: int, exc: BaseException | None, tb: str) -> None:
        """Rank `rank` raised `exc` (None: it was cancelled); stop the run."""
        with self.lock:
            if exc is not None:
                error = self.failures[rank] = WorkerError(rank, f"{type(exc).__name__}: {exc}", tb)
                self._stop(error)
            self._mark_done(rank)

    def stop(self, error: BaseException) -> None:
        """Stop the run with `error` (kept only if it is the first reason)."""
        with self.lock:
            self._stop(error)

    def stop_for_timeout(self) -> None:
        """Stop every rank with a `TimeoutError` naming those not yet done."""
        self.stop(self.timeout_error([r for r, st in enumerate(self.ranks) if not st.done]))

    def outcome(self) -> BaseException | None:
        """The error to raise: the lowest failed rank's, else deadlock or timeout."""
        if self.failures:
            return self.failures[min(self.failures)]
        return self.error

    def _pass_baton(self) -> bool:
        """Wake the next ready rank, else the recv_any with the earliest message."""
        if self.ready:
            rank = self.ready.popleft()
        elif self.idle:
            rank = min(self.idle, key=lambda r: (self._earliest(r)[0], r))
            self.idle.remove(rank)
        else:
            return False
        self.ranks[rank].parked = False
        self.sched.wake(rank)
        return True

    def _pass_or_deadlock(self) -> None:
        if not self._pass_baton():  # nobody can run: every unfinished rank waits
            self._stop(DeadlockError(self._waiting()))

    def _mark_done(self, rank: int) -> bool:
        """Count `rank` as done; True (and `all_done` set) if it was the last."""
        st = self.ranks[rank]
        if not st.done:
            st.done = True
            self.n_done += 1
        if self.n_done == self.n:
            self.all_done.set()
            return True
        return False

    def _stop(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        parked = [r for r, st in enumerate(self.ranks) if st.parked]
        for r in parked:
            self.ranks[r].parked = False
        self.sched.release_all(parked)  # each wakes up and raises Cancelled
        self.all_done.set()

    def _waiting(self) -> dict[int, str]:
        waiting = {r: st.waiting.describe(self) for r, st in enumerate(self.ranks)
                   if st.waiting is not None and not st.done}
        waiting.update({r: f"recv_any (tag {st.any_chan}) from any rank"
                        for r, st in enumerate(self.ranks) if st.any_chan is not None})
        return waiting
