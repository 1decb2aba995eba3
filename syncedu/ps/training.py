"""`ps.run`: train the lessons' MLP on digits through a parameter server.

    from syncedu import ps, train
    ref = train.run("single", 1, steps=20, global_batch=64)
    sync = ps.run("sync", 4, servers=2, steps=20, global_batch=64, simulate=True)
    sync.max_param_diff(ref)                 # ~1e-7: the same SGD
    ssp = ps.run("ssp", 8, staleness=4, steps=20, global_batch=64, simulate=True,
                 network=ps.stragglers(8, 1, slow={7: 3.0}))
    ssp.idle_fraction, max(ssp.staleness)   # idle per worker, <= 4

Steps:

1. validate the job (`PSConfig`; `global_batch` must split over the workers);
2. on every rank: the seeded model of `train.run` (`models.make`), flattened;
   worker w's c-th gradient is the mean cross-entropy gradient of its part
   (`sampling.shard`) of global batch c (`sampling.global_batches`), so the
   data are exactly `train.run`'s;
3. run `strategies.ps.ps_rank` on `workers + servers` ranks where `runner`
   puts them: simulated (`simulate=True`, logical time, deterministic) or real
   (fresh processes, or a warm `pool`), after a barrier that the ledger does
   not keep;
4. gather a `PSHistory`: the servers' shards joined into named parameters,
   pushed and applied counts, staleness and delay per applied gradient (the
   largest over the servers), idle fraction per worker, loss and accuracy of
   the final parameters on the whole data set.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from syncedu.comm.ledger import Ledger
from syncedu.comm.network import Network
from syncedu.ps.protocol import PSConfig, ps_rank
from syncedu.ps.server import Applied
from syncedu.ps.worker import compute_factor
from syncedu.train import data, models, runner, sampling

__all__ = ["run", "PSHistory", "stragglers", "allreduce_baseline", "numel"]


@dataclass
class PSHistory:
    """What `ps.run` returns (times are logical seconds with `simulate=True`)."""

    config: PSConfig
    loss: list[float]  # per step c: mean of the workers' minibatch losses at their step c
    params: dict[str, torch.Tensor]
    ledger: Ledger
    seconds: float
    pushed: int
    applied: int
    staleness: list[int]  # per applied gradient, in server 0's order
    delay: list[int]  # updates applied between a worker's read and its gradient's update
    idle_fraction: list[float]  # per worker
    worker_seconds: list[float]
    events: list[Applied] = field(repr=False)  # server 0's applied gradients, in order
    final_loss: float = float("nan")  # the final parameters on the whole data set
    accuracy: float = float("nan")
    trace: object = field(default=None, repr=False)  # the run's `comm.trace.Trace` (every message)

    def max_param_diff(self, other) -> float:
        """Largest absolute difference to another run (a history, e.g. `train.run`'s, or
        its `params` dict)."""
        return runner.max_param_diff(self, other)

    def staleness_histogram(self) -> dict[int, int]:
        return dict(sorted(collections.Counter(self.staleness).items()))

    def loss_vs_time(self, window: int | None = None) -> tuple[list[float], list[float]]:
        """(times, running mean of the last `window` applied losses; default W)."""
        window = window or self.config.workers
        times, means, recent = [], [], collections.deque(maxlen=window)
        for e in self.events:
            recent.append(e.loss)
            times.append(e.time)
            means.append(sum(recent) / len(recent))
        return times, means

    @property
    def mean_idle(self) -> float:
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


def _grad_fn(cfg: PSConfig, x, y, global_batch: int, rank: int, model: str):
    """Step 2: worker `rank`'s gradient of its part of global batch c, at `params`."""
    net = models.make(model, seed=cfg.seed)
    batches = list(sampling.global_batches(len(x), max(cfg.steps), global_batch, seed=cfg.seed))

    def grad(c: int, params: torch.Tensor):
        vector_to_parameters(params, net.parameters())
        net.zero_grad(set_to_none=True)
        idx = sampling.shard(batches[c], rank, cfg.workers)
        loss = F.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        return loss.item(), parameters_to_vector(p.grad for p in net.parameters())

    return grad


def rank_main(comm, cfg: PSConfig, x, y, global_batch: int, model: str = "mlp",
              worker_step=None):
    """One rank of `run` (Step 3): a barrier, then `ps_rank` with the lessons' model."""
    comm.barrier()
    comm.ledger.reset()  # the barrier is harness traffic, not parameter-server traffic
    t0 = comm.now()
    params = parameters_to_vector(models.make(model, seed=cfg.seed).parameters()).detach()
    fn = _grad_fn(cfg, x, y, global_batch, comm.rank, model) if comm.rank < cfg.workers else None
    log = ps_rank(comm, cfg, params, fn, worker_step=worker_step)
    log.start, log.end = log.start - t0, log.end - t0
    for e in getattr(log, "events", ()):
        e.time -= t0
    return log


def run(mode: str, workers: int, *, servers: int = 1, staleness: int = 0, steps,
        global_batch: int, lr: float = 0.1, seed: int = 0, network: Network | None = None,
        simulate: bool = False, compute_seconds: float = 0.01, variability: float = 0.0,
        pool=None, timeout: float = 300.0, model: str = "mlp",
        worker_step=None) -> PSHistory:
    """Train through a parameter server; see the module docstring.

    `steps`: per worker (an int, or one count per worker in "async"/"ssp");
    `compute_seconds`/`variability`: modeled compute per gradient (see
    `PSConfig`); `pool`: a warm `launch.Pool(workers + servers)` for real runs;
    `worker_step`: replaces the workers' push/pull (`ps.worker.push_pull`, same
    signature; Exercise 04.1 plugs the learner's in).
    """
    cfg = PSConfig(mode=mode, workers=workers, servers=servers, staleness=staleness,  # Step 1
                   steps=steps, lr=lr, compute_seconds=compute_seconds,
                   variability=variability, seed=seed)
    if not isinstance(global_batch, int) or global_batch < 1 or global_batch % workers:
        raise ValueError(f"global_batch={global_batch!r} must be a positive multiple of "
                         f"workers={workers}")
    x, y = data.digits().tensors
    sampling.steps_per_epoch(len(x), global_batch)  # ValueError if larger than the data
    args = (cfg, x, y, global_batch, model, worker_step)
    res = runner.run(rank_main, cfg.world_size, args, pool=pool, network=network,  # Step 3
                     simulate=simulate, timeout=timeout,
                     job=f"workers={workers} + servers={servers}")
    hist = _history(cfg, list(res), res.ledger, x, y, model)
    hist.trace = res.trace
    return hist


def _history(cfg: PSConfig, logs: list, ledger: Ledger, x, y, model: str) -> PSHistory:
    """Step 4: join the shards, count, merge staleness over servers, evaluate."""
    wlogs, slogs = logs[:cfg.workers], logs[cfg.workers:]
    net = models.make(model, seed=cfg.seed)
    vector_to_parameters(torch.cat([s.shard for s in slogs]), net.parameters())
    worst = collections.defaultdict(lambda: (0, 0))
    for s in slogs:
        for e in s.events:
            old = worst[e.worker, e.step]
            worst[e.worker, e.step] = (max(old[0], e.staleness), max(old[1], e.delay))
    order = [(e.worker, e.step) for e in slogs[0].events]
    losses = [[log.losses[c] for log in wlogs if c < len(log.losses)]
              for c in range(max(cfg.steps))]
    with torch.no_grad():
        out = net(x)
        final_loss, acc = F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean()
    return PSHistory(
        config=cfg, loss=[sum(v) / len(v) for v in losses],
        params={k: v.detach().clone() for k, v in net.named_parameters()}, ledger=ledger,
        seconds=max(log.end for log in logs), pushed=sum(log.pushed for log in wlogs),
        applied=min(s.applied for s in slogs), staleness=[worst[k][0] for k in order],
        delay=[worst[k][1] for k in order], idle_fraction=[w.idle_fraction for w in wlogs],
        worker_seconds=[w.seconds for w in wlogs], events=slogs[0].events,
        final_loss=final_loss, accuracy=acc.item())


def numel(model: str = "mlp", seed: int = 0) -> int:
    """Number of parameters of the lessons' model (what every push and pull carries)."""
    return sum(p.numel() for p in models.make(model, seed=seed).parameters())


def _allreduce_rank(comm, steps: int, n: int, compute_seconds: float, variability: float,
                    seed: int):
    import random

    comm.barrier()
    comm.ledger.reset()
    rng = random.Random(seed * 1_000_003 + 7_919 * comm.rank)  # the PS workers' stream
    grad, busy, t0 = torch.zeros(n, device=comm.device), 0.0, comm.now()
    for _ in range(steps):
        t = comm.now()
        comm.compute(compute_seconds * compute_factor(rng, variability))
        busy += comm.now() - t
        comm.all_reduce(grad)
    total = comm.now() - t0
    return total, 1.0 - busy / total if total > 0 else 0.0


def allreduce_baseline(workers: int, *, steps: int, network: Network | None = None,
                       compute_seconds: float = 0.01, variability: float = 0.0, seed: int = 0,
                       model: str = "mlp"):
    """The same compute on `workers` simulated ranks, synchronized by a ring all_reduce.

    Returns (logical seconds, mean idle share, ledger): what data parallelism with
    AllReduce would cost on this network, for comparison with a parameter server.
    `network.slowdown`, if given, needs one factor per worker here (no servers).
    """
    from syncedu.comm import sim

    res = sim.run(_allreduce_rank, workers, network=network,
                  args=(steps, numel(model, seed), compute_seconds, variability, seed))
    return max(r[0] for r in res), sum(r[1] for r in res) / workers, res.ledger
