"""Where simulated ranks run: one thread each, or one greenlet each on the caller's thread.

- `ThreadScheduler`: a thread per rank, parked on its own lock; a hand-over is an
  OS context switch (~10-20 us); each rank has its own thread-local torch state,
  so it may wait anywhere, even inside a backward (SyncBN, DDP hooks).
- `GreenletScheduler`: a hand-over costs about a microsecond. Grad mode and
  autocast are saved and restored at every switch; a rank may not wait inside
  the C++ autograd engine (its per-thread state would be trampled).
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time

import greenlet
import torch

from .runs import check_choice

SCHEDULERS = ("auto", "thread", "greenlet")
THREAD_LIMIT = 64  # "auto" uses threads up to this many ranks
_AUTOCAST_DEVICES = ("cpu", "cuda")


class Cancelled(BaseException):
    """Raised inside a rank when the run is being stopped (`except Exception:` misses it)."""


class RankState:
    """One rank's mailbox and watch entry."""

    __slots__ = ("parked", "unmatched", "posted", "waiting", "any_chan", "done", "calls")

    def __init__(self):
        self.parked = True  # every rank starts parked, waiting for its first turn
        self.unmatched: dict = {}  # (src, chan) -> deque of Message
        self.posted: dict = {}  # (src, chan) -> deque of receive handles
        self.waiting = None  # the handle this rank is blocked on
        self.any_chan = None  # the channel this rank's recv_any waits on
        self.done = False
        self.calls = 0  # built-in collectives called so far


class ThreadScheduler:
    """Rank r runs in its own thread and sleeps on lock r while parked."""

    def __init__(self, n: int):
        self.batons = [threading.Lock() for _ in range(n)]
        for b in self.batons:
            b.acquire()
        self.threads: list[threading.Thread] = []

    def start(self, comms, main) -> None:
        """Start one daemon thread per rank, each running `main(comm)`."""
        for comm in comms:
            t = threading.Thread(target=main, args=(comm,), name=f"sim-rank-{comm.rank}",
                                 daemon=True)
            t.start()  # a RuntimeError here means the OS refused another thread
            self.threads.append(t)

    def check_can_park(self, rank: int) -> None:
        """Nothing to check: a thread may wait anywhere, even inside autograd."""
        return None  # a thread may wait anywhere

    def park(self, rank: int) -> None:
        """Block this rank's thread until another rank wakes it."""
        self.batons[rank].acquire()

    first_turn = park

    def wake(self, rank: int) -> None:
        """Let `rank`'s parked thread run on."""
        self.batons[rank].release()

    def release_all(self, ranks) -> None:
        """Wake every rank in `ranks` so it sees the run stopped and raises."""
        for r in ranks:  # each wakes up and raises Cancelled
            self.batons[r].release()

    def drive(self, world, timeout: float) -> bool:
        """Wait for the ranks' threads; False on timeout."""
        return world.all_done.wait(timeout)

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


class GreenletScheduler:
    """Rank r is greenlet r; the hub (the caller of sim.run) switches to the next one."""

    def __init__(self, n: int):
        self.glets: list = [None] * n
        self.next: int | None = None
        self.hub = None

    def start(self, comms, main) -> None:
        """Make one greenlet per rank, children of this (hub) greenlet; none runs yet."""
        self.hub = greenlet.getcurrent()
        for comm in comms:
            self.glets[comm.rank] = greenlet.greenlet(lambda c=comm: main(c), parent=self.hub)

    def first_turn(self, rank: int) -> None:
        """A rank's first switch-in: torch's thread state as a new thread would have it."""
        _restore((True, None))  # what a new thread starts with: grad on, no autocast

    def check_can_park(self, rank: int) -> None:
        """Raise if this rank may not switch away here (inside autograd)."""
        if torch._C._current_graph_task_id() != -1:
            raise RuntimeError(
                f"simulated rank {rank} must wait for another rank inside autograd's backward "
                "(a collective in a custom autograd Function or a gradient hook): greenlet "
                "ranks share one thread and cannot switch there; run with "
                "sim.run(..., scheduler='thread')")
        if torch.is_inference_mode_enabled():
            raise RuntimeError(f"simulated rank {rank} must wait inside torch.inference_mode(), "
                               "which greenlet ranks cannot keep apart; use torch.no_grad() "
                               "or sim.run(..., scheduler='thread')")

    def park(self, rank: int) -> None:
        """Switch away (to the rank woken next, or the hub), saving and restoring torch's state."""
        state = _save()
        nxt = self.next
        if nxt is None or not self.glets[nxt]:
            self.hub.switch()  # stopping, or a rank not started yet: the hub starts it
        elif nxt != rank:  # (recv_any may pick this very rank: then just go on)
            self.next = None
            self.glets[nxt].switch()  # straight to the next rank: one switch, not two
        else:
            self.next = None
        _restore(state)

    def wake(self, rank: int) -> None:
        """Choose `rank` to run at the next switch."""
        self.next = rank

    def release_all(self, ranks) -> None:
        """Nothing here: the hub switches to each unfinished rank once it is back."""
        return None  # the hub switches to each unfinished rank once it is back (_loop)

    def drive(self, world, timeout: float) -> bool:
        """Run ranks until none is ready; False if `timeout` real seconds passed."""
        hub_state = _save()
        ident = threading.get_ident()
        fired, lock = [], threading.Lock()

        def fire() -> None:  # from a timer thread: stop whatever rank runs now
            with lock:
                if world.all_done.is_set():
                    return
                fired.append(True)
                world.stop_for_timeout()
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                           ctypes.py_object(Cancelled))

        timer = threading.Timer(timeout, fire)
        timer.daemon = True
        timer.start()
        collecting = gc.isenabled()
        gc.disable()  # thousands of live ranks make every cyclic collection slow: once after
        try:
            self._loop(world)
        finally:
            with lock:
                world.all_done.set()
                timer.cancel()
            _restore(hub_state)
            if collecting:
                gc.enable()
        return not fired

    def _loop(self, world) -> None:
        while True:
            try:
                while self.next is not None:
                    rank, self.next = self.next, None
                    self.glets[rank].switch()
                for g in self.glets:  # stopping: each unfinished rank raises Cancelled
                    if world.error is not None and not g.dead:
                        g.switch()
                return
            except Cancelled:  # the timer fired while the hub itself ran
                continue

    def join(self, grace: float = 0.5) -> None:
        """Nothing to join: greenlets end with the hub's loop."""
        return None


def make(scheduler: str, n: int):
    """The scheduler for `n` ranks: "thread", "greenlet" or "auto" (threads up to 64 ranks)."""
    check_choice("scheduler", scheduler, SCHEDULERS)
    if scheduler == "thread" or (scheduler == "auto" and n <= THREAD_LIMIT):
        return ThreadScheduler(n)
    return GreenletScheduler(n)


def _save() -> tuple:
    """This thread's grad mode and (only if any is on) autocast settings."""
    if not torch._C._is_any_autocast_enabled():
        return torch.is_grad_enabled(), None
    return (torch.is_grad_enabled(),
            tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                  for d in _AUTOCAST_DEVICES))


def _restore(state: tuple) -> None:
    grad, autocast = state
    if torch.is_grad_enabled() != grad:
        torch._C._set_grad_enabled(grad)
    if autocast is None:
        if not torch._C._is_any_autocast_enabled():
            return
        autocast = ((False, None),) * len(_AUTOCAST_DEVICES)
    for d, (on, dtype) in zip(_AUTOCAST_DEVICES, autocast):
        if torch.is_autocast_enabled(d) != on:
            torch.set_autocast_enabled(d, on)
        if dtype is not None and torch.get_autocast_dtype(d) != dtype:
            torch.set_autocast_dtype(d, dtype)
