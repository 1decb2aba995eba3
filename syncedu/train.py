"""Public face of `syncedu.lab.train`: seeded training runs with any gradient-sync strategy."""

from syncedu.lab.train import *  # noqa: F401,F403
from syncedu.lab.train import MISTAKES, STRATEGIES, History, TrainConfig, run  # noqa: F401
