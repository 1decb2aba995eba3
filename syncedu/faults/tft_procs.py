"""The processes behind torchft_run: a lighthouse, replicas forked after one import.

1. `_start_lighthouse`: torchft's Rust `LighthouseServer` on 127.0.0.1 in a
   small interpreter that runs this file as a script and loads the extension
   file alone (neither `syncedu` nor torch is imported: seconds saved);
2. `_start_replicas`: one interpreter imports torch and torchft once, then
   forks a replica per spec (`torchft_run.replica_main`), prints their pids,
   reaps them in the order they end and writes each exit code to `exit_<pid>`;
3. `listening`: every listening socket of those processes (the loopback test);
4. `_write` / `_wait`: the files the parent and the replicas talk through,
   written atomically, and a wait that always has a deadline.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path


def _write(path: Path, value) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def listening(pids, ports=None) -> list[str]:
    """"ip:port" of every listening TCP socket of `pids` (only `ports`, if given)."""
    import psutil

    found = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        found += [f"{c.laddr.ip}:{c.laddr.port}" for c in conns
                  if c.status == psutil.CONN_LISTEN and (ports is None or c.laddr.port in ports)]
    return sorted(found)


def _wait(predicate, deadline: float, what: str) -> None:
    while not predicate():
        if time.time() > deadline:
            raise TimeoutError(f"torchft run: {what} did not happen in time")
        time.sleep(0.02)


def _start_replicas(specs: list, out: Path) -> tuple[subprocess.Popen, list[int]]:
    """One fresh interpreter imports torch and torchft once, then forks a replica per spec.

    Each `spec` is `replica_main`'s arguments. Forking after the import spares
    every replica the seconds of CPU an import of torch costs (what DataLoader's
    fork workers rely on too). The forks share the forker's session, so one
    `killpg` reaches them all; the forker reaps each and writes `exit_<pid>`.
    """
    # The forker runs torchft_run as its main module: it imports this file, not the reverse.
    forker = subprocess.Popen([sys.executable, "-m", "syncedu.faults.torchft_run", "fork",
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
    """The forker: import once, fork each replica (`replica_main(*spec)`), print their pids,
    reap them."""
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
        _write(Path(specs[0][2]) / f"exit_{pid}", os.waitstatus_to_exitcode(status))
    sys.stdout.flush()
    os._exit(0)  # nothing to tear down: skip seconds of interpreter shutdown


def _start_lighthouse(out: Path, cfg) -> subprocess.Popen:
    """Step 1: the lighthouse in its own process, on 127.0.0.1, its logs to a file."""
    with open(out / "lighthouse.log", "wb") as log:
        return subprocess.Popen([sys.executable, __file__, "lighthouse",  # as a script: no torch
                                 str(cfg.heartbeat_ms), str(cfg.deadline)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                text=True)


def _lighthouse_class():
    """torchft's Rust `LighthouseServer`, loaded from its extension file alone.

    `import torchft._torchft` would first run the package's `__init__`, which
    imports torch (seconds of CPU); the lighthouse needs none of it.
    """
    import importlib.machinery
    import importlib.util

    folder = importlib.util.find_spec("torchft").submodule_search_locations[0]
    path = next(str(p) for p in Path(folder).glob("_torchft*.so"))
    loader = importlib.machinery.ExtensionFileLoader("torchft._torchft", path)
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("torchft._torchft", path, loader=loader))
    loader.exec_module(module)
    return module.LighthouseServer


def lighthouse_main(heartbeat_ms: int, lifetime: float) -> None:
    """Serve quorums on 127.0.0.1 until killed (or `lifetime` s); print the port first."""
    server = _lighthouse_class()(bind="127.0.0.1:0", min_replicas=1,
                                 heartbeat_timeout_ms=heartbeat_ms)
    print(server.address().rsplit(":", 1)[1], flush=True)
    time.sleep(lifetime)
    server.shutdown()



if __name__ == "__main__":  # the lighthouse, started by `_start_lighthouse` as a script
    lighthouse_main(int(sys.argv[2]), float(sys.argv[3]))
