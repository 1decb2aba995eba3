"""Per-step fault tolerance from scratch: replicas, a quorum, a commit, live recovery.

The idea of torchft (meta-pytorch/torchft): instead of restarting the whole
job from a checkpoint when one replica fails, every step is a transaction
among the replicas alive *now*. Rank 0 plays the lighthouse; ranks 1..R are
the replica groups (one rank each). Every iteration:

1. quorum: each replica reports (alive, step); the lighthouse answers with the
   members and their steps, and drops a silent replica after the heartbeat timeout;
2. recovery: a member behind the highest step (restarted) gets the parameters
   and step from the lowest member at that step, live;
3. exchange: every member sends its gradient and a success flag to the leader
   (the lowest member), which answers everyone with the mean and the verdict;
4. commit: only if every member's exchange succeeded, every member takes the
   same SGD step; otherwise the step is discarded and retried on the same batches.

`Failure`s are injected: a replica dies in iteration `at`'s exchange, stays
down `down` iterations and restarts with fresh (wrong) parameters and step 0.
Deterministic on simulated ranks; `reference` replays the committed steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector as flat
from torch.nn.utils import vector_to_parameters

from syncedu import data, launch, models, sim
from syncedu.comm.runs import check_int, check_number
from syncedu.train.harness import Result

TAG_STATUS, TAG_QUORUM, TAG_STATE, TAG_GRAD, TAG_MEAN = 11, 12, 13, 14, 15


@dataclass(frozen=True)
class Failure:
    """Replica `replica` dies in iteration `at`'s exchange (a flag the leader reads)."""

    replica: int
    at: int
    down: int = 2

    def __post_init__(self):
        for name, low in (("replica", 0), ("at", 0), ("down", 1)):
            check_int(name, getattr(self, name), low)


@dataclass(frozen=True)
class FTConfig:
    """One fault-tolerant run: `replicas` replicas for `iterations` iterations."""

    replicas: int = 3
    iterations: int = 10
    failures: tuple[Failure, ...] = ()
    lr: float = 0.1
    batch: int = 8
    seed: int = 0
    heartbeat_timeout: float = 2.0  # logical seconds before a silent replica is dropped
    step_seconds: float = 0.05  # modeled forward+backward per iteration

    def __post_init__(self):
        for name, low in (("replicas", 2), ("iterations", 1), ("batch", 1), ("seed", 0)):
            check_int(name, getattr(self, name), low)
        for name in ("lr", "heartbeat_timeout", "step_seconds"):
            check_number(name, getattr(self, name), 0)
        if isinstance(self.failures, list):  # a list is fine: stored as the tuple it means
            object.__setattr__(self, "failures", tuple(self.failures))
        if not (isinstance(self.failures, tuple)
                and all(isinstance(f, Failure) for f in self.failures)):
            raise ValueError(f"failures={self.failures!r} must be a tuple of Failure(replica, "
                             "at, down)")
        for f in self.failures:
            if not (f.replica < self.replicas and f.at < self.iterations):
                raise ValueError(f"{f} is outside replicas 0..{self.replicas - 1} "
                                 f"or iterations 0..{self.iterations - 1}")
        for t in range(self.iterations):
            if all(status(self, r, t) == "down" for r in range(self.replicas)):
                raise ValueError(f"failures={self.failures} leave no replica up at iteration {t}")
            if sum(status(self, r, t) == "dies" for r in range(self.replicas)) > 1:
                raise ValueError(f"failures={self.failures}: at most one death per iteration")


def status(cfg: FTConfig, replica: int, t: int) -> str:
    """"up", "dies" (in this iteration's exchange), "down", or "back" (restarted now)."""
    for f in cfg.failures:
        if f.replica == replica and f.at <= t <= f.at + f.down:
            return "dies" if t == f.at else "back" if t == f.at + f.down else "down"
    return "up"


def replica_batch(cfg: FTConfig, step: int, replica: int):
    """The digits replica `replica` trains on at committed step `step` (same on any retry)."""
    x, y = data.digits_tensors()  # the harness's dataset
    g = torch.Generator().manual_seed(cfg.seed * 100_003 + step * 101 + replica)
    pick = torch.randint(0, len(y), (cfg.batch,), generator=g)
    return x[pick], y[pick]


def _grad(model, cfg, step, replica) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    x, y = replica_batch(cfg, step, replica)
    F.cross_entropy(model(x), y).backward()
    return flat([p.grad for p in model.parameters()])


def _lighthouse(comm, cfg: FTConfig) -> list[list[int]]:
    """Step 1, rank 0: one quorum per iteration (members, and every replica's step)."""
    quorums, known_dead, n = [], set(), cfg.replicas
    for _ in range(cfg.iterations):
        reports = torch.zeros(n, 2, dtype=torch.float64)
        for r in range(n):
            comm.recv(reports[r], src=r + 1, tag=TAG_STATUS)
        alive = [r for r in range(n) if reports[r, 0] == 1]
        if set(range(n)) - set(alive) - known_dead:  # newly silent: wait out the heartbeat
            comm.compute(cfg.heartbeat_timeout)
        known_dead = set(range(n)) - set(alive)
        answer = torch.cat([(reports[:, 0] == 1).double(), reports[:, 1]])  # members, steps
        for r in range(n):
            comm.send(answer, dst=r + 1, tag=TAG_QUORUM)
        quorums.append(alive)
    return quorums


def _replica(comm, cfg: FTConfig) -> dict:
    """Steps 1-4 on replica `comm.rank - 1`."""
    me, n = comm.rank - 1, cfg.replicas
    model, step, log = models.make("mlp", seed=cfg.seed), 0, []
    for t in range(cfg.iterations):
        state = status(cfg, me, t)
        if state == "back":  # restarted: fresh (wrong) weights, no progress
            model, step = models.make("mlp", seed=cfg.seed + 1000 + t), 0
        up = state != "down"
        comm.send(torch.tensor([float(up), float(step)], dtype=torch.float64), 0, TAG_STATUS)
        answer = torch.zeros(2 * n, dtype=torch.float64)
        comm.recv(answer, src=0, tag=TAG_QUORUM)  # Step 1
        if not up:
            continue
        members = [r for r in range(n) if answer[r] == 1]
        steps = {r: int(answer[n + r]) for r in members}
        step = _recover(comm, me, members, steps, model)  # Step 2
        comm.compute(cfg.step_seconds)
        mean = exchange(comm, cfg, me, members, step, model, state)  # Step 3
        if mean is not None:  # Step 4
            _sgd(model, mean, cfg.lr)
            step += 1
        log.append((t, tuple(members), mean is not None))
    return {"alive": status(cfg, me, cfg.iterations - 1) in ("up", "back"), "step": step,
            "log": log, "params": {k: v.detach().clone() for k, v in model.named_parameters()}}


def _sgd(model, grad: torch.Tensor, lr: float) -> None:
    params = list(model.parameters())
    with torch.no_grad():
        vector_to_parameters(flat(params) - lr * grad, params)


def _recover(comm, me, members, steps, model) -> int:
    """Step 2: members behind the top step get parameters and step from the lowest one at it."""
    top, params = max(steps.values()), list(model.parameters())
    behind = [m for m in members if steps[m] < top]
    source = min(m for m in members if steps[m] == top)
    if me == source:
        state = torch.cat([flat(params).detach(), torch.tensor([float(top)])])
        for m in behind:
            comm.send(state, m + 1, TAG_STATE)
    elif me in behind:
        buf = torch.zeros(sum(p.numel() for p in params) + 1)
        comm.recv(buf, src=source + 1, tag=TAG_STATE)
        with torch.no_grad():
            vector_to_parameters(buf[:-1], params)
        return int(buf[-1].item())
    return steps[me]


def should_commit(members, succeeded) -> bool:
    """Step 4's rule: a non-empty quorum, every member of which exchanged successfully."""
    return bool(members) and set(members) <= set(succeeded)


def exchange(comm, cfg, me, members, step, model, state) -> torch.Tensor | None:
    """Step 3: gradients to the leader, the mean and the verdict back; the mean if committed."""
    grad = _grad(model, cfg, step, me)
    ok = torch.tensor([0.0 if state == "dies" else 1.0])
    leader = members[0]
    if me != leader:
        comm.send(torch.cat([grad, ok]), leader + 1, TAG_GRAD)
        reply = torch.zeros(grad.numel() + 1)
        comm.recv(reply, src=leader + 1, tag=TAG_MEAN)
    else:
        total, succeeded = grad.clone(), {me} if ok.item() == 1.0 else set()
        for m in members[1:]:
            buf = torch.zeros(grad.numel() + 1)
            comm.recv(buf, src=m + 1, tag=TAG_GRAD)
            total += buf[:-1]
            if buf[-1].item() == 1.0:
                succeeded.add(m)
        verdict = float(should_commit(members, succeeded))
        reply = torch.cat([total / len(members), torch.tensor([verdict])])
        for m in members[1:]:
            comm.send(reply, m + 1, TAG_MEAN)
    if reply[-1] != 1.0 or state == "dies":
        return None  # discarded: the parameters stay as they were
    return reply[:-1]


def _worker(comm, cfg: FTConfig):
    return _lighthouse(comm, cfg) if comm.rank == 0 else _replica(comm, cfg)


@dataclass
class FTResult(Result):
    """The quorums (members per iteration); per replica {"alive", "step", "params", "log":
    [(iteration, members, committed)]}; the ledger (row r: rank r, replica r - 1), the trace
    and the seconds (logical if simulated)."""

    config: FTConfig
    quorums: list[list[int]]
    replicas: list[dict]


def run(world_size: int = 4, *, failures=(), network=None, simulate: bool = False,
        **options) -> FTResult:
    """Per-step fault tolerance from scratch: the lighthouse (rank 0), replica i on rank i + 1.

    Real processes if not `simulate`: the same messages, since every receive names its sender.

    Args:
        world_size: ranks, at least 3 (the lighthouse and 2 or more replicas; default 4).
        failures: `Failure(replica, at, down)` records: replica `replica` dies in iteration
            `at`'s exchange and is down for `down` iterations (default: none).
        network: a `Network` for the messages (default None).
        simulate: simulated ranks on a logical clock (default False: real processes, as
            every run function of the course defaults).
        **options: `FTConfig` fields: `iterations` (10), `lr` (0.1), `batch` (8), `seed` (0),
            `heartbeat_timeout` (logical seconds before a silent replica is dropped, 2.0),
            `step_seconds` (modeled compute per iteration, 0.05).
    """
    check_int("world_size", world_size, 3)
    cfg = FTConfig(replicas=world_size - 1, failures=failures, **options)
    res = (sim.run if simulate else launch.run)(_worker, world_size, args=(cfg,),
                                                network=network)
    return FTResult(cfg, res[0], list(res[1:]), ledger=res.ledger, trace=res.trace,
                    seconds=res.seconds)


def committed_steps(log) -> list[tuple[int, tuple[int, ...]]]:
    """(step, members) of each committed iteration in a replica's `log`, in order."""
    return list(enumerate(members for _, members, ok in log if ok))


def reference(cfg: FTConfig, committed: list[tuple[int, tuple[int, ...]]]) -> dict:
    """One process, no failures: SGD over `committed` (step, members), the mean in member order."""
    model = models.make("mlp", seed=cfg.seed)
    for step, members in committed:
        total = _grad(model, cfg, step, members[0]).clone()
        for m in members[1:]:
            total += _grad(model, cfg, step, m)
        _sgd(model, total / len(members), cfg.lr)
    return {k: v.detach().clone() for k, v in model.named_parameters()}
