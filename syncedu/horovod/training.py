"""`train.run("horovod", ...)`: the same seeded job, synchronized by Horovod's DistributedOptimizer.

Same data, model and loop (`train_rank.Session`) as every other strategy. The classic
recipe (Sergeev & Del Balso 2018, arXiv 1802.05799; Horovod's
`examples/pytorch/pytorch_mnist.py`), as one rank runs it here:

1. `hvd.init()` in a rank started by `horovod.run`, Horovod's variables set before it;
2. `hvd.broadcast_parameters` / `broadcast_optimizer_state` from rank 0 (our models
   are seeded, so this changes nothing here, as DDP's broadcast does not);
3. `hvd.DistributedOptimizer(..., backward_passes_per_step=accumulation,
   op=hvd.Average)`: a hook per parameter starts an asynchronous allreduce once its
   gradient was accumulated that many times; `step()` waits for them all, then steps;
4. the ledger charges each step as one ring allreduce of all gradient bytes (after
   compression), as Horovod fuses them; what it really fused is in its timeline.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import torch

from syncedu.comm.ledger import RankLedger
from syncedu.dp.ddp_hook import charge_ring_allreduce
from syncedu.horovod import launch as horovod_launch
from syncedu.train import train_rank
from syncedu.train.harness import History
from syncedu.train.strategies import Parts, make_optimizer, register, register_launcher

__all__ = ["HorovodSettings", "HorovodComm", "run_ranks", "run_jobs"]


@dataclass(frozen=True)
class HorovodSettings:
    """Horovod's knobs for a run; None keeps Horovod's default.

    `fusion_threshold_mb`: the fusion buffer (default 128 MB; 0: no fusion);
    `cycle_time_ms`: how often the background thread looks for ready tensors (default
    1 ms); `stall_check_s` / `stall_shutdown_s`: the stall inspector's; `timeline`: a
    file for rank 0's timeline of the training steps (rank r > 0: `<timeline>.rank<r>`).
    """

    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    stall_check_s: int | None = None
    stall_shutdown_s: int | None = None
    timeline: str | None = None

    def __post_init__(self):
        for name in ("fusion_threshold_mb", "cycle_time_ms", "stall_check_s", "stall_shutdown_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"{name}={v!r} must be None or a number >= 0")

    def env(self) -> dict[str, str]:
        """The environment variables Horovod reads at `hvd.init()`."""
        mb = self.fusion_threshold_mb
        env = {"HOROVOD_FUSION_THRESHOLD": None if mb is None else int(mb * 2**20),
               "HOROVOD_CYCLE_TIME": self.cycle_time_ms,
               "HOROVOD_STALL_CHECK_TIME_SECONDS": self.stall_check_s,
               "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": self.stall_shutdown_s}
        return {k: str(v) for k, v in env.items() if v is not None}


class HorovodComm:
    """The little of a `Comm` that `train_rank.Session` uses, on Horovod's process set."""

    backend, network = "horovod", None
    device = torch.device("cpu")  # this Horovod is built for CPU (Gloo) only

    def __init__(self, hvd):
        self.hvd = hvd
        self.rank, self.world_size = hvd.rank(), hvd.size()
        # where this rank sits, as every Comm says it (DESIGN: local_rank, local_world_size, node)
        self.local_rank, self.local_world_size, self.node = hvd.local_rank(), hvd.local_size(), 0
        self.ledger = RankLedger(self.rank)
        self._t0 = time.perf_counter()

    def barrier(self) -> None:
        """Horovod's own barrier over every rank."""
        self.hvd.barrier()

    def now(self) -> float:
        """Seconds since this comm was made (wall clock)."""
        return time.perf_counter() - self._t0

    def compute(self, seconds: float) -> None:
        """Modeled compute on real ranks: sleep `seconds` (frees the CPU as a GPU would)."""
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
        # bytes per element on the wire: `_allreduce_grad_async` compresses the same way
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


@register("horovod", real_only=True, compressible=True)
def _horovod(module, comm, cfg) -> Parts:
    """The factory `train_strategies.build` calls inside a Horovod rank (Steps 2-4)."""
    import horovod.torch as hvd

    if cfg.compressor is not None and cfg.compressor.name != "fp16":  # resolved by TrainConfig
        raise ValueError(f"compression={cfg.compression!r}: Horovod's built-ins here are "
                         "None (Compression.none) and 'fp16' (Compression.fp16)")
    opt = make_optimizer(module.parameters(), cfg)
    hvd.broadcast_parameters(module.state_dict(), root_rank=0)  # Step 2
    if cfg.optimizer == "sgd":  # it makes state by a zero-gradient step: moves Adam's count
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    dist = hvd.DistributedOptimizer(  # Step 3
        opt, named_parameters=module.named_parameters(),
        compression=hvd.Compression.none if cfg.compressor is None else hvd.Compression.fp16,
        backward_passes_per_step=cfg.accumulation, op=hvd.Average)
    counter = _FusedLedger(comm, dist)
    plain_zero_grad = dist.zero_grad
    # Horovod's zero_grad() takes no set_to_none; torch's default (None grads) is what we want.
    dist.zero_grad = lambda set_to_none=True: plain_zero_grad()
    return Parts(module, dist, counter.events)


def _rank(jobs) -> list:
    """One Horovod rank (Step 1): each job in turn, under one `hvd.init()` (see `run_jobs`)."""
    import horovod.torch as hvd

    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # lets a job start/stop a timeline
    hvd.init()
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.size()))
        out = []
        for cfg, settings in jobs:
            if callable(cfg):
                out.append(cfg())  # its own hvd.init() is a no-op
                continue
            session = train_rank.Session(HorovodComm(hvd), cfg)
            if settings.timeline:  # a file per rank; rank 0's is the one to read
                r = hvd.rank()
                hvd.start_timeline(settings.timeline + (f".rank{r}" if r else ""))
            session.run(0, cfg.steps)
            if settings.timeline:
                hvd.stop_timeline()
            out.append(session.result())
        _all_done(hvd)
        return out
    finally:
        hvd.shutdown()


def _all_done(hvd, timeout: float = 30.0) -> None:
    """Wait until every rank has finished its jobs, or `timeout` seconds, before shutdown.

    One rank's `hvd.shutdown()` aborts the collectives pending on the others: a rank that
    reached `lines.mismatched_names` later (under load) would report "aborted", not "still
    waiting". This allreduce is negotiated apart from the pending tensor, and polled: a job
    that broke Horovod cannot hang (nor fail) here, the jobs' results are in.
    """
    deadline = time.monotonic() + timeout
    try:
        handle = hvd.allreduce_async(torch.zeros(1), name="syncedu.jobs_done")
        while not hvd.poll(handle):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        hvd.synchronize(handle)
    except Exception:  # another rank already shut Horovod down: nothing left to wait for
        return


def _check(cfg, settings) -> None:
    if not callable(cfg) and cfg.strategy != "horovod":
        raise ValueError(f"strategy={cfg.strategy!r}: only strategy='horovod' runs here")
    if not callable(cfg) and cfg.mistake is not None:
        raise ValueError(f"mistake={cfg.mistake!r}: Horovod accumulates with "
                         "backward_passes_per_step; the no_sync mistakes do not apply")
    if not isinstance(settings, HorovodSettings):
        raise ValueError(f"settings={settings!r} must be a HorovodSettings")


def run_ranks(cfg, *, pool=None, network=None, timeout: float = 600.0) -> list[dict]:
    """`train.run("horovod", ...)`'s launcher: `cfg` on `cfg.world_size` Horovod ranks."""
    if pool is not None or network is not None:
        raise ValueError("strategy='horovod' starts its own ranks with horovod.run: pass no "
                         "pool and no network")
    _check(cfg, HorovodSettings())
    res = horovod_launch.run(_rank, cfg.world_size, args=([(cfg, HorovodSettings())],),
                             timeout=timeout)
    return [per_rank[0] for per_rank in res]


def run_jobs(jobs, *, timeout: float = 600.0, log: list | None = None) -> list:
    """Several jobs on 2+ Horovod ranks; for each, a History (or a callable's rank results).

    A job is `(TrainConfig or fn, HorovodSettings or None)`, `fn` taking no arguments.
    Consecutive jobs with the same environment share one start (seconds); Horovod reads
    its knobs only at `hvd.init()`, and a second `hvd.init()` can read stale Gloo addresses
    from the rendezvous store, so a new environment means new ranks. One world size (2 for
    callables only); `log` gets each start's output, kept out of the caller's.
    """
    jobs = [(cfg, s or HorovodSettings()) for cfg, s in jobs]
    sizes = {cfg.world_size for cfg, _ in jobs if not callable(cfg)} or {2}
    world_size = min(sizes)
    if not jobs or len(sizes) != 1:
        raise ValueError("jobs must be a non-empty list of (TrainConfig or function, "
                         "HorovodSettings) with one world_size")
    for cfg, s in jobs:
        _check(cfg, s)
    out = []
    for env, group in itertools.groupby(jobs, key=lambda job: job[1].env()):
        group = list(group)
        res = horovod_launch.run(_rank, world_size, args=(group,), env=env,
                                 timeout=timeout, quiet=True, output=log)
        out += [[per_rank[i] for per_rank in res] if callable(cfg)
                else History.from_ranks(cfg, [per_rank[i] for per_rank in res])
                for i, (cfg, _) in enumerate(group)]
    return out


register_launcher("horovod", run_ranks)
