"""Finding the culprit: one job where rank 1 misbehaves, seen by each tool (real ranks unless said).

Steps 1-5: `monitored_barrier`, `detail_mismatch` (DETAIL), `group_timeouts`, `sleeper`
(for `launch`'s `TimeoutError.ranks`), the simulator's `sim_skip` / `sim_mismatch`. Step 6,
the Flight Recorder (PyTorch's "Flight Recorder for Debugging Stuck Jobs" tutorial): on
Gloo (torch 2.13) it records by default but dumps nothing on a timeout, so
`mismatch_and_dump` dumps on purpose. WORKAROUND: torch 2.13's `fr_trace` raises `KeyError`
on raw Gloo dumps (one `pg_config` entry, empty name, no ranks), so `fix_gloo_dump` rebuilds
it from the groups the entries name, each over all ranks (true for `new_group()` without
`ranks=`, the only kind here). `analyze` runs torch's analyzer: who is missing or disagrees.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import logging
import os
import pickle
import re
import subprocess
import time
import traceback

import torch
import torch.distributed as dist


def first_line(error: BaseException, width: int = 140) -> str:
    """The first line of an error's message, trimmed: what a learner reads first."""
    return str(error).strip().splitlines()[0][:width]


def monitored_barrier(comm, culprit: int = 1, wait: float = 2.0) -> str:
    """Step 1: the culprit never reaches the barrier; rank 0 names it after `wait` s."""
    group = dist.new_group()  # its own: the default group stays clean for later runs
    if comm.rank == culprit:
        time.sleep(wait + 0.5)
        return "(the culprit: never reached the barrier)"
    try:
        dist.monitored_barrier(group, timeout=datetime.timedelta(seconds=wait))
    except RuntimeError as e:
        return first_line(e, 200)
    return "passed"


def detail_mismatch(comm, culprit: int = 1) -> dict[str, tuple[str, float]]:
    """Step 2: the culprit's shape differs, then its op order; kind -> (who ran what, seconds)."""
    bad, old = comm.rank == culprit, dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # the env variable's level: no fresh ranks
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
    """Step 3: the default group's timeout and a `new_group()`'s (not inherited: Gloo's 30 min)."""
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


def mismatch_and_dump(comm, folder: str, kind: str = "missing", culprit: int = 1,
                      group_timeout: float = 2.0) -> str:
    """Step 6 (a rank's worker): one good allreduce, then `culprit` misbehaves; dump.

    kind "missing": the culprit skips the second allreduce; "type": it calls `broadcast`
    where its peers call `all_reduce`. Returns this rank's first error line ("ok" if none).
    """
    if kind not in ("missing", "type"):
        raise ValueError(f"kind={kind!r} must be 'missing' or 'type'")
    group = dist.new_group(timeout=datetime.timedelta(seconds=group_timeout))
    dist.all_reduce(torch.ones(4), group=group)
    outcome = "ok"
    try:
        if comm.rank != culprit:
            dist.all_reduce(torch.ones(4), group=group)
    except RuntimeError as e:
        outcome = str(e).strip().splitlines()[0]
    if kind == "type":
        # after the peers gave up (a default-group barrier orders it): Gloo matches messages by
        # sequence number, not op, so at once it could meet their all_reduce (a size error)
        dist.barrier()
        if comm.rank == culprit:
            try:
                dist.broadcast(torch.ones(4), src=comm.rank, group=group)
            except RuntimeError as e:
                outcome = str(e).strip().splitlines()[0]
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())  # never dumped on its own
    # this demo's group only: a `launch.Pool`'s ranks bring no records of earlier runs
    mine = [e for e in dump["entries"] if e["process_group"][0] == group.group_name]
    # numbered afresh: the analyzer matches ranks by record ids, which count the process's all
    dump["entries"] = [{**e, "record_id": i} for i, e in enumerate(mine)]
    with open(os.path.join(folder, f"rank_{comm.rank}"), "wb") as f:
        pickle.dump(dump, f)
    return outcome


def fix_gloo_dump(dump: dict, world_size: int) -> dict:
    """Step 6 (workaround): `dump` with a `pg_config` entry for every group its entries use."""
    groups = {tuple(e["process_group"]) for e in dump.get("entries", [])}
    ranks = str(list(range(world_size)))
    config = {name: {"name": name, "desc": desc, "ranks": ranks} for name, desc in sorted(groups)}
    return {**dump, "pg_config": config}


def fix_folder(folder: str, world_size: int) -> None:
    """Apply `fix_gloo_dump` to every `rank_<r>` file in `folder`."""
    for r in range(world_size):
        path = os.path.join(folder, f"rank_{r}")
        with open(path, "rb") as f:
            dump = pickle.load(f)
        with open(path, "wb") as f:
            pickle.dump(fix_gloo_dump(dump, world_size), f)


def analyze(folder: str) -> subprocess.CompletedProcess:
    """Step 6: `fr_trace <folder> --prefix rank_` in this process (no second import of torch);
    its report, log and traceback in `.stdout`, returncode 1 if it raised."""
    args, buf, code = [folder, "--prefix", "rank_"], io.StringIO(), 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        from torch.distributed.flight_recorder import fr_trace  # prints on its first import

        handlers = [h for h in logging.getLogger("Flight Recorder").handlers
                    if isinstance(h, logging.StreamHandler)]  # its log, bound at import
        old = [h.setStream(buf) for h in handlers]
        try:
            fr_trace.main(args)
        except Exception:
            traceback.print_exc(file=buf)
            code = 1
        finally:
            for h, stream in zip(handlers, old):
                h.setStream(stream)
    return subprocess.CompletedProcess(["fr_trace", *args], code, stdout=buf.getvalue())
