"""`train.run`: one seeded training job, any gradient-sync strategy, a history back.

    ref = train.run("single", 1, steps=50, global_batch=64)
    dp = train.run("bucketed", 2, steps=50, global_batch=64, accumulation=2)
    dp.max_param_diff(ref)  # ~1e-7

1. validate the job in a frozen `TrainConfig`;
2. run it where `runner` puts it; every strategy reads the same global batches;
3. long real runs go in chunks on the warm ranks, so a tqdm bar can move;
4. gather a `History`; the final parameters must be identical on every rank.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass, field

import torch

from syncedu.comm.ledger import Ledger
from syncedu.train import runner, strategies, train_rank
from syncedu.train.config import MISTAKES, TrainConfig

__all__ = ["run", "Result", "History", "TrainConfig", "STRATEGIES", "MISTAKES"]
STRATEGIES = strategies.FACTORIES  # every name train.run accepts: the topics' registry


@dataclass(kw_only=True)
class Result:
    """What every run function of the course returns, at least; `History` (`train.run`),
    `PSHistory` (`ps.run`), `TuningRun`, `BNResult`, `FTResult` and `TorchftResult` extend it.

    `loss`: the global mean loss per step; `params`: the final parameters by name; `ledger`:
    the run's traffic; `trace`: every message (simulated ranks; None where a run keeps
    none); `seconds`: the run's time, logical on simulated ranks, else wall-clock.
    """

    loss: list[float] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    ledger: Ledger | None = None
    trace: object = field(default=None, repr=False)
    seconds: float = 0.0

    def max_param_diff(self, other) -> float:
        """Largest absolute difference to `other`'s final parameters (a result or a dict)."""
        return runner.max_param_diff(self, other)


@dataclass
class History(Result):
    """What a training run returns (`train_seconds`: the slowest rank's, from a common
    barrier; `seconds`: logical if simulated, else `train_seconds`; `comm_wait_seconds`:
    exposed communication)."""

    config: TrainConfig
    train_seconds: float
    compute_seconds: float
    comm_wait_seconds: float
    comm_busy_seconds: float
    accuracy: float  # rank 0's, on the whole dataset (or the `holdout` samples), eval mode
    final_loss: float  # of the final parameters there
    timeline: list[tuple[str, float, float]] = field(repr=False)
    sim_seconds: float | None = None
    # Per rank, bytes of model state (ZeRO: its peaks; else what is held after the last step).
    model_state_bytes: list[dict] | None = None
    extra: dict = field(default_factory=dict)  # rank 0's `Parts.report()` (strategy-specific)
    # Per rank, seconds of each optimizer step (logical when simulated).
    rank_step_seconds: list[list[float]] = field(default_factory=list, repr=False)
    # Per rank: its accuracy and its own buffers (BatchNorm's running statistics differ).
    rank_accuracy: list[float] = field(default_factory=list)
    rank_buffers: list[dict] = field(default_factory=list, repr=False)

    @property
    def steps_per_second(self) -> float:
        """Optimizer steps per second of `train_seconds` (inf for a run that took no time)."""
        return len(self.loss) / self.train_seconds if self.train_seconds else float("inf")

    @property
    def step_seconds(self) -> list[float]:
        """Rank 0's seconds of each optimizer step (logical when simulated)."""
        return self.rank_step_seconds[0]

    @property
    def grad_bytes(self) -> int:
        """Gradient bytes rank 0 sent (the "all_reduce" op of the ledger)."""
        op = self.ledger.ops.get("all_reduce")
        return op.sent[0] if op is not None else 0

    @classmethod
    def from_ranks(cls, cfg: TrainConfig, values: list[train_rank.RankResult]) -> History:
        """Step 4: merge the ranks' results; the parameters must agree bit for bit (also the
        Horovod launcher's, whose ranks `horovod.run` starts)."""
        first = values[0].params
        for r, v in enumerate(values[1:], start=1):
            bad = [k for k in first if not torch.equal(first[k], v.params[k])]
            if bad:
                raise RuntimeError(f"rank {r}'s parameters {bad} differ from rank 0's: the "
                                   f"ranks diverged (strategy={cfg.strategy!r})")
        n = len(values)
        loss = [sum(v.loss[i] for v in values) / n for i in range(cfg.steps)]
        elapsed, sim_seconds = max(v.elapsed for v in values), values[0].sim_seconds
        return cls(config=cfg, loss=loss, params=first, ledger=Ledger([v.ledger for v in values]),
                   train_seconds=elapsed, seconds=elapsed if sim_seconds is None else sim_seconds,
                   compute_seconds=sum(v.compute for v in values) / n,
                   comm_wait_seconds=sum(v.wait for v in values) / n,
                   comm_busy_seconds=sum(v.busy for v in values) / n,
                   accuracy=values[0].accuracy,
                   final_loss=values[0].final_loss, extra=values[0].extra,
                   rank_step_seconds=[v.steps for v in values],
                   rank_accuracy=[v.accuracy for v in values],
                   rank_buffers=[v.buffers for v in values],
                   timeline=values[0].timeline, sim_seconds=sim_seconds,
                   model_state_bytes=[v.model_state for v in values])


def run(strategy: str, world_size: int, *, steps: int, global_batch: int, accumulation: int = 1,
        lr: float = 0.1, seed: int = 0, pool=None, network=None, simulate: bool = False,
        progress: bool | None = None, timeout: float = 600.0, **options) -> History:
    """Train with `strategy` on `world_size` ranks; a `History`.

    Every strategy sees the same global batches for a given seed (train/sampling.py), so
    any two runs compare directly (`runner.max_param_diff`).

    Args:
        strategy: a name in `STRATEGIES` (the registry topics fill: "single", "naive",
            "flat", "bucketed", "ddp", "zero1", "local_sgd", ...).
        world_size: ranks (1 for "single"; real ranks up to 64, simulated up to 4096).
        steps: optimizer steps.
        global_batch: samples per optimizer step over all ranks (a multiple of
            world_size x accumulation).
        accumulation: micro-batches per optimizer step on each rank (default 1).
        lr: learning rate (default 0.1).
        seed: seeds the model's initial weights and the data order (default 0).
        pool: a warm `launch.Pool(world_size)` to run on (default None: fresh processes).
        network: a `Network`, emulated on real ranks, modeled with `simulate=True`
            (default None: as fast as the machine).
        simulate: run on simulated ranks (logical clock) instead of processes (default False).
        progress: a tqdm bar; None (default) shows one in a terminal from 100 steps.
        timeout: seconds the whole run may take on real ranks (default 600.0).
        **options: any other `TrainConfig` field (`bucket_cap_mb`, `compression`,
            `optimizer`, `momentum`, `mistake`, ...); an unknown one is a `TypeError`.
    """
    cfg = TrainConfig(strategy=strategy, world_size=world_size, steps=steps,  # Step 1
                      global_batch=global_batch, accumulation=accumulation, lr=lr, seed=seed,
                      **options)
    if simulate and strategy in strategies.REAL_ONLY:
        raise ValueError(f"strategy={strategy!r} needs torch.distributed: it cannot be "
                         f"simulated (use simulate=False)")
    if strategy in strategies.LAUNCHERS:  # it starts its own ranks (Horovod: horovod.run)
        launcher = strategies.LAUNCHERS[strategy]
        return History.from_ranks(cfg, launcher(cfg, pool=pool, network=network, timeout=timeout))
    progress = steps >= 100 and sys.stderr.isatty() if progress is None else progress
    # Step 2: "single" in this process, the others where the runner puts them.
    with runner.Placement(world_size, pool=pool, network=network, simulate=simulate,
                      local=strategy == "single", timeout=timeout,
                      job=f"strategy={strategy!r}") as ranks:
        if progress and ranks.kind in ("pool", "fresh"):
            return History.from_ranks(cfg, _run_chunks(ranks, cfg))
        return History.from_ranks(cfg, list(ranks.run(train_rank.train_all, (cfg,))))


def _run_chunks(ranks: runner.Placement, cfg: TrainConfig) -> list:
    """Step 3: the run in chunks on the warm ranks, behind a tqdm progress bar."""
    from tqdm.auto import tqdm

    token = uuid.uuid4().hex  # names this run's state kept on the ranks between calls
    chunk = max(1, cfg.steps // 50)
    try:
        with tqdm(total=cfg.steps, desc=f"{cfg.strategy} x{cfg.world_size}",
                  file=sys.stderr) as bar:
            for start in range(0, cfg.steps, chunk):
                stop = min(cfg.steps, start + chunk)
                ranks.run(train_rank.train_chunk, (cfg, token, start, stop))
                bar.update(stop - start)
        return list(ranks.run(train_rank.train_end, (token,)))
    finally:
        ranks.run(train_rank.train_drop, (token,))
