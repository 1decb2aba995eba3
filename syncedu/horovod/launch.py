"""`horovod.run` with the course's safeguards: a timeout, restored signal handlers, a skip reason.

`horovod.run(fn, num_proc=2, use_gloo=True)` starts Gloo ranks on this machine
and returns what `fn` returned on each (Horovod's own launcher, documented in
Horovod's "Horovod in Python" / `horovod.runner` API; `fn` may be defined in a
notebook cell: it travels by value). Four things bite when it is called from a
notebook, and `run` below handles them:

1. **availability**: Horovod is built from source by `make setup`; if that
   failed, `available()` says why (the log it recorded) and notebooks skip;
2. **signal handlers**: `horovod.run` installs its own SIGINT/SIGTERM handlers
   in the caller and leaves them there, so Ctrl-C no longer interrupts the
   kernel. `run` saves the caller's handlers and puts them back, always;
3. **no timeout**: a stalled job (e.g. tensor names that differ between
   ranks) waits forever. `run` arms a timer; when it fires while Horovod's
   handler is installed, it sends this process the SIGTERM that handler turns
   into "stop every rank", and raises `TimeoutError`;
4. **a silent stall**: Horovod's own guard, the stall inspector
   (`HOROVOD_STALL_CHECK_TIME_SECONDS`), never names the missing ranks on a
   Gloo-only build: `GlooController::DoInitialization` fills `global_ranks_`
   after only `reserve(size_)` (gloo_controller.cc:92-97, v0.28.1), so the
   vector's size stays 0 and `CheckForStalledTensors` loops over no rank
   (stall_inspector.cc:54-55). The ranks' output is therefore kept (as
   `.output` on the error, also when `quiet=True`), and `horovod_log` pulls
   Horovod's own log lines out of it, without timestamps or build paths.

Environment variables for the ranks (`HOROVOD_FUSION_THRESHOLD`,
`HOROVOD_CYCLE_TIME`, `HOROVOD_TIMELINE`, ...) are set inside each rank before
`fn` runs (so before its `hvd.init()`), never in the caller.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
import threading
from pathlib import Path

__all__ = ["available", "run", "horovod_log", "HorovodRunError", "FAILED_STAMP"]

# Written by scripts/setup.sh when the Horovod build failed: the path of the build log.
FAILED_STAMP = Path(sys.prefix) / ".syncedu-horovod-failed"
# Written by scripts/setup.sh (`make lab`) while Horovod builds in the background: its pid.
BUILDING_STAMP = Path(sys.prefix) / ".syncedu-horovod-building"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Tee(io.TextIOBase):
    """A stream that keeps what is written (for `.output`) and, unless quiet, passes it on."""

    def __init__(self, keep: io.StringIO, through=None):
        self.keep, self.through = keep, through

    def write(self, text: str) -> int:
        self.keep.write(text)
        if self.through is not None:
            self.through.write(text)
        return len(text)

    def flush(self) -> None:
        if self.through is not None:
            self.through.flush()


class HorovodRunError(RuntimeError):
    """A Horovod job failed: a rank raised or died. `.output` holds what the ranks printed."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def _build_running() -> int | None:
    """The pid of the background Horovod build `make lab` started, if it is still running."""
    try:
        pid = int(BUILDING_STAMP.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def wait_for_build(timeout: float = 900.0, every: float = 15.0) -> None:
    """Wait for a background Horovod build, printing a status line every `every` seconds.

    `make lab` opens the course while Horovod (which only lesson 08 needs) compiles
    in the background; lesson 08 calls this first. Returns at once if no build runs.
    """
    import time

    start = time.monotonic()
    pid = _build_running()
    if pid is not None:
        print(f"Horovod is still building in the background (pid {pid}; log: "
              f"{Path(sys.prefix) / 'horovod-build.log'}); waiting for it...", flush=True)
    next_line = every
    while (pid := _build_running()) is not None:
        waited = time.monotonic() - start
        if waited > timeout:
            raise TimeoutError(f"the Horovod build (pid {pid}) still runs after {timeout:.0f} s")
        if waited >= next_line:
            print(f"  still building ({waited:.0f} s)", flush=True)
            next_line += every
        time.sleep(0.5)
    if time.monotonic() - start > 1:
        print("Horovod build finished.", flush=True)


def available() -> tuple[bool, str]:
    """(True, version) if `horovod.torch` loads, else (False, why) with the build log's path.

    Waits first for a background build that `make lab` started (`wait_for_build`).
    """
    wait_for_build()
    try:
        import horovod
        import horovod.torch  # noqa: F401  (the compiled extension is what must load)
        return True, f"horovod {horovod.__version__}"
    except Exception as exc:  # ImportError, or an undefined symbol from a stale build
        why = f"horovod.torch is not importable ({type(exc).__name__}: {exc})"
    if FAILED_STAMP.exists():
        why += f"; the build failed, see {FAILED_STAMP.read_text().strip()}"
    return False, why + "; build it with `make setup` (retry: `make setup FORCE=1`)"


# horovod.run 0.28.1 exports these as the string "(None,)" (a trailing comma in its
# _HorovodArgs); Horovod's C++ core reads that as 0: cycle time 0 ms, response cache off.
_BOGUS = ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")


def _with_env(fn, env: dict, args: tuple, kwargs: dict):
    """What each rank runs: set the Horovod variables first, then the user's function."""
    for key in _BOGUS:
        if os.environ.get(key) == "(None,)":
            del os.environ[key]  # back to Horovod's documented defaults
    os.environ.update(env)
    return fn(*args, **kwargs)


class _Deadline:
    """Step 3: after `timeout` s, SIGTERM this process, but only into Horovod's handler."""

    def __init__(self, timeout: float, ours: dict):
        self.timeout, self.ours = timeout, ours
        self.fired, self.lock, self.done = False, threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        if self.done.wait(self.timeout):
            return
        while not self.done.wait(0.2):  # wait until Horovod's handler is in place
            with self.lock:
                handler = signal.getsignal(signal.SIGTERM)
                if self.done.is_set() or not callable(handler) or handler is \
                        self.ours[signal.SIGTERM]:
                    continue
                self.fired = True
                os.kill(os.getpid(), signal.SIGTERM)  # Horovod's handler: stop the ranks
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.lock:  # after this, the timer can no longer send anything
            self.done.set()
        self.thread.join()


def run(fn, world_size: int = 2, *, args: tuple = (), kwargs: dict | None = None,
        env: dict | None = None, timeout: float = 120.0, start_timeout: float = 60.0,
        quiet: bool = False, output: list | None = None) -> list:
    """`horovod.run(fn, ...)` on `world_size` local Gloo ranks; returns the ranks' values.

    `env`: variables set in every rank before `fn` runs. `timeout`: seconds before
    the job is stopped (`TimeoutError`). `quiet=True` keeps the ranks' output out of
    the caller's streams; either way it is attached to the `HorovodRunError` or
    `TimeoutError` raised (`.output`), and appended to `output` if it is a list.
    Raises `RuntimeError` with the reason if Horovod is not available.
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    if not timeout > 0 or not start_timeout > 0:
        raise ValueError(f"timeout={timeout!r} and start_timeout={start_timeout!r} must be > 0")
    ok, why = available()  # Step 1
    if not ok:
        raise RuntimeError(why)
    import horovod

    env = {k: str(v) for k, v in (env or {}).items()}
    ours = {sig: signal.getsignal(sig) for sig in _SIGNALS}  # Step 2
    out = io.StringIO()
    streams = (contextlib.redirect_stdout(_Tee(out, None if quiet else sys.stdout)),
               contextlib.redirect_stderr(_Tee(out, None if quiet else sys.stderr)))
    try:
        with contextlib.ExitStack() as stack:
            for s in streams:
                stack.enter_context(s)
            deadline = stack.enter_context(_Deadline(timeout, ours))
            try:
                return horovod.run(_with_env, args=(fn, env, tuple(args), dict(kwargs or {})),
                                   num_proc=world_size, use_gloo=True, start_timeout=start_timeout,
                                   network_interfaces=["lo"])
            except RuntimeError as e:
                if not deadline.fired:
                    raise HorovodRunError(str(e).strip(), out.getvalue()) from None
        err = TimeoutError(f"horovod.run: the job was still running after timeout={timeout} s; "
                           "its ranks were stopped")
        err.output = out.getvalue()  # Step 4: what the ranks printed, Horovod's log included
        raise err
    finally:
        for sig, handler in ours.items():
            signal.signal(sig, handler)
        if output is not None:
            output.append(out.getvalue())


# "[0]<stderr>:[2026-11-30 13:51:40.311022: W /tmp/pip-.../common/stall_inspector.cc:37] text"
_LOG_LINE = re.compile(r"^\[(\d+)\]<std(?:out|err)>:"  # the launcher's prefix: rank, stream
                       r"\[[\d\- :.]+: ([TDIWEF]) \S*?([\w.]+:\d+)\] (.*)$")
_RANK_LINE = re.compile(r"^\[(\d+)\]<stderr>:(.*)$")
# The lines that follow the first one of a stall report (stall_inspector.cc:69-107).
_REPORT_LINE = re.compile(r"^(Missing ranks:|\d+!?: \[.*\]|One or more rank .*)$")


def horovod_log(output: str, source: str = "") -> list[str]:
    """Horovod's own log records in the ranks' `output`, as `rank R: L file.cc:N] message`.

    Timestamps and build paths are dropped, so the lines are the same on every run;
    a stall report keeps its following lines ("Missing ranks:", one line per rank).
    `source` keeps only records from that file (e.g. "stall_inspector").
    """
    records, rank = [], None  # rank: whose record the previous line belonged to
    for line in output.splitlines():
        m = _LOG_LINE.match(line)
        if m:
            rank, level, where, text = m.groups()
            records.append([f"rank {rank}: {level} {where}] {text.rstrip()}", where])
            continue
        m = _RANK_LINE.match(line)
        if m and m.group(1) == rank and _REPORT_LINE.match(m.group(2)):
            records[-1][0] += "\n" + m.group(2)
        else:
            rank = None
    return [text for text, where in records if where.startswith(source)]
