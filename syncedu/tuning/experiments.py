"""Lesson 09's experiments: DiLoCo against synchronous AdamW, and the noise scale in training.

Both run any number of ranks (simulated ones for the checked numbers), on the
digits and the MLP of `train.run`, with the same global batches
(`sampling.global_batches`, rank r reading its `shard`):

- `run_diloco(method, workers, ...)`: "sync" averages the gradients every step
  (data-parallel AdamW, one model of traffic per step); "diloco" takes
  `inner_steps` local AdamW steps and then DiLoCo's outer step
  (tuning/diloco.py, one model of traffic per round); "local" averages
  the parameters every `inner_steps` steps instead (local SGD with AdamW;
  `start_local_at=T` makes it post-local SGD: every step up to step T). Each
  step charges
  `compute_seconds` to the rank's clock, so on a simulated WAN the logical
  time shows what the traffic costs.
- `run_noise_scale(workers, ...)`: data-parallel SGD whose one allreduce per
  step also carries each rank's squared gradient norm (tuning/noise_scale.py), so
  every step yields an estimate of the critical batch B_simple.

Steps of one rank (`_Rank`): 1. seeded model and data; 2. per step, forward
and backward on the shard and charge compute; 3. the method's
synchronization; 4. the optimizer step; 5. the result: per-step losses and
logical times, the final parameters, their loss and accuracy on all the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from syncedu.comm import sim
from syncedu.train import data, models, sampling
from syncedu.tuning.diloco import DiLoCo, DiLoCoConfig
from syncedu.tuning.local_sgd import LocalSGD
from syncedu.tuning.noise_scale import NoiseScale, allreduce_with_norms

__all__ = ["TuningRun", "run_diloco", "run_noise_scale", "steps_to", "METHODS", "batch_sweep",
           "tuned_batch_sweep", "LR_GRID"]

METHODS = ("sync", "diloco", "local")


@dataclass
class TuningRun:
    """What `run_diloco` and `run_noise_scale` return."""

    loss: list[float]  # mean over ranks of the local loss, per step
    times: list[float]  # logical seconds at the end of each step (rank 0, set-up excluded)
    final_loss: float  # loss of the final (common) parameters on all the data
    accuracy: float
    bytes_sent: int  # rank 0's payload bytes
    seconds: float  # logical seconds of the training (rank 0, set-up excluded)
    params: dict[str, torch.Tensor] = field(repr=False)
    noise: list[float] = field(default_factory=list)  # B_simple per step (noise-scale runs)

    def time_to(self, target: float) -> float:
        """Logical seconds until the step loss first drops to `target` (inf if never)."""
        i = steps_to(self.loss, target)
        return self.times[i - 1] if i else float("inf")


def steps_to(loss, target: float) -> int:
    """1-based number of steps until `loss` first drops to `target` (0 if it never does)."""
    return next((i + 1 for i, v in enumerate(loss) if v <= target), 0)


class _Rank:
    """Steps 1-2 for one rank."""

    def __init__(self, comm, steps: int, global_batch: int, seed: int, compute: float):
        self.comm, self.compute = comm, compute
        self.x, self.y = data.digits().tensors  # Step 1
        self.model = models.make("mlp", seed=seed)
        self.batches = iter(sampling.global_batches(len(self.x), steps, global_batch, seed=seed))
        self.loss: list[float] = []
        self.times: list[float] = []
        self.start = 0.0

    def begin(self) -> None:
        """After the set-up (the initial broadcast): line the ranks up, zero ledger and clock."""
        self.comm.barrier()  # the broadcast reached the ranks at different logical times
        self.comm.ledger.reset()
        self.start = self.comm.now()

    def tick(self) -> None:
        self.times.append(self.comm.now() - self.start)

    def forward_backward(self) -> None:  # Step 2
        idx = sampling.shard(next(self.batches), self.comm.rank, self.comm.world_size)
        loss = F.cross_entropy(self.model(self.x[idx]), self.y[idx])
        loss.backward()
        self.loss.append(loss.item())
        if self.compute:
            self.comm.compute(self.compute)

    def flat_grad(self) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.model.parameters()])

    def set_grad(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.model.parameters():
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def result(self, **extra) -> dict:  # Step 5
        with torch.no_grad():
            out = self.model(self.x)
            final = F.cross_entropy(out, self.y).item()
            acc = (out.argmax(1) == self.y).float().mean().item()
        params = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        return {"loss": self.loss, "times": self.times, "final": final, "acc": acc,
                "params": params, "elapsed": self.comm.now() - self.start, **extra}


def _diloco_worker(comm, method, steps, global_batch, seed, compute, config, start_local_at):
    rank = _Rank(comm, steps, global_batch, seed, compute)
    algo = DiLoCo(rank.model, comm, config)  # broadcasts rank 0's parameters
    local = LocalSGD(rank.model, comm, config.inner_steps, start_local_at=start_local_at) \
        if method == "local" else None
    rank.begin()  # count the training traffic and time only
    for _ in range(steps):
        algo.inner.zero_grad(set_to_none=False)
        rank.forward_backward()
        if method == "sync":  # Step 3: data parallelism, the gradients every step
            flat = rank.flat_grad()
            comm.all_reduce(flat, op="avg")
            rank.set_grad(flat)
        algo.inner.step()  # Step 4
        if method == "diloco":
            algo.after_step()  # Step 3: DiLoCo, the outer step every H steps
        elif local is not None:
            local.after_step()  # Step 3: local SGD, the parameter average every H steps
        rank.tick()
    if method == "diloco":
        algo.finish()
    elif local is not None:
        local.finish()
    return rank.result()


def _collect(res, noise=None) -> TuningRun:
    n = len(res)
    loss = [sum(r["loss"][i] for r in res) / n for i in range(len(res[0]["loss"]))]
    return TuningRun(loss=loss, times=res[0]["times"], final_loss=res[0]["final"],
                     accuracy=res[0]["acc"], bytes_sent=res.ledger.sent[0],
                     seconds=res[0]["elapsed"], params=res[0]["params"],
                     noise=noise if noise is not None else [])


def run_diloco(method: str, workers: int, *, steps: int, global_batch: int, seed: int = 0,
               network=None, compute_seconds: float = 0.0,
               config: DiLoCoConfig | None = None, start_local_at: int = 0) -> TuningRun:
    """Train with `method` ("sync", "diloco" or "local") on `workers` simulated ranks."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is unknown; choose one of {METHODS}")
    if global_batch % workers:
        raise ValueError(f"global_batch={global_batch} must be a multiple of workers={workers}")
    config = config or DiLoCoConfig(inner_steps=10, inner_lr=3e-3, weight_decay=0.0)
    res = sim.run(_diloco_worker, workers, args=(method, steps, global_batch, seed,
                                                 compute_seconds, config, start_local_at),
                  network=network)
    return _collect(res)


def _noise_worker(comm, steps, global_batch, seed, lr, ema):
    rank = _Rank(comm, steps, global_batch, seed, 0.0)
    for t in [*rank.model.parameters(), *rank.model.buffers()]:
        comm.broadcast(t.data, src=0)
    opt = torch.optim.SGD(rank.model.parameters(), lr=lr)
    scale = NoiseScale(ema=ema)
    rank.begin()
    b_small, b_big = global_batch // comm.world_size, global_batch
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        rank.forward_backward()
        flat, small_sq = allreduce_with_norms(comm, rank.flat_grad())  # Steps 1-2
        big_sq = float(flat.double().pow(2).sum())
        scale.update(small_sq, big_sq, b_small, b_big)  # Steps 3-4
        rank.set_grad(flat)
        opt.step()
        rank.tick()
    return rank.result(noise=scale.history)


def run_noise_scale(workers: int, *, steps: int, global_batch: int, lr: float = 0.1,
                    seed: int = 0, ema: float = 0.9) -> TuningRun:
    """Data-parallel SGD on simulated ranks, estimating B_simple at every step."""
    if workers < 2 or global_batch % workers:
        raise ValueError(f"workers={workers} must be >= 2 and divide global_batch={global_batch}")
    res = sim.run(_noise_worker, workers, args=(steps, global_batch, seed, lr, ema))
    return _collect(res, noise=res[0]["noise"])


def batch_sweep(batches, *, target: float, base_lr: float = 0.05, base_batch: int = 32,
                warmup_steps: int = 5, max_steps: int = 400, seed: int = 0) -> dict[int, int]:
    """Steps to reach `target` training loss for each global batch (0: not within max_steps).

    One process, plain SGD, the linear scaling rule lr = base_lr * B / base_batch
    with `warmup_steps` of linear warm-up (Goyal et al. 2017). The loss checked
    is the current batch's, smoothed over the last 5 steps.
    """
    x, y = data.digits().tensors
    out = {}
    for b in batches:
        model = models.make("mlp", seed=seed)
        lr = base_lr * b / base_batch
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        recent: list[float] = []
        out[b] = 0
        for step, idx in enumerate(sampling.global_batches(len(x), max_steps, b, seed=seed)):
            for group in opt.param_groups:  # warm-up, then the scaled rate
                group["lr"] = lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps else lr
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            recent = (recent + [loss.item()])[-5:]
            if len(recent) == 5 and sum(recent) / 5 <= target:
                out[b] = step + 1
                break
    return out


LR_GRID = (1.6, 0.8, 0.4, 0.2, 0.1, 0.05)  # high first: a good rate early caps the rest


def _steps_at(b: int, lr: float, *, target: float, warmup_steps: int, max_steps: int,
              seed: int) -> int:
    """Steps until the 5-step mean loss reaches `target` at batch b, lr (0: never, or diverged)."""
    x, y = data.digits().tensors
    model = models.make("mlp", seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    recent: list[float] = []
    for step, idx in enumerate(sampling.global_batches(len(x), max_steps, b, seed=seed)):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps else lr
        opt.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        if not loss.item() < 10:  # diverged (or nan): this rate loses
            return 0
        loss.backward()
        opt.step()
        recent = (recent + [loss.item()])[-5:]
        if len(recent) == 5 and sum(recent) / 5 <= target:
            return step + 1
    return 0


def tuned_batch_sweep(batches, *, target: float, lrs=LR_GRID, warmup_steps: int = 5,
                      max_steps: int = 400, seed: int = 0) -> dict[int, tuple[int, float]]:
    """For each global batch, (fewest steps to `target`, the learning rate that got them).

    The learning rate is retuned per batch size over `lrs` before the steps are
    compared, as Google's tuning playbook ("Choosing the batch size") and
    Shallue et al. 2019 do: a fixed rule such as linear scaling can diverge at
    large batches and fake a plateau. Steps: 1. for each batch, each rate of
    the grid in turn, train plain SGD with `warmup_steps` of linear warm-up
    until the loss averaged over 5 steps reaches `target` (a run stops early
    once it cannot beat the best so far, or diverges); 2. keep the fewest
    steps and its rate (0 steps: no rate reached the target).
    """
    out = {}
    for b in batches:
        best, best_lr = 0, float("nan")
        for lr in lrs:  # Step 1
            cap = best - 1 if best else max_steps
            if cap < 1:
                break
            got = _steps_at(b, lr, target=target, warmup_steps=warmup_steps, max_steps=cap,
                            seed=seed)
            if got and (not best or got < best):  # Step 2
                best, best_lr = got, lr
        out[b] = (best, best_lr)
    return out
