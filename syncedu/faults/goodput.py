"""Goodput at scale: checkpoint-restart against live per-step recovery.

A job on N GPUs with per-GPU MTBF m fails every M = m / N. Two ways to survive:

1. checkpoint-restart (torchrun `--max-restarts`, lesson 08's elastic run):
   a checkpoint every tau seconds (cost C); on a failure, restart everything
   (cost R) and redo tau / 2 on average. To first order (Young, "A first order
   approximation to the optimum checkpoint interval", CACM 17(9), 1974) the
   share of time lost is C / tau + (R + tau / 2) / M, smallest at
   tau* = sqrt(2 C M); Daly ("A higher order estimate of the optimum checkpoint
   interval for restart dumps", FGCS 22(3), 2006) refines it;
2. live per-step recovery (torchft; ft.py): a failure costs the heartbeat
   timeout, one discarded step and the copy from a peer, while the other G - 1
   replica groups train on, so the failed group's restart R costs R / G.

   Live recovery still checkpoints, rarely (every `live_checkpoint` s: a restart of
   everything must stay possible), and pays C for each;
3. `simulated_restart_lost_share`, the witness of step 1: exponential failures of
   mean M on a timeline, also during checkpoints and restarts.

Goodput = useful steps per hour = (1 - lost share) * 3600 / step. Scale:
Llama 3 405B (Dubey et al., "The Llama 3 Herd of Models", arXiv 2407.21783, 2024,
section 3.3.4 and Table 5): 466 job interruptions in 54 days on 16,384 GPUs, 47
planned and 419 unexpected, and "higher than 90% effective training time".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

LLAMA3 = {"interruptions": 419, "days": 54, "gpus": 16_384}  # unexpected interruptions


def llama3_gpu_mtbf_hours() -> float:
    """Per-GPU MTBF implied by Llama 3's figures: job MTBF times the number of GPUs."""
    return LLAMA3["days"] * 24 / LLAMA3["interruptions"] * LLAMA3["gpus"]


def _positive(**values) -> None:
    for name, v in values.items():
        if not v > 0:
            raise ValueError(f"{name}={v!r} must be > 0")


def young_interval(checkpoint: float, mtbf: float) -> float:
    """Young 1974: tau* = sqrt(2 C M) (same unit as C and M)."""
    _positive(checkpoint=checkpoint, mtbf=mtbf)
    return math.sqrt(2 * checkpoint * mtbf)


def daly_interval(checkpoint: float, mtbf: float) -> float:
    """Daly 2006, eq. (37): sqrt(2CM)(1 + sqrt(C/2M)/3 + C/(18M)) - C for C < 2M, else M."""
    _positive(checkpoint=checkpoint, mtbf=mtbf)
    if checkpoint >= 2 * mtbf:
        return mtbf
    r = checkpoint / (2 * mtbf)
    return math.sqrt(2 * checkpoint * mtbf) * (1 + math.sqrt(r) / 3 + r / 9) - checkpoint


@dataclass(frozen=True)
class Job:
    """A training job; times in seconds, `gpu_mtbf` in seconds too."""

    gpus: int
    gpu_mtbf: float = llama3_gpu_mtbf_hours() * 3600
    step: float = 10.0  # seconds per training step
    checkpoint: float = 60.0  # C: seconds to write one checkpoint
    restart: float = 600.0  # R: seconds from a failure until the job trains again
    detect: float = 2.0  # live: heartbeat timeout before the quorum drops a replica
    recover: float = 5.0  # live: seconds to copy the state from a healthy peer
    groups: int = 8  # live: replica groups the job is split into
    live_checkpoint: float = 3600.0  # live: seconds between its (rare) checkpoints

    def __post_init__(self):
        _positive(gpus=self.gpus, gpu_mtbf=self.gpu_mtbf, step=self.step,
                  checkpoint=self.checkpoint, groups=self.groups,
                  live_checkpoint=self.live_checkpoint)
        for name in ("restart", "detect", "recover"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0 seconds")
        if self.groups > self.gpus:
            raise ValueError(f"groups={self.groups} must be <= gpus={self.gpus}")

    @property
    def mtbf(self) -> float:
        """M = m / N: failures of independent GPUs add up."""
        return self.gpu_mtbf / self.gpus

    def with_gpus(self, gpus: int) -> Job:
        """The same job on `gpus` GPUs (replica groups capped at the GPU count)."""
        return replace(self, gpus=gpus, groups=min(self.groups, gpus))


def restart_lost_share(job: Job, interval: float | None = None) -> float:
    """Step 1: C / tau + (R + tau / 2) / M, at tau = `interval` (default Young's), capped at 1."""
    tau = young_interval(job.checkpoint, job.mtbf) if interval is None else interval
    _positive(interval=tau)
    return min(1.0, job.checkpoint / tau + (job.restart + tau / 2) / job.mtbf)


def live_lost_share(job: Job) -> float:
    """Step 2: C / live_checkpoint + (detect + one step + recover + R / G) / M, capped at 1."""
    per_failure = job.detect + job.step + job.recover + job.restart / job.groups
    return min(1.0, job.checkpoint / job.live_checkpoint + per_failure / job.mtbf)


def simulated_restart_lost_share(job: Job, interval: float | None = None, *,
                                 failures: int = 20_000, seed: int = 0) -> float:
    """Step 3: checkpoint-restart on a timeline of `failures` exponential failures (mean M).

    Training runs in intervals of tau + C (the checkpoint); a failure loses everything since
    the last finished checkpoint, then the restart takes R, and a failure during it starts it
    again. The lost share is 1 - (kept training time) / (wall time).
    """
    tau = young_interval(job.checkpoint, job.mtbf) if interval is None else interval
    rng, clock, kept = random.Random(seed), 0.0, 0.0
    for _ in range(failures):
        up = rng.expovariate(1 / job.mtbf)  # training (and checkpointing) until the next failure
        kept += (up // (tau + job.checkpoint)) * tau  # the intervals whose checkpoint finished
        clock += up
        while (down := rng.expovariate(1 / job.mtbf)) < job.restart:
            clock += down  # failed again while restarting: the restart begins anew
        clock += job.restart
    return 1 - kept / clock


def goodput(job: Job, how: str = "restart") -> float:
    """Useful steps per hour under "restart" (checkpoint-restart) or "live" recovery."""
    if how not in ("restart", "live"):
        raise ValueError(f"how={how!r} must be 'restart' or 'live'")
    lost = restart_lost_share(job) if how == "restart" else live_lost_share(job)
    return (1.0 - lost) * 3600.0 / job.step
