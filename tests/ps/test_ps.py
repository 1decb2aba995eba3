"""Parameter servers: sync equals one process, exactly-once, staleness bound, shutdown, errors."""

from __future__ import annotations

import pytest
import torch

from syncedu import ps, sim, train
from syncedu.comm import WorkerError, launch
from syncedu.ps import PSConfig, ps_rank, shard_ranges


def _sim(mode, workers, **kw):
    kw.setdefault("global_batch", 8 * workers)
    return ps.run(mode, workers, simulate=True, **kw)


@pytest.fixture(scope="module")
def ref():
    return {gb: train.run("single", 1, steps=6, global_batch=gb) for gb in (24, 60)}


def _straggling(workers, servers):
    return ps.stragglers(workers, servers, {workers - 1: 2.5})


# ----------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs, words", [
    (dict(mode="bsp"), "mode='bsp'"),
    (dict(mode="sync", staleness=2), "staleness=2 applies to mode='ssp'"),
    (dict(mode="async", staleness=1), "staleness=1 applies"),
    (dict(mode="ssp", staleness=-1), "staleness=-1"),
    (dict(mode="ssp", workers=0), "workers=0"),
    (dict(mode="ssp", servers=0), "servers=0"),
    (dict(mode="ssp", steps=[2, 3]), "steps has 2 entries for 3 workers"),
    (dict(mode="ssp", steps=[2, 0, 1]), "steps[i]=0"),
    (dict(mode="sync", steps=[2, 3, 2]), "same number of steps"),
    (dict(mode="ssp", lr=0.0), "lr=0.0"),
    (dict(mode="ssp", variability=2), "variability=2"),
    (dict(mode="ssp", compute_seconds=-1), "compute_seconds=-1"),
])
def test_bad_configs(kwargs, words):
    args = dict(mode="ssp", workers=3, steps=2) | kwargs
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(")):
        PSConfig(**args)


def test_bad_run_arguments():
    with pytest.raises(ValueError, match="global_batch=10 must be a positive multiple of wor"):
        ps.run("sync", 3, steps=1, global_batch=10, simulate=True)
    with pytest.raises(ValueError, match="more than the 5 parameters"):
        shard_ranges(5, 6)
    assert shard_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]


# ------------------------------------------------------- sync == one process
@pytest.mark.parametrize("workers, servers", [(3, 1), (3, 2), (4, 3), (1, 1)])
def test_sync_equals_one_process(ref, workers, servers):
    gb = 24 if 24 % workers == 0 else 60
    h = _sim("sync", workers, servers=servers, steps=6, global_batch=gb)
    r = ref[gb]
    assert h.max_param_diff(r.params) < 1e-6
    assert h.loss == pytest.approx(r.loss, abs=1e-6)
    assert h.staleness == [0] * (6 * workers) and h.pushed == h.applied == 6 * workers


def test_ssp_tau0_equals_sync():
    a = _sim("sync", 3, servers=2, steps=5, variability=0.5)
    b = _sim("ssp", 3, servers=2, steps=5, variability=0.5)
    assert b.max_param_diff(a.params) < 1e-6 and max(b.staleness) == 0


# --------------------------------------------- exactly once, staleness bound
@pytest.mark.parametrize("mode, tau", [("async", 0), ("ssp", 1), ("ssp", 3)])
def test_exactly_once_and_bound(mode, tau):
    workers, servers = 5, 3
    h = _sim(mode, workers, servers=servers, staleness=tau, steps=8, variability=0.7,
             network=_straggling(workers, servers))
    assert h.pushed == h.applied == 40 == len(h.staleness)
    assert sorted((e.worker, e.step) for e in h.events) == \
        [(w, c) for w in range(workers) for c in range(8)]
    push = h.ledger.ops["ps_push"]
    assert push.msgs_received[workers:] == [40] * servers  # every push reached every server
    if mode == "ssp":
        assert max(h.staleness) <= tau
        assert max(h.staleness) == tau  # the straggler makes the bound bite
    else:
        assert max(h.staleness) > 3  # no bound at all
    assert h.final_loss < 2.3


def test_idle_falls_with_tau_and_is_deterministic():
    runs = [_sim("ssp", 6, staleness=t, steps=12, variability=0.5,
                 network=ps.stragglers(6, 1)) for t in (0, 2, 8)]
    idle = [h.mean_idle for h in runs]
    assert idle[0] > idle[1] > idle[2] and idle[0] > 0.3
    again = _sim("ssp", 6, staleness=2, steps=12, variability=0.5, network=ps.stragglers(6, 1))
    assert again.staleness == runs[1].staleness and again.max_param_diff(runs[1].params) == 0


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_uneven_workers_end_cleanly(mode):
    h = _sim(mode, 3, servers=2, staleness=1 if mode == "ssp" else 0, steps=[2, 7, 4],
             network=_straggling(3, 2))
    assert h.pushed == h.applied == 13
    assert len(h.loss) == 7 and (mode == "async" or max(h.staleness) <= 1)


def _crashing(comm, cfg, params):
    def grad(c, p):
        if comm.rank == 1 and c == 2:
            raise RuntimeError("worker blew up")
        return 0.0, torch.zeros_like(p)
    return ps_rank(comm, cfg, params, grad)


def test_crashed_worker_is_a_clear_error_on_sim():
    cfg = PSConfig("ssp", 3, servers=1, staleness=1, steps=5)
    with pytest.raises(WorkerError, match="worker blew up") as info:
        sim.run(_crashing, 4, args=(cfg, torch.zeros(10)))
    assert info.value.rank == 1


def test_recv_any_takes_the_earliest_in_logical_time():
    def fn(comm):
        if comm.rank == 0:
            got = []
            for _ in range(4):
                t = torch.zeros(1)
                got.append((comm.recv_any(t, tag=3), t.item()))
            return got
        for k in range(2):
            comm.compute(0.1 * (3 - comm.rank) * (k + 1))
            comm.send(torch.tensor([10.0 * comm.rank + k]), 0, tag=3)
    res = sim.run(fn, 3, network=ps.stragglers(2, 1, preset="ethernet_1g"))
    assert res[0] == [(2, 20.0), (1, 10.0), (2, 21.0), (1, 11.0)]


def test_widget_reruns():
    pytest.importorskip("ipywidgets")
    from syncedu.ps.lesson04 import PSExplorer

    x = PSExplorer(workers=4, steps=6, plots=False)
    x.mode.value = "async"
    assert x.history.config.mode == "async" and "pushed 24 = applied 24" in x.text


# ------------------------------------------------------------ real ranks
@pytest.fixture(scope="module")
def pool():
    with launch.Pool(4, output="quiet", timeout=60) as p:
        yield p


@pytest.mark.real
def test_real_sync_equals_one_process(pool, ref):
    h = ps.run("sync", 2, servers=2, steps=6, global_batch=24, pool=pool, compute_seconds=0)
    assert h.max_param_diff(ref[24].params) < 1e-6 and h.pushed == h.applied == 12


@pytest.mark.real
def test_real_async_uneven_and_ssp_bound(pool):
    h = ps.run("async", 3, steps=[3, 6, 1], global_batch=24, pool=pool, compute_seconds=0.001)
    assert h.pushed == h.applied == 10
    h = ps.run("ssp", 3, staleness=1, steps=6, global_batch=24, pool=pool, variability=0.8,
               compute_seconds=0.002)
    assert h.pushed == h.applied == 18 and max(h.staleness) <= 1


@pytest.mark.real
def test_real_crashed_worker_is_a_clear_error(pool):
    cfg = PSConfig("async", 3, servers=1, steps=5)
    with pytest.raises(WorkerError, match="worker blew up") as info:
        pool.run(_crashing, (cfg, torch.zeros(10)), timeout=30)
    assert info.value.rank == 1
    h = ps.run("sync", 3, steps=2, global_batch=24, pool=pool, compute_seconds=0)  # pool recovers
    assert h.applied == 6
