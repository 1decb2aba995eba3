"""Lesson 09's experiments: DiLoCo against synchronous AdamW, the noise scale, the batch sweep.

The DiLoCo and noise-scale runs train `train.run`'s MLP and data on simulated ranks in
their own loop (time-to-loss needs each step's logical time). Each rank (`_Rank`):

1. seeded model and data; the set-up's broadcast is not counted;
2. per step, forward and backward on its shard, `compute_seconds` charged;
3. the method's synchronization: "sync" averages the gradients every step,
   "diloco" takes DiLoCo's outer step and "local" averages the parameters every
   `inner_steps` steps (`start_local_at`: post-local SGD); the noise-scale run's
   allreduce also carries each rank's squared gradient norm;
4. the optimizer step, and the step's logical time;
5. the result: per-step losses and times, the final parameters' loss and accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from syncedu.comm import sim
from syncedu.train import data, models, sampling
from syncedu.tuning.diloco import DiLoCo, DiLoCoConfig
from syncedu.tuning.local_sgd import LocalSGD, broadcast_state, copy_flat
from syncedu.tuning.noise_scale import NoiseScale, allreduce_with_norms

METHODS = ("sync", "diloco", "local")


@dataclass
class TuningRun:
    """What `run_diloco` and `run_noise_scale` return."""

    loss: list[float]  # mean over ranks of the local loss, per step
    times: list[float]  # logical seconds at the end of each step (rank 0, set-up excluded)
    final_loss: float  # loss of the final (common) parameters on all the data
    accuracy: float
    ledger: object  # the training traffic (set-up excluded)
    seconds: float  # logical seconds of the training (rank 0, set-up excluded)
    params: dict[str, torch.Tensor] = field(repr=False)
    noise: list[float] = field(default_factory=list)  # B_simple per step (noise-scale runs)

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


class _Rank:
    """Steps 1, 2, 4 and 5 for one rank."""

    def __init__(self, comm, steps: int, global_batch: int, seed: int, compute: float):
        self.comm, self.compute = comm, compute
        self.x, self.y = data.digits().tensors  # Step 1
        self.model = models.make("mlp", seed=seed)
        self.params = list(self.model.parameters())
        self.batches = iter(sampling.global_batches(len(self.x), steps, global_batch, seed=seed))
        self.loss: list[float] = []
        self.times: list[float] = []
        self.start = 0.0

    def begin(self) -> None:
        """After the set-up: line the ranks up, zero the ledger and the clock."""
        self.comm.barrier()  # the broadcast reached the ranks at different logical times
        self.comm.ledger.reset()
        self.start = self.comm.now()

    def forward_backward(self) -> None:  # Step 2
        idx = sampling.shard(next(self.batches), self.comm.rank, self.comm.world_size)
        loss = F.cross_entropy(self.model(self.x[idx]), self.y[idx])
        loss.backward()
        self.loss.append(loss.item())
        if self.compute:
            self.comm.compute(self.compute)

    def flat_grad(self) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in self.params])

    def set_grad(self, flat: torch.Tensor) -> None:
        copy_flat([p.grad for p in self.params], flat)

    def result(self, **extra) -> dict:  # Step 5: `TuningRun`'s fields
        with torch.no_grad():
            out = self.model(self.x)
        return {"loss": self.loss, "times": self.times, "seconds": self.comm.now() - self.start,
                "final_loss": F.cross_entropy(out, self.y).item(),
                "accuracy": (out.argmax(1) == self.y).float().mean().item(),
                "params": {k: v.detach().clone() for k, v in self.model.named_parameters()},
                **extra}


def _diloco_worker(comm, method, steps, global_batch, seed, compute, config, start_local_at):
    rank = _Rank(comm, steps, global_batch, seed, compute)
    algo = DiLoCo(rank.model, comm, config)  # broadcasts rank 0's parameters
    sync = algo if method == "diloco" else None
    if method == "local":
        sync = LocalSGD(rank.model, comm, config.inner_steps, start_local_at=start_local_at)
    rank.begin()  # count the training traffic and time only
    for _ in range(steps):
        algo.inner.zero_grad(set_to_none=False)
        rank.forward_backward()
        if method == "sync":  # Step 3: data parallelism, the gradients every step
            flat = rank.flat_grad()
            comm.all_reduce(flat, op="avg")
            rank.set_grad(flat)
        algo.inner.step()  # Step 4
        if sync is not None:
            sync.after_step()  # Step 3: the outer step / the parameter average every H steps
        rank.times.append(comm.now() - rank.start)
    if sync is not None:
        sync.finish()
    return rank.result()


def _collect(res) -> TuningRun:
    """Rank 0's result, the loss averaged over the ranks."""
    loss = [sum(r["loss"][i] for r in res) / len(res) for i in range(len(res[0]["loss"]))]
    return TuningRun(**{**res[0], "loss": loss}, ledger=res.ledger)


def run_diloco(method: str, world_size: int, *, steps: int, global_batch: int, seed: int = 0,
               network=None, compute_seconds: float = 0.0,
               config: DiLoCoConfig | None = None, start_local_at: int = 0) -> TuningRun:
    """Train with `method` ("sync", "diloco" or "local") on `world_size` simulated ranks."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is unknown; choose one of {METHODS}")
    if global_batch % world_size:
        raise ValueError(f"global_batch={global_batch} must be a multiple of "
                         f"world_size={world_size}")
    config = config or DiLoCoConfig(inner_steps=10, inner_lr=3e-3, weight_decay=0.0)
    return _collect(sim.run(_diloco_worker, world_size, network=network, args=(
        method, steps, global_batch, seed, compute_seconds, config, start_local_at)))


def _noise_worker(comm, steps, global_batch, lr):
    rank = _Rank(comm, steps, global_batch, seed=0, compute=0.0)
    broadcast_state(comm, rank.model)
    opt = torch.optim.SGD(rank.params, lr=lr)
    scale = NoiseScale()
    rank.begin()
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        rank.forward_backward()
        flat, small_sq = allreduce_with_norms(comm, rank.flat_grad())  # Steps 1-2
        scale.update(small_sq, float(flat.double().pow(2).sum()),  # Steps 3-4
                     global_batch // comm.world_size, global_batch)
        rank.set_grad(flat)
        opt.step()
        rank.times.append(comm.now() - rank.start)
    return rank.result(noise=scale.history)


def run_noise_scale(world_size: int, *, steps: int, global_batch: int,
                    lr: float = 0.1) -> TuningRun:
    """Data-parallel SGD on simulated ranks, estimating B_simple at every step."""
    if world_size < 2 or global_batch % world_size:
        raise ValueError(f"world_size={world_size} must be >= 2 and divide "
                         f"global_batch={global_batch}")
    return _collect(sim.run(_noise_worker, world_size, args=(steps, global_batch, lr)))


LR_GRID = (1.6, 0.8, 0.4, 0.2, 0.1, 0.05)  # high first: a good rate early caps the rest


def steps_at(batch: int, lr: float, *, target: float, max_steps: int = 400) -> int:
    """Steps of plain SGD (one process) until the 5-step mean loss reaches `target`.

    5 steps of linear warm-up (Goyal et al. 2017); 0: never within `max_steps`, or diverged.
    """
    x, y = data.digits().tensors
    model = models.make("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    recent: list[float] = []
    for step, idx in enumerate(sampling.global_batches(len(x), max_steps, batch, seed=0)):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 5)
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
