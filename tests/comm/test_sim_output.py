"""What simulated ranks print is marked with their rank, like real ranks' lines."""

from __future__ import annotations

import sys

from syncedu import sim


def _talk(comm):
    print(f"hello {comm.rank}")
    print("a", end="")
    print("b")
    return comm.rank


def test_lines_are_marked_and_ordered(capsys):
    sim.run(_talk, 3, output="ordered")
    assert capsys.readouterr().out.splitlines() == [
        "[rank 0] hello 0", "[rank 0] ab", "[rank 1] hello 1", "[rank 1] ab",
        "[rank 2] hello 2", "[rank 2] ab"]


def test_quiet_drops_and_stdout_is_restored(capsys):
    before = sys.stdout
    assert list(sim.run(_talk, 2, output="quiet")) == [0, 1]
    assert capsys.readouterr().out == "" and sys.stdout is before


def test_live_is_repeatable(capsys):
    sim.run(_talk, 4)
    first = capsys.readouterr().out
    sim.run(_talk, 4)
    assert capsys.readouterr().out == first and first.count("[rank 3]") == 2
