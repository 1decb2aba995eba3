"""AD-PSGD: asynchronous pairwise averaging, no rounds, stragglers do not block the rest.

Lian, Zhang, Zhang & Liu, "Asynchronous Decentralized Parallel Stochastic Gradient Descent",
ICML 2018 (their Algorithm 1): each worker, on its own schedule, reads its model, computes a
stochastic gradient there, averages its model with ONE neighbour (both end with the pair's
mean), then applies the gradient, which by now is stale: the model changed (by averagings)
since the gradient was read. No global round, so a slow worker only slows the pairs it is in.

Deadlock. A pairwise average needs both sides. If every worker picks a peer and exchanges with
it (send, then receive), a cycle of picks (A waits for B, B for C, C for A: the paper's own
example, in its implementation section) waits forever. The paper's fix, kept here: a
bipartite graph, workers split into an **active** set that starts exchanges and a **passive**
set that only answers them, so no one ever waits for a worker who is waiting too.

This file, on simulated ranks (`run`; `syncedu.sim`, one logical clock per rank):

1. the job: a quadratic, rank i's loss 0.5 ||x - b_i||^2 with its own target b_i (the data
   differ per rank, so without averaging the ranks never agree), gradients with seeded noise;
   every rank starts at x = 0; a gradient costs `compute` modeled seconds times the rank's
   `Network.slowdown` (a 3.0 there is a straggler); ranks run until `seconds` of simulated time;
2. the split: even ranks active, odd ranks passive, every active may pick every passive (a
   complete bipartite graph). Any world size >= 2: with an odd N the actives are one more
   ((N+1)/2 against (N-1)/2), so each passive hears from more actives;
3. an active step (`active_rank`): pick a passive (seeded), post the reply's receive and send
   (1, x): "average with me"; compute the gradient at x while the exchange is in flight; take
   the pair's mean from the reply, then apply the gradient (its staleness: 1, that average);
4. a passive (`passive_rank`) answers with `recv_any` (the earliest request in logical time): it
   averages, replies with the mean. Its gradients run beside the answers, as a compute thread
   beside a communication thread (this model's assumption: a passive's compute never waits),
   so its k-th gradient (k = 1, 2, ...), read at (k-1) c and applied at k c (c: its seconds
   per gradient), is stale by the number of averagings in between. An active sends (0, ...)
   ("I am done") to every passive at the end; a passive stops when all have;
5. the baseline (a lesson cell, `algorithm=`): synchronous D-PSGD on a ring (gossip.py),
   every rank the same number of rounds, as many as the slowest rank's compute fits;
6. the naive version (a lesson cell too): every rank picks a random peer, `send`s its model,
   then `recv`s the peer's; without the split the simulator stops it with `sim.DeadlockError`.

Each rank returns a `RankLog`: its model, its seconds per gradient and its total time (its idle
share: 1 - gradients x seconds per gradient / total), and per gradient when its model was read
and how stale it was when applied. Steps 5 and 6 are the lesson's own cells (a few lines each,
passed as `algorithm=`), so the notebook shows them where it runs them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from syncedu.comm import sim
from syncedu.comm.runs import check_int, check_number

REQUEST, REPLY = 120, 121  # point-to-point tags


@dataclass
class RankLog:
    """What one rank returns (module docstring, last paragraph)."""

    x: torch.Tensor  # the model, updated in place; final when returned
    cost: float = 0.0  # modeled seconds per gradient (compute x this rank's slowdown)
    span: float = 0.0  # seconds from its start (0) to its end
    reads: list[float] = field(default_factory=list)  # when each gradient's model was read
    staleness: list[int] = field(default_factory=list)  # averagings between read and apply
    # idle share: 1 - len(reads) * cost / span, the time not spent computing gradients


def target(rank: int, dim: int, seed: int) -> torch.Tensor:
    """b_i, rank i's optimum (Step 1); the job's optimum is their mean."""
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed * 100_003 + rank),
                       dtype=torch.float64)


def run(world_size: int, algorithm=None, *, seconds: float = 1.0, compute: float = 0.01,
        lr: float = 0.1, noise: float = 0.5, dim: int = 16, seed: int = 0, network=None):
    """Run `algorithm(comm, log, grad, job, rng)` on the job of Step 1 on simulated ranks
    (default: `active_rank` on even ranks, `passive_rank` on odd ones); return the
    `RunResult` of the ranks' `RankLog`s (`.trace`: every message). `job` is a dict of the
    settings, `grad(x)` this rank's stochastic gradient, `rng` its seeded peer choices.
    Bad values raise `ValueError` naming them."""
    check_int("world_size", world_size, 2), check_int("dim", dim), check_int("seed", seed, 0)
    for name, value in (("seconds", seconds), ("compute", compute), ("lr", lr)):
        if not check_number(name, value) > 0:
            raise ValueError(f"{name}={value!r} must be a number > 0")
    job = dict(seconds=seconds, compute=compute, lr=lr, noise=check_number("noise", noise),
               dim=dim, seed=seed)
    return sim.run(_rank, world_size, args=(algorithm, job), network=network, output="quiet")


def _rank(comm, algorithm, job):
    b = target(comm.rank, job["dim"], job["seed"])
    gen = torch.Generator().manual_seed(job["seed"] * 100_003 + comm.rank + 50_000)

    def grad(x):  # Step 1: this rank's gradient at x, with seeded noise
        return x - b + job["noise"] * torch.randn(x.shape, generator=gen, dtype=x.dtype)

    log = RankLog(torch.zeros(job["dim"], dtype=torch.float64), job["compute"] * comm.slowdown)
    algorithm = algorithm or (active_rank if comm.rank % 2 == 0 else passive_rank)  # Step 2
    algorithm(comm, log, grad, job, random.Random(job["seed"] * 7_919 + comm.rank))
    log.span = comm.now()
    return log


def active_rank(comm, log, grad, job, rng) -> None:  # Step 3
    """An active rank: each gradient overlapped with one exchange it starts with a passive."""
    x, reply, passives = log.x, torch.empty_like(log.x), range(1, comm.world_size, 2)
    while comm.now() + log.cost <= job["seconds"] + 1e-9:
        j = rng.choice(passives)
        request = torch.cat([x.new_ones(1), x])  # (1, x): "average with me"
        works = [comm.irecv(reply, j, REPLY), comm.isend(request, j, REQUEST)]
        g = grad(x)
        log.reads.append(comm.now())
        comm.compute(job["compute"])  # the exchange flies meanwhile
        for work in works:
            work.wait()
        x.copy_(reply).sub_(job["lr"] * g)  # the pair's mean, then the stale gradient
        log.staleness.append(1)
    for j in passives:
        comm.send(x.new_zeros(len(x) + 1), j, REQUEST)  # (0, ...): "I am done"


def passive_rank(comm, log, grad, job, rng) -> None:  # Step 4
    """A passive rank: answers every request; its gradients run beside, on their own clock."""
    x, buf, cost = log.x, log.x.new_empty(len(log.x) + 1), log.cost
    steps, read, changed, done = int(job["seconds"] / cost + 1e-9), x.clone(), 0, 0
    while True:
        src = comm.recv_any(buf, REQUEST) if done < (comm.world_size + 1) // 2 else None  # actives
        t = comm.now() if src is not None else float("inf")
        while len(log.reads) < steps and (len(log.reads) + 1) * cost <= t + 1e-9:
            x.sub_(job["lr"] * grad(read))  # a gradient the compute thread finished by t
            log.reads.append(len(log.reads) * cost)
            log.staleness.append(changed)
            read, changed = x.clone(), 0
        if src is None:
            break
        done += int(buf[0] == 0)
        if buf[0] != 0:  # average: this rank's half of the pair
            x.add_(buf[1:]).div_(2)
            changed += 1
            comm.send(x, src, REPLY)
    comm.compute(max(0.0, steps * cost - comm.now()) / comm.slowdown)  # to its last gradient
