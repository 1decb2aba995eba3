"""Finding the culprit on real ranks: every tool names rank 1 (syncedu/faults).

One module-wide `launch.Pool` of 3 ranks serves every test (each demo makes
its own short-timeout group, so a broken group never reaches the next test);
the launcher's timeout test, which stops the Pool's ranks, runs last.
"""

from __future__ import annotations

import pickle

import psutil
import pytest

from syncedu import launch, sim
from syncedu.faults import culprit

pytestmark = pytest.mark.timeout(300)


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


@pytest.fixture(scope="module")
def pool():
    with launch.Pool(3, timeout=60, output="quiet") as p:
        yield p


def test_monitored_barrier_names_rank_1_and_new_group_timeout_trap(pool):
    res = pool.run(culprit.monitored_barrier)
    assert "Rank 1 failed to pass monitoredBarrier" in res[0]
    timeouts = pool.run(culprit.group_timeouts)[0]
    assert timeouts["new_group()"] == "0:30:00" != timeouts["default group"]


def _check_detail(res):
    assert res[0]["shape"][0] == "rank 0: ALLREDUCE [4] | rank 1: ALLREDUCE [5]"
    assert res[0]["order"][0] == "rank 0: BROADCAST [4] | rank 1: ALLREDUCE [4]"
    assert all(seconds < 2.0 for _, seconds in res[0].values())


def test_detail_names_both_ranks_fast(pool):  # dist.set_debug_level inside detail_mismatch
    _check_detail(pool.run(culprit.detail_mismatch))


def test_detail_from_the_environment(monkeypatch):  # TORCH_DISTRIBUTED_DEBUG=DETAIL at start
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    _check_detail(launch.run(culprit.detail_mismatch, 2, timeout=60, output="quiet"))


def test_simulator_names_deadlock_and_mismatch():
    with pytest.raises(sim.DeadlockError, match="rank 1 has already returned"):
        sim.run(culprit.sim_skip, 3)
    with pytest.raises(launch.WorkerError, match="rank 1's all_reduce has 5"):
        sim.run(culprit.sim_mismatch, 3)


def test_fix_gloo_dump_rebuilds_pg_config():
    raw = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
           "entries": [{"process_group": ("0", "default_pg")},
                       {"process_group": ("2", "undefined")}]}
    fixed = culprit.fix_gloo_dump(raw, 3)
    assert fixed["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
                                  "2": {"name": "2", "desc": "undefined", "ranks": "[0, 1, 2]"}}
    assert raw["pg_config"][""]["ranks"] == "[]"  # the input is left as it was


@pytest.mark.parametrize("kind, says, records", [
    ("missing", "missing ranks: {1}", [2, 1, 2]),
    ("type", "Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH", [2, 2, 2])])
def test_flight_recorder_on_gloo_finds_rank_1(pool, tmp_path, kind, says, records):
    outcome = pool.run(culprit.mismatch_and_dump, args=(str(tmp_path), kind))
    for r in (0, 2):
        assert "Timed out waiting 2000ms" in outcome[r]  # Gloo's own words name no rank
        assert "rank" not in outcome[r].lower()
    raw = culprit.analyze(str(tmp_path))
    assert raw.returncode != 0 and "KeyError" in raw.stdout  # the upstream defect
    dumps = []
    for r in range(3):
        with open(tmp_path / f"rank_{r}", "rb") as f:
            dumps.append(pickle.load(f))
    # Gloo recorded this group's collectives by default, numbered from 0 on every rank
    assert [len(d["entries"]) for d in dumps] == records
    assert all([e["record_id"] for e in d["entries"]] == list(range(len(d["entries"])))
               for d in dumps)
    culprit.fix_folder(str(tmp_path), 3)
    fixed = culprit.analyze(str(tmp_path))
    assert fixed.returncode == 0 and says in fixed.stdout


def test_launch_timeout_names_the_rank_still_running(pool):  # last: it stops the Pool's ranks
    before = _children() - set(pool.pids)
    with pytest.raises(launch.TimeoutError) as e:
        pool.run(culprit.sleeper, timeout=3)
    assert e.value.ranks == [1]
    assert _children() <= before  # the timeout reaped every rank
