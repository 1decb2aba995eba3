"""`train.run("horovod", ...)`: the same seeded job, synchronized by Horovod's DistributedOptimizer.

Same data (`sampling.global_batches`, each rank its shard), same model and the
same loop (`train_rank.Session`) as every other strategy; only the gradient
synchronization differs. The classic Horovod recipe (Sergeev & Del Balso 2018,
arXiv 1802.05799; Horovod's `examples/pytorch/pytorch_mnist.py`), as one rank
runs it here:

1. `hvd.init()` in a rank started by `horovod.run` (`horovod_launch.run`), with
   `HOROVOD_FUSION_THRESHOLD` / `HOROVOD_CYCLE_TIME` / `HOROVOD_TIMELINE` set
   before it; `cores // size` torch threads per rank;
2. `hvd.broadcast_parameters(model.state_dict(), root_rank=0)` and
   `hvd.broadcast_optimizer_state(opt, root_rank=0)`: every rank starts from
   rank 0's state (our models are seeded, so this changes nothing here, as DDP's
   construction-time broadcast does not);
3. `hvd.DistributedOptimizer(opt, named_parameters=..., compression=...,
   backward_passes_per_step=accumulation, op=hvd.Average)`: a hook per parameter
   starts an asynchronous allreduce once its gradient was accumulated
   `backward_passes_per_step` times; `step()` waits for them all, then steps;
4. the ledger: Horovod's background thread fuses the ready gradients into one
   buffer (up to the fusion threshold) and allreduces it, so each step is
   charged as one fused allreduce of all gradient bytes (after compression),
   counted as a ring sends it, like DDP's buckets (`ddp_hook`). How many fused
   collectives the cycle really made is in the Horovod timeline
   (`horovod_timeline`).

`broadcast_optimizer_state` on a fresh optimizer runs one zero-gradient step to
create its state: harmless for SGD, but it advances Adam's step count (its bias
correction), so with `optimizer="adam"` it is skipped (nothing to broadcast yet).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from syncedu.comm.ledger import RankLedger
from syncedu.dp.ddp_hook import charge_ring_allreduce
from syncedu.horovod import launch as horovod_launch
from syncedu.train import train_rank
from syncedu.train.harness import _history
from syncedu.train.strategies import Parts, make_optimizer, register, register_launcher

__all__ = ["HorovodSettings", "HorovodComm", "run_ranks", "run_jobs"]


@dataclass(frozen=True)
class HorovodSettings:
    """Horovod's knobs for a run; None keeps Horovod's default.

    `fusion_threshold_mb`: size of the fusion buffer (default 128 MB; 0 turns
    fusion off). `cycle_time_ms`: how often the background thread looks for
    ready tensors (default 1 ms). `stall_check_s` / `stall_shutdown_s`: the stall
    inspector's `HOROVOD_STALL_CHECK_TIME_SECONDS` / `..._SHUTDOWN_TIME_SECONDS`
    (they change nothing while the ranks' tensor names match). `timeline`: a file
    for Horovod's timeline of the training steps (rank 0's; rank r > 0 writes
    `<timeline>.rank<r>`).
    """

    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    stall_check_s: int | None = None
    stall_shutdown_s: int | None = None
    timeline: str | None = None

    _ENV = {"cycle_time_ms": "HOROVOD_CYCLE_TIME", "stall_check_s":
            "HOROVOD_STALL_CHECK_TIME_SECONDS", "stall_shutdown_s":
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"}

    def __post_init__(self):
        for name in ("fusion_threshold_mb", "cycle_time_ms", "stall_check_s", "stall_shutdown_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"{name}={v!r} must be None or a number >= 0")

    def env(self) -> dict[str, str]:
        """The environment variables Horovod reads at `hvd.init()`."""
        env = {var: str(getattr(self, name)) for name, var in self._ENV.items()
               if getattr(self, name) is not None}
        if self.fusion_threshold_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(self.fusion_threshold_mb * 2**20))
        return env


class HorovodComm:
    """The little of a `Comm` that `train_rank.Session` uses, on Horovod's process set."""

    backend, network = "horovod", None
    device = torch.device("cpu")  # this Horovod is built for CPU (Gloo) only

    def __init__(self, hvd):
        self.hvd = hvd
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.local_rank, self.local_world_size, self.node = hvd.local_rank(), hvd.local_size(), 0
        self.ledger = RankLedger(self.rank)
        self._t0 = time.perf_counter()

    def barrier(self) -> None:
        self.hvd.barrier()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def compute(self, seconds: float) -> None:
        time.sleep(seconds)


class _FusedLedger:
    """Step 4: charge each step's gradients as one fused ring allreduce; time it."""

    def __init__(self, comm, opt):
        self.comm, self.events = comm, []
        self.compression = opt._compression  # the optimizer's own `compression=` object
        self.elements: dict[int, int] = {}  # bytes per element on the wire -> elements
        self.start = None
        self._submit, self._wait = opt._allreduce_grad_async, opt.synchronize
        # Instance attributes win over the class's methods: Horovod's hooks and
        # step() call these through `self`, so every gradient passes here.
        opt._allreduce_grad_async, opt.synchronize = self.submit, self.synchronize

    def submit(self, p):
        if self.start is None:
            self.start = time.perf_counter()
        # Bytes per element on the wire: what Horovod's compressor makes of this gradient
        # (`_allreduce_grad_async` calls the same `compress` before its allreduce).
        es = self.compression.compress(p.grad)[0].element_size() if p.grad is not None \
            else p.element_size()
        self.elements[es] = self.elements.get(es, 0) + p.numel()
        return self._submit(p)

    def synchronize(self):
        out = self._wait()
        for es, numel in sorted(self.elements.items()):
            charge_ring_allreduce(self.comm, numel, es)
        nbytes = sum(es * k for es, k in self.elements.items())
        self.events.append((self.start or time.perf_counter(), time.perf_counter(), nbytes))
        self.elements, self.start = {}, None
        return out


@register("horovod")
def _horovod(module, comm, cfg) -> Parts:
    """The factory `train_strategies.build` calls inside a Horovod rank (Steps 2-4)."""
    import horovod.torch as hvd

    if cfg.compression not in (None, "fp16"):
        raise ValueError(f"compression={cfg.compression!r}: Horovod's built-ins here are "
                         "None (Compression.none) and 'fp16' (Compression.fp16)")
    opt = make_optimizer(module.parameters(), cfg)
    hvd.broadcast_parameters(module.state_dict(), root_rank=0)  # Step 2
    if cfg.optimizer == "sgd":
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    fp16 = cfg.compression == "fp16"
    dist = hvd.DistributedOptimizer(  # Step 3
        opt, named_parameters=module.named_parameters(),
        compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none,
        backward_passes_per_step=cfg.accumulation, op=hvd.Average)
    counter = _FusedLedger(comm, dist)
    plain_zero_grad = dist.zero_grad
    # Horovod's zero_grad() takes no set_to_none; torch's default (None grads) is what we want.
    dist.zero_grad = lambda set_to_none=True: plain_zero_grad()
    return Parts(module, dist, counter.events)


def _rank(jobs) -> list:
    """One Horovod rank (Step 1): each job in turn, under one `hvd.init()` (see `run_jobs`).

    A `(cfg, settings)` job runs through the shared loop; a callable job is called
    (its own `hvd.init()` is then a no-op) and its return value kept.
    """
    import horovod.torch as hvd

    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # lets a job start/stop a timeline
    hvd.init()
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.size()))
        out = []
        for cfg, settings in jobs:
            if callable(cfg):
                out.append(cfg())
                continue
            session = train_rank.Session(HorovodComm(hvd), cfg)
            if settings.timeline:  # a file per rank; rank 0's is the one to read
                r = hvd.rank()
                hvd.start_timeline(settings.timeline + (f".rank{r}" if r else ""))
            session.run(0, cfg.steps)
            if settings.timeline:
                hvd.stop_timeline()
            out.append(session.result())
        return out
    finally:
        hvd.shutdown()


def _check(cfg, settings) -> None:
    if cfg.strategy != "horovod":
        raise ValueError(f"strategy={cfg.strategy!r}: only strategy='horovod' runs here")
    if cfg.mistake is not None:
        raise ValueError(f"mistake={cfg.mistake!r}: Horovod accumulates with "
                         "backward_passes_per_step; the no_sync mistakes do not apply")
    if not isinstance(settings, HorovodSettings):
        raise ValueError(f"settings={settings!r} must be a HorovodSettings")


def run_ranks(cfg, *, pool=None, network=None, timeout: float = 600.0) -> list[dict]:
    """Run `cfg` (strategy "horovod") on `cfg.world_size` Horovod ranks; each rank's result.

    What `train.run("horovod", ...)` calls. Horovod starts its own ranks
    (`horovod.run`), so a syncedu `pool` or an emulated `network` cannot be used.
    """
    if pool is not None or network is not None:
        raise ValueError("strategy='horovod' starts its own ranks with horovod.run: pass no "
                         "pool and no network")
    _check(cfg, HorovodSettings())
    res = horovod_launch.run(_rank, cfg.world_size, args=([(cfg, HorovodSettings())],),
                             timeout=timeout)
    return [per_rank[0] for per_rank in res]


def run_jobs(jobs, *, timeout: float = 600.0, log: list | None = None) -> list:
    """Several jobs on 2+ Horovod ranks; for each, a History (or a callable's rank results).

    A job is `(TrainConfig, HorovodSettings or None)`, or `(fn, HorovodSettings or
    None)` with `fn` a function of no arguments run in every rank (its result: one
    value per rank). Starting Horovod ranks costs seconds (Python, torch, Horovod,
    rendezvous), so consecutive jobs whose settings set the same environment share
    one start (a timeline is started and stopped in place). Horovod reads its knobs
    only at `hvd.init()`, and a second `hvd.init()` after `hvd.shutdown()` in the same
    ranks can read the first one's stale Gloo addresses from the rendezvous store, so
    a change of environment means new ranks. All jobs need one world size (2 for a
    callable-only list). `log`: a list that gets each start's output (the ranks'
    lines, Horovod's log among them); the ranks' output is kept out of the caller's.
    """
    jobs = [(cfg, s or HorovodSettings()) for cfg, s in jobs]
    sizes = {cfg.world_size for cfg, _ in jobs if not callable(cfg)} or {2}
    world_size = min(sizes)
    if not jobs or len(sizes) != 1:
        raise ValueError("jobs must be a non-empty list of (TrainConfig or function, "
                         "HorovodSettings) with one world_size")
    for cfg, s in jobs:
        if not callable(cfg):
            _check(cfg, s)
        elif not isinstance(s, HorovodSettings):
            raise ValueError(f"settings={s!r} must be a HorovodSettings")
    groups: list[list] = []
    for job in jobs:
        if groups and groups[-1][0][1].env() == job[1].env():
            groups[-1].append(job)
        else:
            groups.append([job])
    out = []
    for group in groups:
        res = horovod_launch.run(_rank, world_size, args=(group,), env=group[0][1].env(),
                                 timeout=timeout, quiet=True, output=log)
        out += [[per_rank[i] for per_rank in res] if callable(cfg)
                else _history(cfg, [per_rank[i] for per_rank in res])
                for i, (cfg, _) in enumerate(group)]
    return out


register_launcher("horovod", run_ranks)
