"""One pool of 4 real ranks for lesson 12's real-rank tests (started once)."""

import pytest

from syncedu import launch


@pytest.fixture(scope="package")
def pool4():
    with launch.Pool(4, output="quiet", timeout=120) as pool:
        yield pool
