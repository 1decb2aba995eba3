"""One warm pair of ranks for every real-rank test of this topic (starting ranks costs seconds)."""

import pytest

from syncedu import launch


@pytest.fixture(scope="package")  # not session: its ranks must be gone before other folders run
def pool():
    with launch.Pool(2, output="quiet") as p:
        yield p
