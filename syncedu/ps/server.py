"""The server side of a parameter server: receive gradients, update a shard, reply.

Each server holds one flat range of the parameters (`shard_ranges`), so the gradient traffic of
W workers is split over S servers. `serve_sync` (mode "sync"), for each step c:

1. receive step c's push from every worker, in worker order;
2. average the W gradients and update once: shard -= lr * mean (plain SGD on the global batch,
   so the run equals one process);
3. reply to every worker with the new shard (not after the last step).

`serve_bounded` ("async", "ssp"; bound tau = inf or `staleness`), until every worker has pushed
all its steps:

1. receive the next push from any worker (`comm.recv_any`: on simulated ranks the earliest in
   logical time, so runs repeat);
2. apply it at once: shard -= (lr / W) * gradient, and record its staleness (SSP's clock gap:
   the worker's step minus the slowest unfinished worker's step when it pulled) and its delay
   (the updates this server applied between the worker's pull and this push: the server's
   version now minus the version it sent that worker, the delay of async-SGD analyses);
3. reply to every waiting worker at most tau steps ahead of the slowest unfinished one; the
   others wait for a slower worker's push.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from syncedu.ps.config import HEADER, PULL_TAG, PUSH_TAG, PSConfig


@dataclass
class Applied:
    """One applied gradient, as a server saw it."""

    time: float
    worker: int
    step: int
    loss: float
    staleness: int  # clock gap, in steps (what the SSP bound tau limits)
    delay: int = 0  # updates applied since the worker's pull (server version now - pulled)


@dataclass
class ServerLog:
    """What one server returns: its final shard and every gradient it applied."""

    shard: torch.Tensor
    events: list[Applied] = field(default_factory=list)
    per_worker: list[int] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0


class _Replies:
    """Sends parameter replies with `isend`, at most one in flight per worker."""

    def __init__(self, comm, workers: int):
        self.comm, self.works = comm, [None] * workers

    def send(self, worker: int, shard: torch.Tensor) -> None:
        if self.works[worker] is not None:
            self.works[worker][0].wait()
        copy = shard.clone()  # the shard changes before the send is done
        with self.comm.scope("ps_pull"):
            self.works[worker] = (self.comm.isend(copy, worker, PULL_TAG), copy)

    def close(self) -> None:
        for work, _copy in filter(None, self.works):
            work.wait()


def serve(comm, cfg: PSConfig, shard: torch.Tensor) -> ServerLog:
    """Run server rank `comm.rank` on its range of the parameters (initially `shard`)."""
    log = ServerLog(shard, per_worker=[0] * cfg.workers, start=comm.now())
    replies = _Replies(comm, cfg.workers)
    try:
        if cfg.mode == "sync":
            serve_sync(comm, cfg, log, replies)
        else:
            serve_bounded(comm, cfg, log, replies, cfg.bound)
    finally:
        replies.close()
    if log.per_worker != list(cfg.steps):
        raise RuntimeError(f"server rank {comm.rank} applied {log.per_worker} gradients per "
                           f"worker, expected {list(cfg.steps)}")
    log.end = comm.now()
    return log


def serve_sync(comm, cfg: PSConfig, log: ServerLog, replies: _Replies) -> None:
    """Bulk synchronous: all W pushes of a step, one averaged update, W replies."""
    n, w_count = log.shard.numel(), cfg.workers
    bufs = [log.shard.new_empty(n + HEADER) for _ in range(w_count)]
    steps = cfg.steps[0]
    for c in range(steps):
        with comm.scope("ps_push"):
            for w in range(w_count):
                comm.recv(bufs[w], w, PUSH_TAG)  # Step 1
        grad = torch.stack([b[:n] for b in bufs]).mean(0)  # Step 2
        log.shard.add_(grad, alpha=-cfg.lr)
        for w, b in enumerate(bufs):
            log.events.append(Applied(comm.now(), w, c, b[n].item(), 0))
            log.per_worker[w] += 1
        if c < steps - 1:
            for w in range(w_count):
                replies.send(w, log.shard)  # Step 3


def serve_bounded(comm, cfg: PSConfig, log: ServerLog, replies: _Replies, tau: float) -> None:
    """Apply each push on arrival; reply to workers within `tau` steps of the slowest."""
    n, w_count = log.shard.numel(), cfg.workers
    buf = torch.empty(n + HEADER, dtype=log.shard.dtype, device=log.shard.device)
    clock = log.per_worker  # pushes received per worker = the step each is on next
    # per worker, what it last read: (complete steps in it, the version = updates applied)
    read = [(0, 0)] * w_count
    waiting: list[int] = []
    while clock != list(cfg.steps):
        with comm.scope("ps_push"):
            w = comm.recv_any(buf, PUSH_TAG)  # Step 1
        if not 0 <= w < w_count or clock[w] >= cfg.steps[w]:
            raise RuntimeError(f"server rank {comm.rank} got an unexpected push from rank {w}")
        log.shard.add_(buf[:n], alpha=-cfg.lr / w_count)  # Step 2
        log.events.append(Applied(comm.now(), w, clock[w], buf[n].item(), clock[w] - read[w][0],
                                  sum(clock) - read[w][1]))  # version before this update
        clock[w] += 1
        if clock[w] < cfg.steps[w]:
            waiting.append(w)
        waiting = release(cfg, log, replies, waiting, read, tau)  # Step 3


def release(cfg: PSConfig, log: ServerLog, replies: _Replies, waiting: list[int],
             read: list, tau: float) -> list[int]:
    """Step 3: reply to the waiting workers within tau steps of the slowest; keep the rest.
    `read[v]`: (complete steps, version) of what worker v was last sent."""
    clock = log.per_worker
    active = [clock[v] for v in range(cfg.workers) if clock[v] < cfg.steps[v]]
    complete = min(active, default=math.inf)  # every step below this is in the shard
    still = []
    for v in sorted(waiting):
        if clock[v] - complete <= tau:
            replies.send(v, log.shard)
            read[v] = (complete, sum(clock))
        else:
            still.append(v)
    return still
