"""The committed notebooks are executed and carry no volatile metadata.

nbval compares stored outputs, so every code cell must have been run (an
execution count); nbconvert's per-cell timestamps change on every run and only
make diffs noisy (STYLE: committed notebooks hold what the lesson shows).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_executed_without_timestamps(path):
    cells = json.loads(path.read_text())["cells"]
    code = [(i, c) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    unrun = [i for i, c in code if c.get("execution_count") is None]
    stamped = [i for i, c in enumerate(cells) if "execution" in c.get("metadata", {})]
    assert not unrun, f"{path.name}: code cells {unrun} were never run (execute the notebook)"
    assert not stamped, (f"{path.name}: cells {stamped} carry nbconvert's timestamps "
                         "(metadata.execution); strip them before committing")


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 11
