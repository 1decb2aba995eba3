"""`Ranks`: a set of live rank processes, their pipes and their output (behind `launch`).

1. start `world_size` processes (`python -m syncedu.comm._worker`), each in its own session
   (a kill reaches anything it started), with one end of a socket pair and a share of the
   CPU threads; they rendezvous through a file store in a fresh folder (nothing listens);
2. pump every rank's output line by line into the caller's `sys.stdout`, marked `[rank r]`;
3. wait for replies with a deadline, noticing a rank that raised, died (its pipe closes)
   or is too slow; on any failure or interrupt kill every rank's process group and reap it.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import os
import pickle
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Pipe, wait

import psutil

from ._worker import END_MARK
from .errors import TimeoutError, WorkerError
from .rank_output import RankSink
from .shm import SHM_DIR


def default_threads(world_size: int) -> int:
    """Each rank's share of this machine's cores (at least 1), so ranks don't oversubscribe."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // world_size)


def loopback_interface() -> str | None:
    """Name of the loopback device ("lo" on Linux, "lo0" on macOS), if found."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        return None
    return next((n for n in names if n.startswith("lo")), None)


def _child_env(rank: int, world_size: int, threads: int, fd: int) -> dict:
    env = dict(os.environ)
    env.update(SYNCEDU_FD=str(fd), RANK=str(rank), WORLD_SIZE=str(world_size),
               LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONUNBUFFERED="1", PYTHONWARNINGS=env.get("PYTHONWARNINGS", "ignore"))
    lo = loopback_interface()
    if lo:  # safe by default: Gloo and NCCL listen on loopback only, unless told otherwise
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    # The caller's working directory and sys.path, so `fn` imported from a local module works.
    path = [p for p in sys.path if p]
    env["PYTHONPATH"] = os.pathsep.join(path + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@contextlib.contextmanager
def _interrupt_deferred():
    """Hold back Ctrl-C (SIGINT) until the block is done, then raise it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "closed its connection to the launcher"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _remove_stale_folders() -> None:
    """Remove the rendezvous folders of launchers that died without cleaning up (kill -9):
    `syncedu-<pid>-*` of this user whose pid is gone, and the shared-memory segments named
    after them (shm.py). A live pid keeps its folder."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "syncedu-*-*")):
        pid = os.path.basename(path).split("-")[1]
        with contextlib.suppress(OSError):  # (another launcher may be removing it too)
            if pid.isdigit() and not psutil.pid_exists(int(pid)) \
                    and os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path)
                for segment in glob.glob(f"{SHM_DIR}/{os.path.basename(path)}-*"):
                    os.unlink(segment)


# Gloo aborts the rank that notices a size/dtype mismatch (SIGABRT) and resets its peers'
# connections: this line, in the aborted rank's output, names the real mistake.
GLOO_MISMATCH = "Received data size doesn't match"


class Ranks:
    """`world_size` live rank processes joined in one process group."""

    def __init__(self, world_size: int, *, backend: str, threads: int, network,
                 pg_timeout: float, start_timeout: float, output: str, pin_threads: bool = False):
        self.world_size = world_size
        self.output = output
        self._lines: queue.Queue = queue.Queue()
        self._recent = [collections.deque(maxlen=30) for _ in range(world_size)]
        self._ends = [0] * world_size
        self._runs = 0
        _remove_stale_folders()
        self._tmp = tempfile.mkdtemp(prefix=f"syncedu-{os.getpid()}-")
        self.procs: list[subprocess.Popen] = []
        self.conns = []
        try:
            cfg = dict(world_size=world_size, backend=backend, threads=threads, network=network,
                       pg_timeout=pg_timeout, store=os.path.join(self._tmp, "store"),
                       pin_threads=pin_threads)
            for r in range(world_size):
                self._spawn(r, dict(cfg, rank=r))
            self._collect(start_timeout, "start")
        except BaseException:
            self.kill()
            raise

    def _spawn(self, rank: int, cfg: dict) -> None:
        mine, theirs = Pipe(duplex=True)
        env = _child_env(rank, cfg["world_size"], cfg["threads"], theirs.fileno())
        with _interrupt_deferred():  # a Ctrl-C inside Popen would orphan the new process
            proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "syncedu.comm._worker"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                pass_fds=[theirs.fileno()], env=env, start_new_session=True)
            self.procs.append(proc)
            self.conns.append(mine)
        theirs.close()
        threading.Thread(target=self._pump, args=(rank, proc.stdout), daemon=True,
                         name=f"syncedu-out-{rank}").start()
        mine.send_bytes(pickle.dumps(cfg))

    def _pump(self, rank: int, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._lines.put((rank, None if line == END_MARK else line))  # None: end of a run
        stream.close()

    def _drain(self, sink: RankSink, block: float = 0.0) -> None:
        """Pass waiting output lines to `sink`; `block` > 0: wait that long for the first."""
        while True:
            try:
                rank, line = self._lines.get(timeout=block)  # block=0: only what is there
            except queue.Empty:
                return
            block = 0.0
            if line is None:
                self._ends[rank] += 1
                continue
            self._recent[rank].append(line)
            sink.write(rank, line + "\n")

    def _finish_output(self, sink: RankSink, grace: float) -> None:
        # Wait (briefly) for each rank's end-of-run marker, so no line is lost.
        deadline = time.monotonic() + grace
        while min(self._ends) < self._runs and time.monotonic() < deadline:
            self._drain(sink, block=max(1e-3, deadline - time.monotonic()))
        self._drain(sink)
        sink.close()  # "ordered": rank 0's lines, then rank 1's, ...
        sys.stdout.flush()

    def _collect(self, timeout: float | None, what: str) -> list:
        """Wait for one reply per rank; raise on the first failure."""
        pending, replies = set(range(self.world_size)), {}
        sink = RankSink(self.output, sys.stdout)  # ("start": never closed, "ordered" dropped)
        deadline = None if timeout is None else time.monotonic() + timeout
        index = {id(c): r for r, c in enumerate(self.conns)}
        failure = None
        try:
            while pending:
                self._drain(sink)
                for conn in wait([self.conns[r] for r in sorted(pending)], timeout=0.02):
                    r = index[id(conn)]
                    replies[r] = self._receive(r, sink)
                    pending.discard(r)
                if pending and deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{what} did not finish within {timeout:g} s; ranks still running: "
                        f"{sorted(pending)} (all ranks were stopped)", sorted(pending))
        except WorkerError as e:
            failure = e
        finally:
            if what == "start":
                self._drain(sink)
            else:  # all output of the run, even when it failed
                self._finish_output(sink, grace=0.5 if pending else 2.0)
        if failure is not None:  # now that every rank's last output is in
            raise self._mismatch() or failure
        return [replies[r] for r in range(self.world_size)]

    def _mismatch(self) -> WorkerError | None:
        """The rank whose output shows Gloo's size-mismatch abort, with the mistake named."""
        found = [(r, line) for r, lines in enumerate(self._recent) for line in lines
                 if GLOO_MISMATCH in line]
        return found and WorkerError(
            found[0][0], "ranks passed tensors of different sizes or dtypes to the same "
            "collective: every rank must pass the same shape and dtype (Gloo then aborted this "
            "rank: SIGABRT)", f"Gloo on rank {found[0][0]}: {found[0][1].strip()}")

    def _receive(self, r: int, sink: RankSink):
        try:
            msg = pickle.loads(self.conns[r].recv_bytes())
        except (EOFError, OSError):
            try:
                code = self.procs[r].wait(timeout=2)
            except subprocess.TimeoutExpired:
                code = None
            self._drain(sink)
            tail = "\n".join(self._recent[r])
            raise WorkerError(r, f"the process {_exit_reason(code)} before returning a result",
                              f"last output of rank {r}:\n{tail}" if tail else "") from None
        if msg[0] == "error":
            raise WorkerError(r, msg[1], msg[2])
        return msg

    def run(self, payload: bytes, timeout: float | None) -> list:
        """Send one pickled (fn, args, kwargs) to every rank and collect the replies."""
        self._runs += 1
        message = pickle.dumps(("run", payload))
        for conn in self.conns:
            conn.send_bytes(message)
        return self._collect(timeout, "the run")

    def alive(self) -> bool:
        """True while every rank process runs (a dead one means: start fresh ranks)."""
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def stop(self, grace: float = 3.0) -> None:
        """Ask every rank to leave the process group and exit; kill what stays."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(pickle.dumps(("stop",)))
        deadline = time.monotonic() + grace
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        """Kill every rank (and anything it started) and reap it. Idempotent."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for conn in self.conns:
            conn.close()
        self.conns = []
        shutil.rmtree(self._tmp, ignore_errors=True)
        for path in glob.glob(f"{SHM_DIR}/{os.path.basename(self._tmp)}-*"):  # killed in set-up
            os.unlink(path)
