"""The processes behind torchft_run: replicas forked after one import, and the files
through which they and the parent talk."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path


def write_json(path: Path, value) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def listening(pids) -> list[str]:
    """"ip:port" of every listening TCP socket of `pids`."""
    import psutil

    found = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        found += [f"{c.laddr.ip}:{c.laddr.port}" for c in conns
                  if c.status == psutil.CONN_LISTEN]
    return sorted(found)


def wait_until(predicate, deadline: float, what: str) -> None:
    """Poll `predicate` every 20 ms until it holds; a TimeoutError naming `what` after
    `deadline` (a `time.time()` value), so no wait of the drill can hang."""
    while not predicate():
        if time.time() > deadline:
            raise TimeoutError(f"torchft run: {what} did not happen in time")
        time.sleep(0.02)


def start_replicas(specs: list, out: Path, module: str = "syncedu.faults.torchft_run"
                   ) -> tuple[subprocess.Popen, list[int]]:
    """The forker (`fork_main`, run by `module`'s main block) on `specs` (its replica
    function's arguments, the folder third); one `killpg` reaches it and its replicas."""
    # The forker runs torchft_run as its main module: it imports this file, not the reverse.
    forker = subprocess.Popen([sys.executable, "-m", module, "fork",
                               json.dumps(specs)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True)
    ready = select.select([forker.stdout], [], [], 60.0)[0]  # never forever
    line = forker.stdout.readline() if ready else ""
    if not line.strip():
        forker.kill()
        forker.wait(5)
        raise RuntimeError(f"the torchft replicas did not start; see the logs in {out}")
    return forker, json.loads(line)


def fork_main(replica_main, specs: list) -> None:
    """The forker: import once, fork each `replica_main(*spec)`, print their pids, reap them."""
    import torch
    import torchft  # noqa: F401
    from torchft.checkpointing import http_transport  # noqa: F401

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # imports torch._dynamo: 3 s
    pids = []
    for spec in specs:
        pid = os.fork()
        if pid == 0:
            try:
                replica_main(*spec)
            finally:
                os._exit(1)  # replica_main leaves with os._exit(0) when all went well
        pids.append(pid)
    print(json.dumps(pids), flush=True)
    for _ in pids:  # in the order they end
        pid, status = os.wait()
        write_json(Path(specs[0][2]) / f"exit_{pid}", os.waitstatus_to_exitcode(status))
    sys.stdout.flush()
    os._exit(0)  # nothing to tear down: skip seconds of interpreter shutdown


@contextlib.contextmanager
def _stderr_to(path: Path):
    """fd 2 into `path` for the block: the Rust lighthouse logs there, not in the notebook."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
