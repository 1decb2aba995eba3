"""Entry point of one real rank started by `syncedu.launch` (python -m syncedu.comm._worker).

1. receive the set-up over an inherited socket pair (no port);
2. join the process group and build a `TorchComm`;
3. loop: receive a pickled `fn` and its arguments, barrier, run it, print an
   end-of-run marker (this rank's output is complete), send back the value,
   ledger, time and trace (or the traceback);
4. on "stop", or if the launcher goes away, leave the process group and exit.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection

END_MARK = "\x00syncedu-end"


def _watch_parent(ppid: int) -> None:
    # A rank must never outlive its launcher (a killed kernel, say).
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(1)


def _setup(cfg: dict):
    import torch
    import torch.distributed as dist

    from syncedu.comm import perturb
    from syncedu.comm.shm import ShmComm
    from syncedu.comm.torch_comm import TorchComm

    torch.set_num_threads(perturb.threads(cfg["threads"], cfg["rank"], cfg["pin_threads"]))
    if cfg["backend"] == "nccl":
        torch.cuda.set_device(cfg["rank"])
    store = dist.FileStore(cfg["store"], cfg["world_size"])
    shm = cfg["backend"] == "shm"  # shared memory between the ranks, Gloo for the launcher
    dist.init_process_group("gloo" if shm else cfg["backend"], store=store, rank=cfg["rank"],
                            world_size=cfg["world_size"],
                            timeout=timedelta(seconds=cfg["pg_timeout"]))
    comm = ShmComm(prefix=os.path.basename(os.path.dirname(cfg["store"])),
                   network=cfg["network"]) if shm else TorchComm(network=cfg["network"])
    perturb.install(comm)  # test runs only (SYNCEDU_PERTURB): other arrival orders
    return comm


def _run_one(comm, payload: bytes) -> tuple:
    import torch.distributed as dist

    fn, args, kwargs = pickle.loads(payload)
    comm.ledger.reset()
    comm.trace = type(comm.trace)()
    dist.barrier()  # launcher traffic, not charged: aligns the ranks' start
    t0 = time.perf_counter()
    comm.start_clock()
    value = fn(comm, *args, **kwargs)
    seconds = time.perf_counter() - t0
    return ("done", value, comm.ledger, seconds, comm.trace)  # pickled by main, not in fn's try


def main() -> None:
    """One rank's life (the module docstring's steps 1-4): set up, then serve runs until "stop".

    Errors inside a run go back as ("error", message, traceback), so the launcher raises a
    `WorkerError` naming this rank; a set-up failure does the same before "ready".
    """
    conn = Connection(int(os.environ["SYNCEDU_FD"]))
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    cfg = pickle.loads(conn.recv_bytes())
    try:
        comm = _setup(cfg)
        conn.send_bytes(pickle.dumps(("ready",)))
    except BaseException as e:
        conn.send_bytes(pickle.dumps(("error", repr(e), traceback.format_exc())))
        return
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break
        if msg[0] == "stop":
            break
        try:
            reply = _run_one(comm, msg[1])
        except BaseException as e:
            reply = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
        try:
            data = pickle.dumps(reply)
        except Exception as e:  # the value fn returned (a lock, a generator, the comm...)
            data = pickle.dumps(("error", f"the value fn returned on rank {comm.rank} (a "
                                 f"{type(reply[1]).__name__}) cannot be sent back to the launcher "
                                 f"({e}); return tensors, numbers or plain data (lists, dicts, "
                                 "dataclasses of them)", traceback.format_exc()))
        # The marker goes first: the launcher's reader has it by the time the reply lands.
        print(END_MARK, flush=True)
        conn.send_bytes(data)
    _shutdown()


def _shutdown() -> None:
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    sys.stdout.flush()
    # Skip interpreter teardown: Gloo/NCCL threads sometimes abort at exit
    # ("terminate called without an active exception") after all work is done.
    os._exit(0)


if __name__ == "__main__":
    main()
