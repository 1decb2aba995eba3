"""Errors a run can end with, shared by real (launch) and simulated (sim) ranks."""

from __future__ import annotations

import builtins


class WorkerError(RuntimeError):
    """A rank raised (or died). `.rank` names it; the message holds its traceback."""

    def __init__(self, rank: int, message: str, traceback: str = ""):
        self.rank = rank
        self.traceback = traceback
        text = f"rank {rank} failed: {message}"
        if traceback:
            text += f"\n\n--- traceback from rank {rank} ---\n{traceback.rstrip()}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.rank, self.args[0], ""))


class TimeoutError(builtins.TimeoutError):  # noqa: A001 - deliberately shadows the builtin
    """A run went past its timeout; `.ranks` lists the ranks still running (a built-in too)."""

    def __init__(self, message: str, ranks: list[int]):
        self.ranks = list(ranks)
        super().__init__(message)


class DeadlockError(RuntimeError):
    """Every simulated rank is waiting and none can proceed; `.waiting`: rank -> what for."""

    def __init__(self, waiting: dict[int, str]):
        self.waiting = dict(waiting)
        self.ranks = sorted(waiting)
        lines = [f"  rank {r}: {what}" for r, what in sorted(waiting.items())]
        super().__init__("deadlock: every unfinished rank is waiting\n" + "\n".join(lines))
