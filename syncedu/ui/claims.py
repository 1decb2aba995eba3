"""What the two source articles claim, and what the course measured.

Article A, "分布式训练中的数据同步策略优化", and article B, "pytorch分布式部署數據怎樣同步"
(in Chinese, in the project's `shared/seeds/`): each technical claim is a row of `CLAIMS`
(its text in `claims.json`, beside this module), checked by one cell of the lesson it names with `check(id, holds, measured)`, so a verdict
that stops being true fails that notebook under nbval.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Claim:
    """One claim of the articles: its `id` (A<n> or B<n>: article A or B), the `quote`, its
    English `translation`, our `verdict`, and the `lesson` whose `claims.check` measures it.
    """
    id: str
    quote: str
    translation: str
    verdict: str
    lesson: int

    def __post_init__(self):
        if not (self.id[:1] in "AB" and self.id[1:].isdigit()):
            raise ValueError(f"id must be 'A<n>' or 'B<n>' (article A or B), got {self.id!r}")
        if not 0 <= self.lesson <= 11:
            raise ValueError(f"lesson must be 0..11, got {self.lesson}")


# The rows are prose (quotes, translations, verdicts), so they live in a data file beside this
# module, one object per claim with the fields of `Claim`; a verdict is edited there.
CLAIMS: tuple[Claim, ...] = tuple(
    Claim(**row) for row in json.loads(Path(__file__).with_name("claims.json").read_text("utf-8")))


def check(claim_id: str, holds: bool, measured: str, *, modeled: bool = False) -> None:
    """Assert that a lesson's measurement (`holds`: the cell's own comparison, `measured`:
    its numbers) still supports a claim's verdict, and print it; `modeled=True` labels the
    numbers "Modeled:" (a model's output, not a measurement)."""
    by_id = {c.id: c for c in CLAIMS}
    if claim_id not in by_id:
        raise ValueError(f"claim_id must be one of {sorted(by_id)}, got {claim_id!r}")
    c = by_id[claim_id]
    if not holds:
        raise AssertionError(f"claim {claim_id}: the measurement ({measured}) no longer "
                             f"supports the verdict '{c.verdict}': fix the verdict or the lesson")
    word = "Modeled" if modeled else "Measured"
    print(f"claim {claim_id}, \"{c.translation}\": {c.verdict.split(':')[0]}. {word}: {measured}")


def table() -> str:
    """The claims as a Markdown table (lesson 00 and the README show it)."""
    rows = ["| | the article says | verdict | measured in |", "|---|---|---|---|"]
    for c in CLAIMS:
        said = f"{c.quote}<br>*{c.translation}*"
        rows.append(f"| {c.id} | {said} | {c.verdict} | lesson {c.lesson:02d} |")
    return "\n".join(rows)
