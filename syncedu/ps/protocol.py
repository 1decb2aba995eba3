"""Parameter servers on `Comm`: W workers and S servers in one run, three modes.

    ranks 0 .. W-1      workers: compute a gradient, push it, pull parameters
    ranks W .. W+S-1    servers: server s owns the flat range s of the parameters

`ps_rank(comm, cfg, params, grad_fn)` is the whole protocol for one rank; the
training harness (`syncedu.ps.training`, public as `syncedu.ps.run`) supplies
the model, the data and the gradient function. Steps:

1. check the world: `cfg.workers + cfg.servers` ranks;
2. a worker runs `ps_worker.run_worker` (compute, push, pull);
3. a server takes its flat range of the initial parameters and runs
   `ps_server.serve` ("sync": average W pushes per step; "async"/"ssp": apply
   each push on arrival, reply within the staleness bound).

Messages are plain point-to-point sends (`isend`/`recv`, and `recv_any` on the
servers), not `torch.distributed.rpc`. Sources: Li et al., OSDI 2014 (the
parameter server, bounded delay); Ho et al., NeurIPS 2013 (stale synchronous
parallel); Dean et al., NeurIPS 2012 (asynchronous SGD, Downpour).
"""

from __future__ import annotations

import torch

from syncedu.ps.config import MODES, PSConfig, shard_ranges
from syncedu.ps.server import Applied, ServerLog, serve
from syncedu.ps.worker import WorkerLog, run_worker

__all__ = ["ps_rank", "PSConfig", "MODES", "shard_ranges", "WorkerLog", "ServerLog",
           "Applied", "run_worker", "serve"]


def ps_rank(comm, cfg: PSConfig, params: torch.Tensor, grad_fn=None,
            worker_step=None) -> WorkerLog | ServerLog:
    """Run rank `comm.rank` of a parameter-server job; returns its log.

    `params`: the flat initial parameters (identical on every rank);
    `grad_fn(step, params) -> (loss, flat gradient)`: the workers' computation
    (servers ignore it).
    """
    if comm.world_size != cfg.world_size:  # Step 1
        raise ValueError(f"the run has {comm.world_size} ranks; workers={cfg.workers} + "
                         f"servers={cfg.servers} need {cfg.world_size}")
    if params.dim() != 1:
        raise ValueError("params must be the flat parameter vector (1-D)")
    if comm.rank < cfg.workers:  # Step 2
        if grad_fn is None:
            raise ValueError("workers need grad_fn(step, params) -> (loss, flat gradient)")
        return run_worker(comm, cfg, params.clone(), grad_fn, worker_step)
    lo, hi = shard_ranges(params.numel(), cfg.servers)[comm.rank - cfg.workers]  # Step 3
    return serve(comm, cfg, params[lo:hi].clone(), lo, hi)
