"""One pool of 2 real ranks for every real-rank test of lesson 10 (started once, not per file)."""

import pytest

from syncedu import launch


@pytest.fixture(scope="package")
def pool2():
    with launch.Pool(2, output="quiet", timeout=120) as pool:
        yield pool
