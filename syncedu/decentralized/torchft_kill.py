"""Streaming DiLoCo under torchft's manager with a replica SIGKILLed: the quorum shrinks.

torchft_check.py's job (torchft 0.2.0's `DiLoCo`, 2 fragments, H = 4, delay 1, alpha 0.5,
24 steps), on 3 replica groups of one rank each, forked after one import by lesson 11's
machinery (faults/tft_procs.py; its servers bound to 127.0.0.1 by faults/torchft_run.py):

1. every replica creates its `Manager` (heartbeating to the lighthouse), then waits for the
   others (a file barrier), so the first quorum holds all three: the lighthouse waits for a
   heartbeating straggler before it forms a quorum (lighthouse.rs `quorum_compute`,
   `all_healthy_joined`, read at meta-pytorch/torchft 7eb7087, src/lighthouse.rs:243-260);
2. after `after` inner steps (a multiple of H/F: the last fragment sync committed and
   nothing in flight) replica `dead` SIGKILLs itself;
3. the survivors' next fragment sync calls `start_quorum()`: the dead replica's heartbeat
   stops, after `heartbeat_ms` the lighthouse drops it and forms a quorum of the survivors
   (not a fast quorum: the previous one had three); the manager reconfigures Gloo on two
   ranks and averages the pseudo-gradients over them. The lighthouse's join timeout is the
   run's `timeout` (0.2.0's default, a fraction of a second here, would also drop the dead
   one, or a live replica late to its first quorum): only the heartbeat decides;
4. the launcher counts who is alive by itself: the forker reaps each replica and writes its
   exit code (-9 for the SIGKILLed one).

The witness is not here but in lesson 12's cell and tests/decentralized/test_torchft_kill.py,
where it is shown: ours (streaming.py) on 3 simulated ranks whose dead rank sends zeros after
the same syncs while the others divide by 2. Not bit for bit: 3 replicas sum in another
order, and torchft sums then divides by 3 where ours divides then sums (torchft_check matches
bits at 2). The negative control is ours still dividing by 3 (the dead replica counted as a
zero vote). Rejoining and healing is lesson 11's (not here).
"""

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from syncedu.decentralized import torchft_check as check
from syncedu.faults.tft_procs import fork_main, start_replicas, wait_until, write_json


def replica(index: int, lighthouse: str, folder: str, replicas: int, dead: int, after: int,
            timeout: float) -> None:
    """One torchft replica group (torchft_check.theirs) logging the manager's participant
    count after each inner step; replica `dead` SIGKILLs itself after `after` inner steps."""
    out, log = Path(folder), []
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the forker's stdout carries only the pids

    def hook(manager):
        write_json(out / f"ready_{index}", True)  # Step 1
        wait_until(lambda: all((out / f"ready_{i}").exists() for i in range(replicas)),
                   time.time() + timeout, "every replica's manager")

        def after_step():
            log.append(manager.num_participants())
            if index == dead and len(log) == after:  # Step 2
                os.kill(os.getpid(), signal.SIGKILL)
        return after_step

    params = check.theirs(SimpleNamespace(rank=index), check.JOB, lighthouse, folder, hook)
    torch.save({"params": params, "participants": log}, out / f"final_{index}.pt")
    os._exit(0)


def run(replicas: int = 3, dead: int = 2, after: int = 8, *, heartbeat_ms: int = 500,
        timeout: float = 60.0) -> dict:
    """Steps 1-4: {"exit": the exit code of each replica, "final": per survivor
    {"params": its final parameters, "participants": the quorum's size after each step}}."""
    period = check.JOB["inner_steps"] // check.JOB["fragments"]
    if not (3 <= replicas <= 4 and 0 <= dead < replicas and after % period == 0 < after < 24):
        raise ValueError(f"replicas={replicas}, dead={dead}, after={after}: want 3 or 4 "
                         f"replicas, dead one of them, after a multiple of {period} in 1..23")
    out = Path(tempfile.mkdtemp(prefix="torchft_kill_"))
    with check.lighthouse(out, min_replicas=replicas - 1, heartbeat_timeout_ms=heartbeat_ms,
                          join_timeout_ms=int(timeout * 1e3)) as address:  # Steps 1, 3
        forker, pids = start_replicas([[i, address, str(out), replicas, dead, after, timeout]
                                       for i in range(replicas)], out, module=__name__)
        with forker:  # Popen's exit closes its pipe and reaps it
            try:  # Step 4: the forker reaps every replica (their exit codes), then ends
                wait_until(lambda: forker.poll() is not None, time.time() + timeout,
                           "every replica's end")
            finally:
                if forker.poll() is None:
                    os.killpg(forker.pid, signal.SIGKILL)  # the forker and its replicas
    return {"exit": [json.loads((out / f"exit_{pid}").read_text()) for pid in pids],
            "final": {i: torch.load(out / f"final_{i}.pt") for i in range(replicas) if i != dead}}


if __name__ == "__main__":  # the replicas' forker, started by tft_procs.start_replicas
    fork_main(replica, json.loads(sys.argv[2]))
