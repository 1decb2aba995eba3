"""Finding the culprit on real ranks: every tool names rank 1 (syncedu/faults)."""

from __future__ import annotations

import pickle

import psutil
import pytest

from syncedu import launch, sim
from syncedu.faults import culprit, flight

pytestmark = pytest.mark.timeout(300)


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


def test_monitored_barrier_names_rank_1_and_new_group_timeout_trap():
    before = _children()
    res = launch.run(culprit.monitored_barrier, 3, timeout=60, output="quiet")
    assert "Rank 1 failed to pass monitoredBarrier" in res[0]
    timeouts = launch.run(culprit.group_timeouts, 2, timeout=60, output="quiet")[0]
    assert timeouts["new_group()"] == "0:30:00" != timeouts["default group"]
    assert _children() <= before


@pytest.mark.parametrize("env", [False, True])
def test_detail_names_both_ranks_fast(env):
    if env:  # TORCH_DISTRIBUTED_DEBUG=DETAIL from the start
        with culprit.debug_detail():
            res = launch.run(culprit.detail_mismatch, 2, timeout=60, output="quiet")
    else:  # dist.set_debug_level inside detail_mismatch alone
        res = launch.run(culprit.detail_mismatch, 2, timeout=60, output="quiet")
    assert res[0]["shape"][0] == "rank 0: ALLREDUCE [4] | rank 1: ALLREDUCE [5]"
    assert res[0]["order"][0] == "rank 0: BROADCAST [4] | rank 1: ALLREDUCE [4]"
    assert all(seconds < 2.0 for _, seconds in res[0].values())


def test_launch_timeout_names_the_rank_still_running():
    with pytest.raises(launch.TimeoutError) as e:
        launch.run(culprit.sleeper, 3, timeout=3, output="quiet")
    assert e.value.ranks == [1]


def test_simulator_names_deadlock_and_mismatch():
    with pytest.raises(sim.DeadlockError, match="rank 1 has already returned"):
        sim.run(culprit.sim_skip, 3)
    with pytest.raises(launch.WorkerError, match="rank 1's all_reduce has 5"):
        sim.run(culprit.sim_mismatch, 3)


def test_fix_gloo_dump_rebuilds_pg_config():
    raw = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
           "entries": [{"process_group": ("0", "default_pg")},
                       {"process_group": ("2", "undefined")}]}
    fixed = flight.fix_gloo_dump(raw, 3)
    assert fixed["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
                                  "2": {"name": "2", "desc": "undefined", "ranks": "[0, 1, 2]"}}
    assert raw["pg_config"][""]["ranks"] == "[]"  # the input is left as it was


@pytest.mark.parametrize("kind, world, says", [("missing", 3, "missing ranks: {1}"),
                                               ("type", 2, "COLLECTIVE_TYPE_MISMATCH")])
def test_flight_recorder_on_gloo_finds_rank_1(tmp_path, kind, world, says):
    outcome = launch.run(flight.mismatch_and_dump, world, args=(str(tmp_path), kind),
                         timeout=60, output="quiet")
    assert "Timed out waiting 2000ms" in outcome[0]  # Gloo's own words name no rank
    assert "rank 1" not in outcome[0].lower()
    raw = flight.analyze(str(tmp_path))
    assert raw.returncode != 0 and "KeyError" in raw.stdout  # the upstream defect
    flight.fix_folder(str(tmp_path), world)
    fixed = flight.analyze(str(tmp_path))
    assert fixed.returncode == 0 and says in fixed.stdout
    with open(tmp_path / "rank_0", "rb") as f:
        assert pickle.load(f)["entries"]  # Gloo recorded the collectives by default
