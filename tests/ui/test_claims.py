"""The claims table: each row checked once, in the lesson it names; shown in 00 and the README."""

import json
import pathlib
import re

import pytest

from syncedu.ui import claims

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sources(lesson: int) -> str:
    (nb,) = ROOT.glob(f"notebooks/{lesson:02d}_*.ipynb")
    cells = json.loads(nb.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


@pytest.mark.parametrize("claim", claims.CLAIMS, ids=lambda c: c.id)
def test_each_claim_is_checked_once_in_its_lesson(claim):
    pattern = rf"claims\.check\(\s*[\"']{claim.id}[\"']"
    calls = {n: len(re.findall(pattern, _sources(n))) for n in range(12)}
    where = f"lesson {claim.lesson:02d}"
    assert calls[claim.lesson] == 1, f"{claim.id}: {where} must call claims.check once: {calls}"
    assert sum(calls.values()) == 1, f"{claim.id} is checked outside {where}: {calls}"


def test_the_readme_shows_the_table():
    assert claims.table() in (ROOT / "README.md").read_text()


def test_lesson_00_shows_the_table():
    assert "claims.table()" in _sources(0)


def test_a_measurement_that_disagrees_fails_and_names_the_claim():
    with pytest.raises(AssertionError, match="claim A6"):
        claims.check("A6", False, "a gradient was sent")
    with pytest.raises(ValueError, match="claim_id"):
        claims.check("Z1", True, "")


def test_a_modeled_row_is_labelled_modeled(capsys):
    claims.check("A7", True, "40 of 100 cells", modeled=True)
    out = capsys.readouterr().out
    assert "Modeled: 40 of 100 cells" in out and "Measured" not in out


def test_a_bad_row_is_refused():
    with pytest.raises(ValueError, match="lesson"):
        claims.Claim("A99", "q", "t", "true", 12)
