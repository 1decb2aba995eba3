"""Handles of operations in flight: `Work`, and the two that several backends share."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod


class Work(ABC):
    """Handle of a non-blocking operation; `wait()` blocks until it is done."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> None:
        """Block until the operation is done (at most `timeout` seconds; None: no limit)."""


class ThreadWork(Work):
    """An operation another thread carries out and `finish`es; `wait()` re-raises its error."""

    def __init__(self, what: str = "operation"):
        self.what = what
        self.error: BaseException | None = None
        self._done = threading.Event()

    def finish(self, error: BaseException | None = None) -> None:
        """Mark the work done (`error`: raised again by `wait`), waking every waiter."""
        self.error = error
        self._done.set()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for `finish` (a `TimeoutError` past `timeout`), re-raising its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.what} not finished within {timeout} s")
        if self.error is not None:
            raise self.error


class CollectiveWork(Work):
    """The backend's handle `inner` (or None), then `then()` once: an asynchronous built-in
    (`then`: e.g. "avg"'s division), a real rank's traced send."""

    def __init__(self, inner: Work | None, then=None):
        self._inner, self._then = inner, then

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the inner handle, then run the finishing step once (e.g. divide for "avg")."""
        if self._inner is not None:  # (a wait that timed out may be retried)
            self._wait_inner(timeout)
            self._inner = None
        if self._then is not None:
            then, self._then = self._then, None
            then()

    def _wait_inner(self, timeout: float | None) -> None:
        """Wait for the inner handle (a subclass adapts the call to another kind of handle)."""
        self._inner.wait(timeout)
