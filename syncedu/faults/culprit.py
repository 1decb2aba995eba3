"""Finding the culprit: one job where rank 1 misbehaves, seen by each tool.

Real ranks unless said (the Flight Recorder and Gloo's own timeout are in flight.py):

1. `monitored_barrier`: rank 0 names the rank absent from a barrier;
2. `detail_mismatch`: under `TORCH_DISTRIBUTED_DEBUG=DETAIL` (set before the
   process group exists, or `dist.set_debug_level` before a `new_group()`), a
   collective whose shape or op differs between ranks is refused at once,
   with both ranks' calls in the message;
3. `group_timeouts`: `new_group()` does not inherit the default group's
   timeout but falls back to the backend's (30 minutes on Gloo);
4. `sleeper`: for `launch`'s `TimeoutError.ranks`;
5. `sim_skip` / `sim_mismatch`: the simulator names a deadlock (who waits for
   what) and a mismatched collective at once.
"""

from __future__ import annotations

import datetime
import re
import time

import torch
import torch.distributed as dist

__all__ = ["monitored_barrier", "detail_mismatch", "fingerprints", "group_timeouts", "sleeper",
           "sim_skip", "sim_mismatch", "first_line"]


def first_line(error: BaseException, width: int = 140) -> str:
    """The first line of an error's message, trimmed: what a learner reads first."""
    return str(error).strip().splitlines()[0][:width]


def monitored_barrier(comm, culprit: int = 1, wait: float = 2.0) -> str:
    """Step 1: the culprit never reaches the barrier; rank 0 names it after `wait` s.

    On a group of its own, so that the default group stays clean for later runs.
    """
    group = dist.new_group()
    if comm.rank == culprit:
        time.sleep(wait + 0.5)
        return "(the culprit: never reached the barrier)"
    try:
        dist.monitored_barrier(group, timeout=datetime.timedelta(seconds=wait))
    except RuntimeError as e:
        return first_line(e, 200)
    return "passed"


def detail_mismatch(comm, culprit: int = 1) -> dict[str, tuple[str, float]]:
    """Step 2: the culprit's shape differs, then its op order; kind -> (who ran what, seconds).

    Runs on a group made under the DETAIL level (`dist.set_debug_level`, what
    `TORCH_DISTRIBUTED_DEBUG=DETAIL` sets at start-up), so it needs no fresh ranks.
    """
    bad, old = comm.rank == culprit, dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        g = dist.new_group()  # wrapped: every collective's fingerprint is checked first
    finally:
        dist.set_debug_level(old)
    a = lambda: dist.broadcast(torch.ones(4), 0, group=g)  # noqa: E731
    b = lambda: dist.all_reduce(torch.ones(4), group=g)  # noqa: E731
    cases = {"shape": [lambda: dist.all_reduce(torch.ones(5 if bad else 4), group=g)],
             "order": [b, a] if bad else [a, b]}
    out = {}
    for kind, calls in cases.items():
        t0 = time.perf_counter()
        try:
            for call in calls:
                call()
            out[kind] = ("no error", time.perf_counter() - t0)
        except RuntimeError as e:
            out[kind] = (fingerprints(str(e)), time.perf_counter() - t0)
    return out


def fingerprints(message: str) -> str:
    """"rank 0: ALLREDUCE [4] | rank 1: ALLREDUCE [5]" from a DETAIL mismatch message."""
    found = re.findall(r"Rank (\d+) is running collective: CollectiveFingerPrint\("
                       r"SequenceNumber=\d+, OpType=(\w+), TensorShape=\[([^\]]*)\]", message)
    if not found:
        return first_line(RuntimeError(message))
    return " | ".join(f"rank {r}: {op} [{shape}]" for r, op, shape in sorted(set(found)))


def group_timeouts(comm) -> dict[str, str]:
    """Step 3: the default group's timeout and a `new_group()`'s, as torch reports them."""
    def timeout(pg) -> str:
        return str(pg._get_backend(torch.device("cpu")).options._timeout)
    return {"default group": timeout(dist.distributed_c10d._get_default_group()),
            "new_group()": timeout(dist.new_group())}


def sleeper(comm, culprit: int = 1, seconds: float = 60.0) -> int:
    """Step 4: the culprit hangs (a sleep); the others return at once."""
    if comm.rank == culprit:
        time.sleep(seconds)
    return comm.rank


def sim_skip(comm, culprit: int = 1) -> None:
    """Step 5, simulated: the culprit returns without the allreduce its peers wait in."""
    if comm.rank != culprit:
        comm.all_reduce(torch.ones(4))


def sim_mismatch(comm, culprit: int = 1) -> None:
    """Step 5, simulated: the culprit's allreduce has 5 elements, its peers' 4."""
    comm.all_reduce(torch.ones(5 if comm.rank == culprit else 4))
