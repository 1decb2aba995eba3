"""train.runner: one place decides where ranks run; one way to compare two runs."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from syncedu import Network, launch, train
from syncedu.ps import training as ps_train
from syncedu.train import runner

ROOT = Path(__file__).resolve().parents[2]


def _hello(comm, k):
    comm.all_reduce(t := torch.ones(3))
    return (comm.rank, comm.world_size, comm.backend, t.sum().item() * k)


# ------------------------------------------------------------- where ranks run
def test_where_picks_one_of_four_places():
    assert runner.where(1, local=True) == "local"
    assert runner.where(3, simulate=True, network=Network()) == "sim"
    assert runner.where(2) == "fresh"
    assert runner.where(2, network=Network()) == "fresh"


class _FakePool:  # what `where` reads of a pool: no ranks started
    world_size, network = 2, None


@pytest.mark.parametrize("kwargs, words", [
    (dict(world_size=2, local=True), "world_size=2 must be 1"),
    (dict(world_size=1, local=True, simulate=True), "pass no pool, network or simulate"),
    (dict(world_size=1, local=True, network=Network()), "pass no pool, network or simulate"),
    (dict(world_size=2, simulate=True, pool=_FakePool()), "simulate=True.*pass no pool"),
    (dict(world_size=2, simulate=1), "simulate=1 must be True or False"),
    (dict(world_size=3, pool=_FakePool()), "pool has world_size=2, the job needs world_size=3"),
    (dict(world_size=2, pool=_FakePool(), network=Network()), "pool's own network"),
])
def test_where_names_the_bad_argument(kwargs, words):
    with pytest.raises(ValueError, match=words):
        runner.where(job="the job", **kwargs)


def test_local_and_simulated_ranks_run_the_same_function():
    local = runner.run(_hello, 1, (2,), local=True)
    assert list(local) == [(0, 1, "local", 6.0)] and local.ledger.world_size == 1
    simd = runner.run(_hello, 3, (2,), simulate=True)
    assert [v[:2] for v in simd] == [(0, 3), (1, 3), (2, 3)] and simd[0][3] == 18.0
    assert simd.ledger.ops["all_reduce"].calls == [1, 1, 1]


@pytest.mark.real
def test_pool_is_reused_and_left_open_fresh_ranks_are_closed():
    with launch.Pool(2, output="quiet") as pool:
        with runner.Placement(2, pool=pool) as ranks:
            assert ranks.kind == "pool"
            assert [v[:2] for v in ranks.run(_hello, (1,))] == [(0, 2), (1, 2)]
        assert pool.run(_hello, (1,))[1][3] == 6.0  # still warm
    with runner.Placement(2, timeout=60) as ranks:
        assert ranks.kind == "fresh" and ranks.run(_hello, (1,))[0][3] == 6.0
    with pytest.raises(RuntimeError, match="closed"):
        ranks.pool.run(_hello, (1,))


# ------------------------------------------------------------- comparing runs
def test_both_histories_compare_to_a_history_or_a_params_dict():
    job = dict(steps=3, global_batch=24, seed=1)
    ref = train.run("single", 1, **job)
    flat = train.run("flat", 2, simulate=True, **job)
    sync = ps_train.run("sync", 2, simulate=True, compute_seconds=0, **job)
    for a, b in [(flat, ref), (sync, ref), (ref, sync), (flat, sync)]:
        assert a.max_param_diff(b) == a.max_param_diff(b.params) < 1e-6
    assert runner.max_param_diff(ref.params, ref) == 0.0
    with pytest.raises(ValueError, match="other=int must be"):
        ref.max_param_diff(3)
    with pytest.raises(ValueError, match="no parameters"):
        ref.max_param_diff({})


def test_bench_dispatcher_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and "collectives" in out.stdout and "dp" in out.stdout, out.stderr
