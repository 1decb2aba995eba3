"""`ps.run`: train the lessons' MLP on digits through a parameter server; `ps_rank`.

1. validate the job (`PSConfig`; `global_batch` must split over the workers);
2. on every rank: `train.run`'s seeded model, flattened; worker w's c-th gradient is that of its
   `sampling.shard` of global batch c: `train.run`'s data;
3. `ps_rank` on `workers + servers` ranks where `runner` puts them, after a barrier the ledger
   does not keep;
4. gather a `PSHistory`: the servers' shards joined, counts, staleness per applied gradient (the
   largest over the servers), idle per worker, and the final parameters' loss and accuracy on
   the whole data set.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from syncedu.comm.network import Network
from syncedu.ps.config import PSConfig, shard_ranges
from syncedu.ps.server import Applied, ServerLog, serve
from syncedu.ps.worker import WorkerLog, run_worker
from syncedu.train import data, models, runner, sampling
from syncedu.train.harness import Result


@dataclass
class PSHistory(Result):
    """What `ps.run` returns (times are logical seconds with `simulate=True`); `loss`: per
    step c, the mean of the workers' minibatch losses at their step c; `trace`: every message."""

    config: PSConfig
    pushed: int
    applied: int
    staleness: list[int]  # per applied gradient, in server 0's order: SSP's clock gap (steps)
    idle_fraction: list[float]  # per worker
    events: list[Applied] = field(repr=False)  # server 0's applied gradients, in order
    final_loss: float = float("nan")  # the final parameters on the whole data set
    accuracy: float = float("nan")
    delay: list[int] = field(default_factory=list)  # per applied gradient: updates it missed

    def staleness_histogram(self) -> dict[int, int]:
        """{staleness: how many applied gradients had it}, in increasing staleness."""
        return dict(sorted(collections.Counter(self.staleness).items()))

    def loss_vs_time(self) -> tuple[list[float], list[float]]:
        """(times, running mean of the last W applied losses)."""
        window, losses = self.config.workers, [e.loss for e in self.events]
        means = [sum(losses[max(0, i + 1 - window):i + 1]) / min(i + 1, window)
                 for i in range(len(losses))]
        return [e.time for e in self.events], means

    @property
    def mean_idle(self) -> float:
        """The workers' mean share of time spent waiting."""
        return sum(self.idle_fraction) / len(self.idle_fraction)


def stragglers(workers: int, servers: int = 1, slow: dict | None = None,
               preset: str = "ethernet_10g", **changes) -> Network:
    """A `Network` preset whose worker w computes `slow[w]` times slower (servers: 1)."""
    factors = [1.0] * (workers + servers)
    for w, f in (slow or {}).items():
        if not 0 <= w < workers:
            raise ValueError(f"slow={slow}: worker {w} is not in 0..{workers - 1}")
        factors[w] = float(f)
    return Network.preset(preset, slowdown=factors, **changes)


def _grad_fn(cfg: PSConfig, x, y, global_batch: int, rank: int):
    """Step 2: worker `rank`'s gradient of its part of global batch c, at `params`."""
    net = models.make("mlp", seed=cfg.seed)
    batches = list(sampling.global_batches(len(x), max(cfg.steps), global_batch, seed=cfg.seed))

    def grad(c: int, params: torch.Tensor):
        vector_to_parameters(params, net.parameters())
        net.zero_grad(set_to_none=True)
        idx = sampling.shard(batches[c], rank, cfg.workers)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        return loss.item(), parameters_to_vector(p.grad for p in net.parameters())

    return grad


def ps_rank(comm, cfg: PSConfig, params: torch.Tensor, grad_fn=None,
            worker_step=None) -> WorkerLog | ServerLog:
    """One rank of a parameter-server job (Step 3) on the flat initial `params`; its log.
    `grad_fn(step, params) -> (loss, flat gradient)`: the workers' computation."""
    if comm.world_size != cfg.world_size:
        raise ValueError(f"the run has {comm.world_size} ranks; workers={cfg.workers} + "
                         f"servers={cfg.servers} need {cfg.world_size}")
    if params.dim() != 1:
        raise ValueError("params must be the flat parameter vector (1-D)")
    if comm.rank < cfg.workers:
        if grad_fn is None:
            raise ValueError("workers need grad_fn(step, params) -> (loss, flat gradient)")
        return run_worker(comm, cfg, params.clone(), grad_fn, worker_step)
    lo, hi = shard_ranges(params.numel(), cfg.servers)[comm.rank - cfg.workers]
    return serve(comm, cfg, params[lo:hi].clone())


def rank_main(comm, cfg: PSConfig, x, y, global_batch: int, worker_step=None):
    """One rank of `run` (Step 3): a barrier, then `ps_rank` with the lessons' model."""
    comm.barrier()
    comm.ledger.reset()  # the barrier is harness traffic, not parameter-server traffic
    t0 = comm.now()
    params = parameters_to_vector(models.make("mlp", seed=cfg.seed).parameters()).detach()
    fn = _grad_fn(cfg, x, y, global_batch, comm.rank) if comm.rank < cfg.workers else None
    log = ps_rank(comm, cfg, params, fn, worker_step=worker_step)
    log.start, log.end = log.start - t0, log.end - t0
    for e in getattr(log, "events", ()):
        e.time -= t0
    return log


def run(mode: str, workers: int, *, servers: int = 1, staleness: int = 0, steps,
        global_batch: int, lr: float = 0.1, seed: int = 0, network: Network | None = None,
        simulate: bool = False, compute_seconds: float = 0.01, variability: float = 0.0,
        pool=None, timeout: float = 300.0, worker_step=None) -> PSHistory:
    """Train through a parameter server (the module docstring's steps); a `PSHistory`.

    Workers are ranks 0..workers-1, servers the last `servers` ranks; the data and model are
    `train.run`'s, so "sync" trains to `train.run("single", 1, ...)`'s parameters.

    Args:
        mode: "sync" (every worker's gradient of step c before step c + 1), "async" (no
            bound) or "ssp" (bounded staleness, Ho et al. 2013).
        workers: ranks that compute gradients.
        servers: ranks that hold a shard of the parameters each (default 1).
        staleness: the bound tau of "ssp", in steps (default 0).
        steps: gradients each worker pushes: an int, or one count per worker in
            "async"/"ssp".
        global_batch: samples per step over all workers (each uses global_batch // workers).
        lr: the servers' SGD learning rate (default 0.1).
        seed: seeds the model and the data order (default 0).
        network: a `Network` (its `slowdown` makes stragglers; default None).
        simulate: simulated ranks on a logical clock (default False: real processes).
        compute_seconds: modeled compute per gradient, in seconds (default 0.01).
        variability: share of each step's compute drawn at random (default 0.0; `PSConfig`).
        pool: a warm `launch.Pool(workers + servers)` (default None).
        timeout: seconds the run may take on real ranks (default 300.0).
        worker_step: replaces `ps.worker.push_pull` (Exercise 04.1 plugs the learner's in).
    """
    cfg = PSConfig(mode=mode, workers=workers, servers=servers, staleness=staleness,  # Step 1
                   steps=steps, lr=lr, compute_seconds=compute_seconds,
                   variability=variability, seed=seed)
    if not isinstance(global_batch, int) or global_batch < 1 or global_batch % workers:
        raise ValueError(f"global_batch={global_batch!r} must be a positive multiple of "
                         f"workers={workers}")
    x, y = data.digits_tensors()  # train.run's data set
    sampling.steps_per_epoch(len(x), global_batch)  # ValueError if larger than the data
    args = (cfg, x, y, global_batch, worker_step)
    res = runner.run(rank_main, cfg.world_size, args, pool=pool, network=network,  # Step 3
                     simulate=simulate, timeout=timeout,
                     job=f"workers={workers} + servers={servers}")
    return _history(cfg, res, x, y)


def _history(cfg: PSConfig, res, x, y) -> PSHistory:
    """Step 4: join the shards, count, merge staleness over servers, evaluate."""
    logs = list(res)
    wlogs, slogs = logs[:cfg.workers], logs[cfg.workers:]
    net = models.make("mlp", seed=cfg.seed)
    vector_to_parameters(torch.cat([s.shard for s in slogs]), net.parameters())
    worst, late = collections.Counter(), collections.Counter()
    for e in (e for s in slogs for e in s.events):
        worst[e.worker, e.step] = max(worst[e.worker, e.step], e.staleness)
        late[e.worker, e.step] = max(late[e.worker, e.step], e.delay)
    order = [(e.worker, e.step) for e in slogs[0].events]
    losses = [[log.losses[c] for log in wlogs if c < len(log.losses)]
              for c in range(max(cfg.steps))]
    with torch.no_grad():
        out = net(x)
        final_loss, acc = F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean()
    return PSHistory(
        config=cfg, loss=[sum(v) / len(v) for v in losses],
        params={k: v.detach().clone() for k, v in net.named_parameters()}, ledger=res.ledger,
        seconds=max(log.end for log in logs), pushed=sum(len(w.losses) for w in wlogs),
        applied=min(len(s.events) for s in slogs), staleness=[worst[k] for k in order],
        idle_fraction=[w.idle_fraction for w in wlogs], events=slogs[0].events,
        final_loss=final_loss, accuracy=acc.item(), trace=res.trace, delay=[late[k] for k in order])


def numel() -> int:
    """Number of parameters of the lessons' model (what every push and pull carries)."""
    return sum(p.numel() for p in models.make("mlp").parameters())
