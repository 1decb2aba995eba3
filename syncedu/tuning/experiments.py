"""Lesson 09's experiments: DiLoCo against synchronous AdamW, the noise scale, the batch sweep.

Each trains `train.run`'s MLP on its data, through `train.run`'s loop, on real ranks by
default, as every run function, or simulated ones (`simulate=True`; the one-process batch
sweep in this process):

1. `run_diloco`: "sync" is the "flat" strategy with AdamW, "local" is "local_sgd" with
   AdamW (`start_local_at`: post-local SGD), "diloco" is DiLoCo's outer step every
   `inner_steps` (this topic's strategies, train_strategies.py);
2. `run_noise_scale`: the "noise_scale" strategy, B_simple per step;
3. a `TuningRun` of the history: losses, logical time at the end of each step, traffic;
4. `steps_at`: the "single" strategy in float64 with 5 warm-up steps (or more, or none),
   stopped once it diverges or reaches the target.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from syncedu.comm.runs import check_choice
from syncedu.train import harness, runner, train_rank
from syncedu.train.config import TrainConfig
from syncedu.train.harness import Result
from syncedu.tuning.diloco import DiLoCoConfig

METHODS = ("sync", "diloco", "local")


@dataclass
class TuningRun(Result):
    """What `run_diloco` and `run_noise_scale` return (Step 3): `loss`, the mean over ranks
    of the local loss per step; `ledger` and `seconds`, the training's (set-up excluded;
    logical when simulated)."""

    times: list[float]  # seconds at the end of each step (rank 0, set-up excluded; logical
    # when simulated)
    final_loss: float  # loss of the final (common) parameters on all the data
    accuracy: float
    noise: list[float] = field(default_factory=list)  # B_simple per step (noise-scale runs)

    @classmethod
    def of(cls, history) -> TuningRun:
        """A `TuningRun` from a `train.run` history (cumulative step seconds, noise estimates)."""
        return cls(list(itertools.accumulate(history.step_seconds)), history.final_loss,
                   history.accuracy, history.extra.get("noise", []), loss=history.loss,
                   params=history.params, ledger=history.ledger, seconds=history.seconds)

    @property
    def bytes_sent(self) -> int:
        """Rank 0's payload bytes."""
        return self.ledger.sent[0]

    def time_to(self, target: float) -> float:
        """Logical seconds until the step loss first drops to `target` (inf if never)."""
        i = steps_to(self.loss, target)
        return self.times[i - 1] if i else float("inf")


def steps_to(loss, target: float) -> int:
    """1-based number of steps until `loss` first drops to `target` (0 if it never does)."""
    return next((i + 1 for i, v in enumerate(loss) if v <= target), 0)


def run_diloco(method: str, world_size: int, *, steps: int, global_batch: int, seed: int = 0,
               network=None, simulate: bool = False, pool=None, compute_seconds: float = 0.0,
               config: DiLoCoConfig | None = None, start_local_at: int = 0) -> TuningRun:
    """Train with `method` ("sync", "diloco" or "local") on `world_size` ranks (real, then
    `times` are wall-clock seconds, or simulated with `simulate=True`, as everywhere)."""
    check_choice("method", method, METHODS)
    config = config or DiLoCoConfig(inner_steps=10, inner_lr=3e-3, weight_decay=0.0)
    strategy, options = {"sync": ("flat", {}),  # Step 1
                         "local": ("local_sgd", {"sync_every": config.inner_steps,
                                                 "start_local_at": start_local_at}),
                         "diloco": ("diloco", {"strategy_config": config})}[method]
    return TuningRun.of(harness.run(
        strategy, world_size, steps=steps, global_batch=global_batch, seed=seed,
        network=network, simulate=simulate, pool=pool, compute_seconds=compute_seconds,
        optimizer="adamw", lr=config.inner_lr, weight_decay=config.weight_decay, **options))


def run_noise_scale(world_size: int, *, steps: int, global_batch: int, lr: float = 0.1,
                    network=None, simulate: bool = False, pool=None) -> TuningRun:
    """Data-parallel SGD, estimating B_simple at every step (Step 2); ranks as `run_diloco`."""
    return TuningRun.of(harness.run("noise_scale", world_size, steps=steps,
                                    global_batch=global_batch, lr=lr, network=network,
                                    simulate=simulate, pool=pool))


LR_GRID = (1.6, 0.8, 0.4, 0.2, 0.1, 0.05)  # high first: a good rate early caps the rest


def steps_at(batch: int, lr: float, *, target: float, max_steps: int = 400,
             warmup_steps: int = 5) -> int:
    """Steps of plain SGD (one process) until the 5-step mean loss reaches `target` (Step 4).

    `warmup_steps` of linear warm-up (Goyal et al. 2017); 0: never within `max_steps`, or
    diverged (a loss of 10 or more, or nan). The run stops as soon as it diverges or reaches
    the target (`run_to_target`).
    Trained in float64, because at lr 0.8 and batch 512 float32's last-bit differences
    between CPUs (the vector width sets a matrix multiply's summation order) grew into
    another step count (56 steps on one machine, 62 on another).
    """
    return run_to_target(batch, lr, target=target, max_steps=max_steps,
                         warmup_steps=warmup_steps)[0]


def run_to_target(batch: int, lr: float, *, target: float, max_steps: int = 400,
                  warmup_steps: int = 5) -> tuple[int, list[float]]:
    """`steps_at`'s run: (its steps, 0 if none; the loss of every step it took).

    It is `train.run("single", ...)`'s own per-rank session, stepped one step at a time
    (the same batches, rates and losses: tests/tuning checks it against the whole run),
    so that it can stop once the loss reaches 10 (diverged) or the 5-step mean `target`.
    """
    cfg = TrainConfig(strategy="single", world_size=1, steps=max_steps, global_batch=batch,
                      lr=lr, warmup_steps=warmup_steps, dtype="float64")
    return runner.run(_steps_until, 1, args=(cfg, target), local=True)[0]


def _steps_until(comm, cfg, target: float) -> tuple[int, list[float]]:
    session = train_rank.Session(comm, cfg)
    for step in range(cfg.steps):
        session.run(step, step + 1)
        if not session.loss[-1] < 10:  # diverged (or nan): this rate loses
            return 0, session.loss
        if step >= 4 and sum(session.loss[-5:]) / 5 <= target:
            return step + 1, session.loss
    return 0, session.loss


def tuned_batch_sweep(batches, *, target: float, lrs=LR_GRID,
                      max_steps: int = 400) -> dict[int, tuple[int, float]]:
    """For each global batch, (fewest steps to `target`, the learning rate that got them).

    The rate is retuned per batch, as Google's tuning playbook and Shallue et al. 2019 do.
    Steps: 1. for each rate, `steps_at` capped at the best so far; 2. keep the fewest
    steps and its rate (0 steps: no rate reached the target).
    """
    out = {}
    for b in batches:
        best, best_lr = 0, float("nan")
        for lr in lrs:  # Step 1
            cap = best - 1 if best else max_steps
            if cap < 1:
                break
            got = steps_at(b, lr, target=target, max_steps=cap)
            if got and (not best or got < best):  # Step 2
                best, best_lr = got, lr
        out[b] = (best, best_lr)
    return out
