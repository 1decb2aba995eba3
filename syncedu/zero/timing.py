"""Lesson 10's time runs: our ZeRO on simulated ranks, beside the alpha-beta model.

The model is `dp.timeline.zero_step_time` (the course's one file of step-time models).
`simulate_step` runs our ZeRO (or "flat" DP, stage 0) through `train.run` on simulated
ranks. Lesson 10 shows where the two part: the model cuts every layer N ways, our flat
shards may put a whole layer on one rank; and the model makes every rank wait out every
collective, which the simulated ranks do not.
"""

from __future__ import annotations

from syncedu.train import harness


def simulate_step(stage: int, world_size: int, *, network, depth: int = 4,
                  forward_seconds: float = 1e-3, steps: int = 2) -> float:
    """Logical seconds of one step (the slowest rank's mean) of our ZeRO `stage` (0: "flat"
    DP) in `train.run` on simulated ranks: its MLP as `depth` equal Linear(64, 64) layers (64
    outputs for the 10 digits), each charging forward_seconds / depth after its forward and
    twice that in its backward (after stage 3's all-gather)."""
    history = harness.run("flat" if stage == 0 else f"zero{stage}", world_size, steps=steps,
                          global_batch=4 * world_size, lr=0.01, simulate=True, network=network,
                          model_kwargs={"hidden": 64, "classes": 64, "depth": depth - 1},
                          compute_seconds=3 * forward_seconds)
    return max(sum(seconds) for seconds in history.rank_step_seconds) / steps  # the slowest
