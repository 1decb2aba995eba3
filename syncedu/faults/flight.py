"""The Flight Recorder on Gloo: record, dump, fix up, analyze.

torch.distributed keeps a ring buffer of the last collectives of every
process group (the Flight Recorder; PyTorch's "Flight Recorder for Debugging
Stuck Jobs" tutorial). On Gloo (torch 2.13) it records by default, but dumps
nothing by itself on a timeout, so each rank dumps on purpose:

1. run the job; on a collective error, every rank calls
   `torch._C._distributed_c10d._dump_fr_trace()` (pickled bytes) and writes
   them to `<folder>/rank_<r>`;
2. WORKAROUND for an upstream defect: torch 2.13's `fr_trace` raises
   `KeyError` on raw Gloo dumps, whose `pg_config` has one entry with an empty
   group name and no ranks. `fix_gloo_dump` rebuilds `pg_config` from the
   groups the entries name, each over all `world_size` ranks (true for groups
   made by `new_group()` without `ranks=`, the only kind these demos use);
3. run torch's analyzer, `python -m torch.distributed.flight_recorder.fr_trace
   <folder>` (here its `main`, in this process), which matches the ranks'
   entries and reports who is missing or disagrees.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import logging
import os
import pickle
import subprocess
import time
import traceback

import torch
import torch.distributed as dist

__all__ = ["mismatch_and_dump", "fix_gloo_dump", "fix_folder", "analyze"]


def mismatch_and_dump(comm, folder: str, kind: str = "missing", culprit: int = 1,
                      group_timeout: float = 2.0) -> str:
    """Step 1 (a rank's worker): one good allreduce, then `culprit` misbehaves; dump.

    kind "missing": the culprit skips the second allreduce; kind "type": it
    calls `broadcast` where its peers call `all_reduce`. Returns the first line
    of this rank's error, Gloo's own words ("ok" if none). The dump keeps the
    records of this demo's group only, so that ranks reused from a `launch.Pool`
    bring no records of earlier runs (as fresh ranks would).
    """
    if kind not in ("missing", "type"):
        raise ValueError(f"kind={kind!r} must be 'missing' or 'type'")
    group = dist.new_group(timeout=datetime.timedelta(seconds=group_timeout))
    dist.all_reduce(torch.ones(4), group=group)
    outcome = "ok"
    try:
        if comm.rank != culprit:
            dist.all_reduce(torch.ones(4), group=group)
        elif kind == "type":
            # Wait out the peers' timeout first: Gloo matches messages by a per-group
            # sequence number, not by op type, so a broadcast sent at once can meet the
            # peers' all_reduce and abort it with a size error instead of the hang this shows.
            time.sleep(group_timeout + 0.5)
            dist.broadcast(torch.ones(4), src=comm.rank, group=group)
    except RuntimeError as e:
        outcome = str(e).strip().splitlines()[0]
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())  # never dumped on its own
    mine = [e for e in dump["entries"] if e["process_group"][0] == group.group_name]
    # numbered afresh: record ids count every collective of the process, and
    # the analyzer matches ranks' records by them
    dump["entries"] = [{**e, "record_id": i} for i, e in enumerate(mine)]
    with open(os.path.join(folder, f"rank_{comm.rank}"), "wb") as f:
        pickle.dump(dump, f)
    return outcome


def fix_gloo_dump(dump: dict, world_size: int) -> dict:
    """Step 2 (workaround): `dump` with a `pg_config` entry for every group its entries use."""
    groups = {tuple(e["process_group"]) for e in dump.get("entries", [])}
    ranks = str(list(range(world_size)))
    config = {name: {"name": name, "desc": desc, "ranks": ranks} for name, desc in sorted(groups)}
    return {**dump, "pg_config": config}


def fix_folder(folder: str, world_size: int) -> list[str]:
    """Apply `fix_gloo_dump` to every `rank_<r>` file in `folder`; returns the files fixed."""
    fixed = []
    for r in range(world_size):
        path = os.path.join(folder, f"rank_{r}")
        with open(path, "rb") as f:
            dump = pickle.load(f)
        with open(path, "wb") as f:
            pickle.dump(fix_gloo_dump(dump, world_size), f)
        fixed.append(path)
    return fixed


def analyze(folder: str) -> subprocess.CompletedProcess:
    """Step 3: torch's own analyzer on `folder`; its report (log and traceback too) is `.stdout`.

    The same as `python -m torch.distributed.flight_recorder.fr_trace <folder>
    --prefix rank_` (its `main`), run in this process to spare a second import
    of torch; returncode 1 if it raised.
    """
    args = [folder, "--prefix", "rank_"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        from torch.distributed.flight_recorder import fr_trace

        handlers = [h for h in logging.getLogger("Flight Recorder").handlers
                    if isinstance(h, logging.StreamHandler)]  # its log, bound at import
        old = [h.stream for h in handlers]
        for h in handlers:
            h.setStream(buf)
        try:
            fr_trace.main(args)
            code = 0
        except Exception:
            traceback.print_exc(file=buf)
            code = 1
        finally:
            for h, stream in zip(handlers, old):
                h.setStream(stream)
    return subprocess.CompletedProcess(["fr_trace", *args], code, stdout=buf.getvalue())
