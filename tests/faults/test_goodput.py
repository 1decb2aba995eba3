"""The goodput model (syncedu/faults/goodput.py) against independent witnesses."""

from __future__ import annotations

import pytest

from syncedu.faults import goodput as g


def test_llama3_figures():
    assert g.LLAMA3["days"] * 24 / g.LLAMA3["interruptions"] == pytest.approx(3.093, abs=1e-3)
    assert g.llama3_gpu_mtbf_hours() == pytest.approx(50_677, abs=1)


def test_young_interval_minimizes_the_lost_share():
    job = g.Job(gpus=16_384)
    best = min(range(1, 20_000),  # every whole second
               key=lambda tau: g.restart_lost_share(job, float(tau)))  # brute force
    assert best == pytest.approx(g.young_interval(job.checkpoint, job.mtbf), rel=1e-3)


def test_daly_tends_to_young_for_cheap_checkpoints_and_caps_at_mtbf():
    assert g.daly_interval(1.0, 1e8) == pytest.approx(g.young_interval(1.0, 1e8), rel=1e-3)
    assert g.daly_interval(60.0, 11_000.0) < g.young_interval(60.0, 11_000.0)
    assert g.daly_interval(300.0, 100.0) == 100.0


def test_live_recovery_wins_at_scale_and_restart_collapses():
    small, big = g.Job(gpus=1024), g.Job(gpus=131_072, groups=64)
    assert g.goodput(small) / g.goodput(small, "live") > 0.95  # small jobs: little to gain
    assert g.goodput(big) < 0.3 * g.goodput(big, "live")
    assert g.goodput(g.Job(gpus=1_000_000, groups=64)) == 0.0  # restarts never finish
    assert g.Job(gpus=4, gpu_mtbf=3600.0, groups=2).mtbf == 900.0


@pytest.mark.parametrize("bad", [dict(gpus=0), dict(gpus=4, step=0), dict(gpus=4, restart=-1),
                                 dict(gpus=4, groups=8)])
def test_job_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        g.Job(**bad)


def test_goodput_rejects_unknown_mode():
    with pytest.raises(ValueError, match="how="):
        g.goodput(g.Job(gpus=8), "magic")


def test_monte_carlo_agrees_with_the_formula_where_failures_are_rare():
    """The timeline with exponential failures is the formula's witness: close at 1,024 GPUs,
    below it at 131,072, where the formula charges R + tau/2 to failures during restarts."""
    small, big = g.Job(gpus=1024), g.Job(gpus=131_072)
    for seed in (0, 1, 2):
        assert abs(g.simulated_restart_lost_share(small, seed=seed) / g.restart_lost_share(small) - 1) < 0.1
        assert g.simulated_restart_lost_share(big, seed=seed) < 0.85 * g.restart_lost_share(big)
    # no failures to speak of: only the checkpoints are lost
    calm = g.Job(gpus=1, groups=1, gpu_mtbf=1e12)
    assert abs(g.simulated_restart_lost_share(calm, 600.0, failures=50) - 60 / 660) < 1e-3


def test_live_recovery_pays_its_rare_checkpoints():
    job = g.Job(gpus=1, groups=1, gpu_mtbf=1e15)  # failures never come: only the hourly checkpoint is lost
    assert abs(g.live_lost_share(job) - job.checkpoint / job.live_checkpoint) < 1e-6
