"""Finding the culprit: one job where rank 1 misbehaves, seen by each tool.

Side by side (real ranks unless said; every wait a few seconds at most):

1. Gloo's own timeout (flight.py's `mismatch_and_dump`, kind "missing"): rank
   1 skips an allreduce; the error after the group's timeout says "Timed out
   waiting ... for recv", naming no rank (like the "Watchdog caught collective
   operation timeout" of pytorch#118369);
2. `monitored_barrier`: rank 0 checks in every rank within a timeout and names
   the absent one ("Ranks 1 failed to pass monitoredBarrier");
3. `detail_mismatch`: under `TORCH_DISTRIBUTED_DEBUG=DETAIL` (set before the
   process group exists: `with debug_detail():` around the launch; or, as
   here, `dist.set_debug_level` before `new_group()`), a
   collective whose shape or op differs between ranks is refused at once, with
   both ranks' calls in the message; without it, mismatched order hangs;
4. `group_timeouts`: the trap that `new_group()` does not inherit the default
   group's timeout but falls back to 30 minutes;
5. `sleeper` with `launch.run(timeout=)`: our launcher's `TimeoutError.ranks`;
6. `sim_skip` / `sim_mismatch` on simulated ranks: the simulator names a
   deadlock (who waits for what) and a mismatched collective at once.
(The Flight Recorder is flight.py.)
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import time

import torch
import torch.distributed as dist

__all__ = ["monitored_barrier", "detail_mismatch", "debug_detail",
           "fingerprints", "group_timeouts", "sleeper", "sim_skip", "sim_mismatch", "first_line"]


def first_line(error: BaseException, width: int = 140) -> str:
    """The first line of an error's message, trimmed: what a learner reads first."""
    return str(error).strip().splitlines()[0][:width]


def monitored_barrier(comm, culprit: int = 1, wait: float = 2.0) -> str:
    """Step 2: the culprit never reaches the barrier; rank 0 names it after `wait` s.

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


@contextlib.contextmanager
def debug_detail(level: str = "DETAIL"):
    """`TORCH_DISTRIBUTED_DEBUG=level` for the ranks started inside the block."""
    old = os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = level
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_DISTRIBUTED_DEBUG")
        else:
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = old


def detail_mismatch(comm, culprit: int = 1) -> dict[str, tuple[str, float]]:
    """Step 3: the culprit's shape differs, then its op order; kind -> (who ran what, seconds).

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
    """Step 4: the default group's timeout and a `new_group()`'s, as torch reports them."""
    def timeout(pg) -> str:
        return str(pg._get_backend(torch.device("cpu")).options._timeout)
    return {"default group": timeout(dist.distributed_c10d._get_default_group()),
            "new_group()": timeout(dist.new_group())}


def sleeper(comm, culprit: int = 1, seconds: float = 60.0) -> int:
    """Step 5: the culprit hangs (a sleep); the others return at once."""
    if comm.rank == culprit:
        time.sleep(seconds)
    return comm.rank


def sim_skip(comm, culprit: int = 1) -> None:
    """Step 6, simulated: the culprit returns without the allreduce its peers wait in."""
    if comm.rank != culprit:
        comm.all_reduce(torch.ones(4))


def sim_mismatch(comm, culprit: int = 1) -> None:
    """Step 6, simulated: the culprit's allreduce has 5 elements, its peers' 4."""
    comm.all_reduce(torch.ones(5 if comm.rank == culprit else 4))
