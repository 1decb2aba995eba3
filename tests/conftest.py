"""Suite-wide set-up: a headless matplotlib in this process, GPU tests skipped without
CUDA, and every test started from the same global RNG seed."""

from __future__ import annotations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")  # this pytest process only; notebook kernels keep their inline backend


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (a GPU machine); skipped on CPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global RNG state: no test passes or fails by the draw."""
    torch.manual_seed(0)
