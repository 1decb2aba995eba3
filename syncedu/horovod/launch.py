"""`horovod.run` with the course's safeguards: a timeout, restored signal handlers, a skip reason.

`horovod.run(fn, num_proc=2, use_gloo=True)` (Horovod's `horovod.runner` API) starts Gloo
ranks here and returns what `fn` returned on each; `fn` may be defined in a notebook cell.
Called from a notebook, four things bite, and `run` handles them:

1. availability: if `make setup` could not build Horovod, `available()` says why;
2. signal handlers: `horovod.run` leaves its SIGINT/SIGTERM handlers in the caller
   (Ctrl-C no longer interrupts the kernel): `run` puts the caller's back;
3. no timeout: a stalled job (tensor names that differ) waits forever; `run`'s timer
   sends this process the SIGTERM that Horovod's handler turns into "stop every rank";
4. a silent stall: the stall inspector never names the missing ranks on a Gloo build
   (`GlooController::DoInitialization` only `reserve`s `global_ranks_`,
   gloo_controller.cc:92-97, v0.28.1; stall_inspector.cc:54-55 loops over none), so
   the ranks' output is kept (`.output`) and `horovod_log` pulls Horovod's lines out.

`env` is set inside each rank before `fn` runs (so before its `hvd.init()`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from syncedu.comm.ledger import Ledger, RankLedger
from syncedu.comm.runs import RunResult, check_int

__all__ = ["available", "run", "horovod_log", "HorovodRunError", "FAILED_STAMP"]

# Written by scripts/setup.sh when the Horovod build failed: the path of the build log.
FAILED_STAMP = Path(sys.prefix) / ".syncedu-horovod-failed"
# Written by scripts/setup.sh (`make lab`) while Horovod builds in the background: its pid.
BUILDING_STAMP = Path(sys.prefix) / ".syncedu-horovod-building"


class _Tee(io.TextIOBase):
    """A stream that keeps what is written (for `.output`) and passes it on."""

    def __init__(self, keep: io.StringIO, through):
        self.keep, self.through = keep, through

    def write(self, text: str) -> int:
        self.keep.write(text)
        self.through.write(text)
        return len(text)

    def flush(self) -> None:
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
    """Wait for `make lab`'s background Horovod build (if any), printing a line every `every` s."""
    start, next_line, pid = time.monotonic(), every, _build_running()
    if pid is not None:
        print(f"Horovod is still building in the background (pid {pid}; log: "
              f"{Path(sys.prefix) / 'horovod-build.log'}); waiting for it...", flush=True)
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
    """(True, version) if `horovod.torch` loads (after `wait_for_build`), else (False, why)."""
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


@contextlib.contextmanager
def _deadline(timeout: float, ours):
    """Step 3: after `timeout` s, SIGTERM into Horovod's handler (not `ours`); yields `fired`."""
    fired, lock, done = [], threading.Lock(), threading.Event()

    def watch() -> None:
        if done.wait(timeout):
            return
        while not done.wait(0.2):  # wait until Horovod's handler is in place
            with lock:
                handler = signal.getsignal(signal.SIGTERM)
                if not done.is_set() and callable(handler) and handler is not ours:
                    fired.append(True)
                    os.kill(os.getpid(), signal.SIGTERM)  # Horovod's handler: stop the ranks
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield fired
    finally:
        with lock:  # after this, the timer can no longer send anything
            done.set()
        thread.join()


def run(fn, world_size: int = 2, args: tuple = (), kwargs: dict | None = None, *,
        env: dict | None = None, timeout: float = 120.0, start_timeout: float = 60.0,
        quiet: bool = False, output: list | None = None) -> RunResult:
    """`horovod.run(fn, ...)` on `world_size` local Gloo ranks; a `RunResult`, as `launch.run`
    returns: the ranks' values (`fn(*args, **kwargs)` on each: Horovod's ranks get no `comm`),
    `.seconds` (wall-clock of the whole job, start-up included) and `.ledger` (one empty row
    per rank: Horovod moves its bytes in C++; `train.run("horovod")` charges them itself).

    `quiet=True` keeps the ranks' output out of the caller's streams; either way it is
    `.output` on the error raised, and appended to `output` if that is a list.
    """
    check_int("world_size", world_size)
    if not timeout > 0 or not start_timeout > 0:
        raise ValueError(f"timeout={timeout!r} and start_timeout={start_timeout!r} must be > 0")
    ok, why = available()  # Step 1
    if not ok:
        raise RuntimeError(why)
    import horovod

    env = {k: str(v) for k, v in (env or {}).items()}
    ours = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # Step 2
    out = io.StringIO()
    try:
        with (contextlib.redirect_stdout(out if quiet else _Tee(out, sys.stdout)),
              contextlib.redirect_stderr(out if quiet else _Tee(out, sys.stderr)),
              _deadline(timeout, ours[signal.SIGTERM]) as fired):
            try:
                start = time.perf_counter()
                values = horovod.run(_with_env, args=(fn, env, tuple(args), dict(kwargs or {})),
                                     num_proc=world_size, use_gloo=True,
                                     start_timeout=start_timeout, network_interfaces=["lo"])
                return RunResult(values, Ledger([RankLedger(r) for r in range(world_size)]),
                                 time.perf_counter() - start)
            except RuntimeError as e:
                if not fired:
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

    Without timestamps and build paths (the same on every run); a stall report keeps its
    following lines. `source` keeps only records from that file (e.g. "stall_inspector").
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
