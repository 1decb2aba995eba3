"""Lesson 12's AD-PSGD (adpsgd.py): consensus, no deadlock with the active/passive split, the
naive pairwise exchange's DeadlockError, staleness recounted from the trace, bad arguments."""

import math
import random
import re

import pytest
import torch

from syncedu import Network, sim
from syncedu.decentralized import adpsgd as ad
from syncedu.decentralized import gossip  # the function (one round)
from syncedu.decentralized.gossip import consensus_distance

SIZES = (2, 3, 4, 5, 7, 8)  # even and odd: with an odd N the actives are one more
EAGER = ("gloo", "open_mpi")  # every send waits for its receive / small sends return at once


def naive(comm, log, grad, job, rng):
    """Every rank picks a peer, sends, then receives (the lesson's cell; no split)."""
    other = torch.empty_like(log.x)
    for _ in range(int(job["seconds"] / log.cost)):
        j = rng.choice([r for r in range(comm.world_size) if r != comm.rank])
        comm.send(log.x, j, ad.REQUEST)
        comm.recv(other, j, ad.REQUEST)
        log.x.add_(other).div_(2)


def dpsgd(comm, log, grad, job, rng):
    """Synchronous D-PSGD on a ring, the rounds the slowest rank's compute fits."""
    for _ in range(int(job["seconds"] / (job["compute"] * max(comm.network.slowdown)))):
        g = grad(log.x)
        log.reads.append(comm.now())
        comm.compute(job["compute"])
        log.x.sub_(job["lr"] * g)
        gossip(comm, log.x, "ring")


def idle(log):
    return 1 - len(log.reads) * log.cost / log.span


def _net(n, slow=1, factor=3.0, **kw):
    slowdown = [1.0] * n
    slowdown[slow % n] = factor
    return Network(latency=1e-4, bandwidth=1e9, slowdown=slowdown, **kw)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("eager", EAGER)
def test_active_passive_never_deadlocks(n, eager):
    for seed in range(3):
        res = ad.run(n, network=_net(n, slow=seed, eager_limit=eager), seed=seed, seconds=0.3)
        replies = [m for m in res.trace if m.tag == ad.REPLY]
        assert {m.src % 2 for m in replies} == {1} and {m.dst % 2 for m in replies} == {0}
        assert len({m.dst for m in replies}) == (n + 1) // 2  # every active: odd N, one more
        for r, log in enumerate(res):  # every rank did all the gradients its speed fits
            cost = 0.01 * (3.0 if r == seed % n else 1.0)
            assert len(log.reads) == len(log.staleness) == int(0.3 / cost + 1e-9)


@pytest.mark.parametrize("n", (3, 4, 5, 8))
@pytest.mark.parametrize("eager", EAGER)
def test_naive_pairwise_exchange_deadlocks(n, eager):
    for seed in range(3):
        with pytest.raises(sim.DeadlockError) as err:
            ad.run(n, naive, network=_net(n, eager_limit=eager), seed=seed)
        waits = {r: int(re.search(r"(?:send to|recv from) rank (\d+)", what)[1])
                 for r, what in err.value.waiting.items()}
        assert sorted(waits) == list(range(n))  # everyone waits, each for a rank that waits
        if eager == "gloo":  # every first send waits for its receive: for the first pick
            picks = {r: random.Random(seed * 7_919 + r).choice([j for j in range(n) if j != r])
                     for r in range(n)}
            assert waits == picks


def test_reaches_consensus_on_the_rate_weighted_optimum():
    for n, seed in ((4, 0), (5, 1), (8, 2)):
        net = _net(n, slow=seed)
        b = torch.stack([ad.target(r, 16, seed) for r in range(n)])
        rate = torch.tensor([1 / s for s in net.slowdown], dtype=torch.float64)
        weighted = (rate[:, None] * b).sum(0) / rate.sum()
        xs = [log.x for log in ad.run(n, network=net, seed=seed)]
        # far closer than the ranks alone (each at its own b_i: the targets' spread)
        assert consensus_distance(xs) < 0.3 * consensus_distance(b)
        mean = torch.stack(xs).mean(0)  # the sum moves only by gradients, at each rank's rate
        assert (mean - weighted).norm() < (mean - b.mean(0)).norm()


def test_staleness_matches_the_trace():
    for n, seed in ((4, 0), (7, 1), (8, 2)):
        net = _net(n, slow=seed + 1)
        res = ad.run(n, network=net, seed=seed)
        replies = [m for m in res.trace if m.tag == ad.REPLY]
        for r, log in enumerate(res):
            if r % 2 == 0:  # active: its own exchange, one reply per gradient
                assert log.staleness == [1] * len(log.reads)
                assert sum(m.dst == r for m in replies) == len(log.reads)
                continue
            sent = [m.start for m in replies if m.src == r]  # each reply leaves at an average
            counted = [sum(t <= s < t + log.cost - 1e-12 for s in sent) for t in log.reads]
            assert counted == log.staleness and sum(counted) <= len(sent)


def test_idle_against_synchronous_dpsgd():
    net = _net(8, slow=0)
    sync, asyn = ad.run(8, dpsgd, network=net), ad.run(8, network=net)
    assert all(abs(idle(log) - 2 / 3) < 0.03 for log in list(sync)[1:])
    assert all(idle(log) < 0.02 for log in asyn)
    assert sum(len(log.reads) for log in asyn) == 7 * 100 + 33
    assert sum(len(log.reads) for log in sync) == 8 * 33


@pytest.mark.parametrize("kwargs, name", [
    (dict(world_size=1), "world_size=1"), (dict(seconds=0), "seconds=0"),
    (dict(compute=-1.0), "compute=-1.0"), (dict(lr=0.0), "lr=0.0"), (dict(dim=0), "dim=0"),
    (dict(noise=-0.1), "noise=-0.1"), (dict(seed=-1), "seed=-1"),
    (dict(seconds=math.nan), "seconds=nan")])
def test_bad_arguments_name_the_parameter(kwargs, name):
    args = dict(world_size=4) | kwargs
    with pytest.raises(ValueError, match=name):
        ad.run(args.pop("world_size"), **args)


def test_runs_repeat_bit_for_bit_and_seeds_differ():
    net = _net(5, slow=2)
    a, b, c = (ad.run(5, network=net, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(x.x, y.x) and x.staleness == y.staleness for x, y in zip(a, b))
    assert not all(torch.equal(x.x, z.x) for x, z in zip(a, c))  # the seed picks other peers
