"""One rank's side of `train.run`: build the model, wrap it, run the steps, time them.

1. setup: the seeded model, wrapped by the strategy's factory, and its optimizer;
2. steps: for each global batch, this rank's shard in `accumulation` micro-batches,
   gradient sync only on the last one (unless `TrainConfig.mistake`), then the optimizer
   step; modeled compute is charged layer by layer (`LayerCompute`), so overlap shows;
3. finish: the final parameters by the plain module's names, losses, times, timeline.

State lives in a `Session` per call, except `_SESSIONS`, which lets a warm pool run a
long job in chunks (each rank is its own process there).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from syncedu.comm.ledger import RankLedger
from syncedu.train import data, memory, models, sampling
from syncedu.train import strategies as train_strategies
from syncedu.train.layer_compute import LayerCompute

_SESSIONS: dict = {}


@dataclass
class RankResult:
    """What one rank reports at the end of a run (harness.py merges them into a `History`)."""

    loss: list[float]  # this rank's shard mean loss per optimizer step
    params: dict[str, torch.Tensor]  # final parameters by the plain module's names
    accuracy: float  # on the whole dataset (or the held-out samples), at the end, in eval mode
    final_loss: float  # cross-entropy of the final parameters there
    buffers: dict[str, torch.Tensor]  # this rank's own buffers (BatchNorm's running statistics)
    elapsed: float  # seconds of the training steps, from a common barrier
    compute: float  # seconds computing (forward, backward, optimizer step)
    wait: float  # seconds waiting for communication (exposed)
    busy: float  # seconds a gradient transfer was in flight, overlapped or not
    steps: list[float]  # seconds of each step (logical on simulated ranks)
    timeline: list[tuple[str, float, float]]  # (kind, start, end) of the last steps
    ledger: RankLedger  # the training traffic
    model_state: dict | None  # peak bytes of params, grads, optimizer state (train/memory.py)
    sim_seconds: float | None  # logical seconds (simulated ranks only)
    extra: dict  # what the strategy reports (`Parts.report`), e.g. the noise scale per step


class Session:
    """Everything one rank keeps during a training run."""

    def __init__(self, comm, cfg):
        self.comm, self.cfg = comm, cfg
        whole = data.digits(images=cfg.model == "cnn") if cfg.dataset == "digits" else \
            data.synthetic(n=cfg.synthetic_size, features=64, classes=10, seed=cfg.seed)
        self.dataset, test = data.holdout_split(whole, cfg.holdout, cfg.seed)
        self.x, self.y = self.dataset.tensors
        self.test_x, self.test_y = test.tensors  # what accuracy and final_loss are measured on
        self.module = models.make(cfg.model, seed=cfg.seed, **dict(cfg.model_kwargs))
        dtype = getattr(torch, cfg.dtype)  # float64: the same float32 start, widened
        self.module.to(comm.device, dtype)
        self.x, self.test_x = self.x.to(dtype), self.test_x.to(dtype)
        charge = LayerCompute(self.module, comm, cfg.compute_seconds)
        parts = self.parts = train_strategies.build(self.module, comm, cfg)  # Step 1
        self.model, self.events, self.opt = parts.model, parts.events, parts.optimizer
        self.charge = charge.attach() if cfg.compute_seconds else None
        self.batches = sampling.global_batches(self.dataset, cfg.steps, cfg.global_batch,
                                               seed=cfg.seed, set_epoch=cfg.set_epoch)
        self.loss: list[float] = []
        self.times = {"compute": 0.0, "wait": 0.0, "steps": []}
        self.timeline: list[tuple[str, float, float]] = []
        self.ledger = RankLedger(comm.rank)
        self.elapsed, self.sim_elapsed = 0.0, 0.0

    # ------------------------------------------------------------ Step 2
    def no_sync(self):
        """The strategy's `no_sync()` context (accumulation: skip the gradient traffic)."""
        return self.parts.no_sync()

    def finish_sync(self) -> float:
        """Wait for the last backward's gradient traffic; the seconds it took to arrive."""
        t0 = time.perf_counter()
        self.parts.finish()
        return time.perf_counter() - t0

    def micro_step(self, idx: torch.Tensor, last: bool, k: int) -> float:
        """Forward+backward of one micro-batch; returns the seconds waited for gradients."""
        cfg, dev = self.cfg, self.comm.device
        mistake = cfg.mistake
        skip = not last and mistake != "sync_every"  # no gradient sync wanted this time
        wrap_forward = skip and mistake != "partial_no_sync"
        fwd_ctx = self.no_sync() if wrap_forward else contextlib.nullcontext()
        t0 = time.perf_counter()
        with fwd_ctx:
            out = self.model(self.x[idx].to(dev))
            loss = F.cross_entropy(out, self.y[idx].to(dev))
            scaled = loss if mistake == "unscaled_loss" else loss / k
            t1 = time.perf_counter()
            with (self.no_sync() if skip else contextlib.nullcontext()):
                scaled.backward()
        self._step_loss += loss.item() / k
        t2 = time.perf_counter()
        wait = self.finish_sync()
        # forward, backward and the exposed wait of this micro-batch, for the timeline
        self._phases += [("forward", t0, t1), ("backward", t1, t2), ("wait", t2, t2 + wait)]
        return wait

    def step(self, step: int, record: bool) -> None:
        cfg, rank, n = self.cfg, self.comm.rank, self.comm.world_size
        local = sampling.shard(next(self.batches), rank, n)
        for group in self.opt.param_groups:
            group["lr"] = cfg.lr_at(step)
        t0 = time.perf_counter()
        self._step_loss, wait, self._phases = 0.0, 0.0, []
        self.opt.zero_grad(set_to_none=True)
        micro = sampling.micro_batches(local, cfg.accumulation)
        for j, idx in enumerate(micro):
            wait += self.micro_step(idx, j == len(micro) - 1, cfg.accumulation)
        t_opt = time.perf_counter()
        self.opt.step()
        t_after = time.perf_counter()
        self.parts.after_step()  # e.g. local SGD's parameter average: communication
        t1 = time.perf_counter()
        wait += t1 - t_after
        self.loss.append(self._step_loss)
        self.times["compute"] += t1 - t0 - wait
        self.times["wait"] += wait
        self.times["steps"].append(t1 - t0)
        if record:
            self.timeline += [("compute", t0, t_opt), *self._phases, ("step", t_opt, t1)]

    @contextlib.contextmanager
    def _charged(self):
        """Charge a block's wall and logical time and its traffic (only) to the run."""
        self.comm.ledger.reset()
        t0, logical0 = time.perf_counter(), self.comm.now()
        yield
        self.elapsed += time.perf_counter() - t0
        self.sim_elapsed += self.comm.now() - logical0
        self.ledger.merge(self.comm.ledger)  # each entry keeps its kind (counted / modeled)
        self.comm.ledger.reset()

    def run(self, start: int, stop: int) -> None:
        """Steps `start..stop-1`, timed from a common barrier (harness traffic, not charged)."""
        self.comm.barrier()
        first_record = self.cfg.steps - self.cfg.timeline_steps
        with self._charged():
            for step in range(start, stop):
                logical0 = self.comm.now()
                self.step(step, step >= first_record)
                if self.comm.backend == "sim":  # a step's seconds are logical there
                    self.times["steps"][-1] = self.comm.now() - logical0

    def _close(self) -> None:
        """The strategy's last word (e.g. local SGD's final average), charged to the run."""
        with self._charged():
            self.parts.close()
            if self.charge is not None:
                self.charge.close()

    # ------------------------------------------------------------ Step 3
    def result(self) -> RankResult:
        """This rank's `RankResult`: losses, parameters, buffers, accuracy, memory, timeline."""
        state = self.parts.memory() or memory.model_state_bytes(self.module, self.opt)
        self._close()
        params = {k: v.detach().cpu().clone() for k, v in self.module.named_parameters()}
        buffers = {k: v.detach().cpu().clone() for k, v in self.module.named_buffers()}
        with torch.no_grad():
            self.module.eval()  # BatchNorm: this rank's running statistics
            out = self.module(self.test_x.to(self.comm.device)).cpu()
        pred = out.argmax(1)
        first = self.timeline[0][1] if self.timeline else 0.0
        comm_ev = [("comm", s, e) for s, e, _ in self.events if s >= first] if self.timeline else []
        return RankResult(
            loss=self.loss, params=params, accuracy=(pred == self.test_y).float().mean().item(),
            final_loss=F.cross_entropy(out, self.test_y).item(), buffers=buffers,
            elapsed=self.elapsed, compute=self.times["compute"], wait=self.times["wait"],
            busy=sum(e - s for s, e, _ in self.events), steps=self.times["steps"],
            timeline=[(k, s - first, e - first) for k, s, e in self.timeline + comm_ev],
            ledger=self.ledger, model_state=state,
            sim_seconds=self.sim_elapsed if self.comm.backend == "sim" else None,
            extra=self.parts.report())


def train_all(comm, cfg) -> RankResult:
    """The whole run in one call (simulated ranks, or no progress bar)."""
    session = Session(comm, cfg)
    session.run(0, cfg.steps)
    return session.result()


def train_chunk(comm, cfg, token: str, start: int, stop: int) -> None:
    """Steps `start..stop-1` of the run `token` on a warm rank (the first chunk starts it)."""
    if token not in _SESSIONS:
        _SESSIONS[token] = Session(comm, cfg)
    _SESSIONS[token].run(start, stop)


def train_end(comm, token: str) -> RankResult:
    """Run on each rank: close the session `token` names and return its `RankResult`."""
    return _SESSIONS.pop(token).result()


def train_drop(comm, token: str) -> None:
    """Run on each rank: forget the session `token` names (after a failure elsewhere)."""
    _SESSIONS.pop(token, None)
