"""Mark what simulated ranks print with their rank, as real ranks' lines are.

While a `sim.run` is active, `capture` puts a dispatcher in front of `sys.stdout`: a write
from a thread or greenlet bound to a rank goes to that run's `RankSink`, which passes each
line on marked `[rank r]` ("live"), holds it for rank order ("ordered") or drops it.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import sys
import threading
from collections.abc import Iterator

OUTPUT_MODES = ("live", "ordered", "quiet")  # for launch.run and sim.run alike

# (rank, sink) of the running rank: a context variable, so each thread and each
# greenlet (simulated ranks may be either) has its own.
_bound: contextvars.ContextVar = contextvars.ContextVar("syncedu_rank", default=None)
_lock = threading.Lock()
_state = {"users": 0, "original": None}  # the one dispatcher, shared by concurrent runs


class _Dispatch(io.TextIOBase):
    def __init__(self, original):
        self.original = original

    def write(self, s: str) -> int:
        bound = _bound.get()
        if bound is None or bound[1] is None:
            return self.original.write(s)
        bound[1].write(bound[0], s)
        return len(s)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno, ...: the original's
        return getattr(self.original, name)


class RankSink:
    """Collects one run's output, line by line, marked with the rank."""

    def __init__(self, mode: str, target):
        self.mode, self.target = mode, target
        self._partial: dict[int, str] = {}
        self._held: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def write(self, rank: int, s: str) -> None:
        """Add text `s` from `rank`; each complete line goes out marked `[rank r]`."""
        with self._lock:
            *lines, self._partial[rank] = (self._partial.get(rank, "") + s).split("\n")
            for line in lines:
                self._emit(rank, line)

    def _emit(self, rank: int, line: str) -> None:
        if self.mode == "live":
            self.target.write(f"[rank {rank}] {line}\n")
        elif self.mode == "ordered":
            self._held.append((rank, line))

    def close(self) -> None:
        """Flush partial lines, then ("ordered") the held lines rank by rank."""
        with self._lock:
            for rank, rest in sorted(self._partial.items()):
                if rest:
                    self._emit(rank, rest)
            self._partial.clear()
            for rank, line in sorted(self._held, key=lambda x: x[0]):
                self.target.write(f"[rank {rank}] {line}\n")
            self._held.clear()


def bind(rank: int, sink: RankSink | None) -> None:
    """Called in a rank's thread or greenlet: its writes now go to `sink`, marked `rank`."""
    _bound.set((rank, sink))


@contextlib.contextmanager
def capture(mode: str) -> Iterator[RankSink]:
    """Install the dispatcher (once, for all concurrent runs) and give a sink."""
    with _lock:
        if _state["users"] == 0:
            _state["original"] = sys.stdout
            sys.stdout = _Dispatch(sys.stdout)
        _state["users"] += 1
        sink = RankSink(mode, _state["original"])
    try:
        yield sink
    finally:
        sink.close()
        with _lock:
            _state["users"] -= 1
            if _state["users"] == 0:
                sys.stdout = _state["original"]
                _state["original"] = None
