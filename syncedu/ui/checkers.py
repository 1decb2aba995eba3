"""What every lesson's exercise checkers share: a checker prints a verdict and returns None;
its `.grade(answer)` returns True/False for tests. A stub that still raises
`NotImplementedError` is "not attempted yet", so notebooks run before anything is solved."""

from __future__ import annotations

import functools

from syncedu.comm import launch
from syncedu.comm.errors import DeadlockError


class _Unanswered(Exception):
    """Raised by `answered`, `answered_number`, `refuse` and `not_attempted` once they have
    printed why the grading ends; `checker` turns it into the verdict False, so a checker
    needs no `if not ok` after each."""


def checker(grade):
    """Turn `grade(answer) -> bool` into a notebook checker that prints and returns None;
    `.grade` returns the bool (False where `answered`, `answered_number`, `refuse` or
    `not_attempted` ended the grading)."""
    @functools.wraps(grade)
    def graded(*args, **kwargs) -> bool:
        try:
            return grade(*args, **kwargs)
        except _Unanswered:
            return False

    @functools.wraps(grade)
    def check(*args, **kwargs) -> None:
        graded(*args, **kwargs)
    check.grade = graded
    return check


def verdict(name: str, ok: bool, detail: str = "") -> bool:
    """Print `name: correct` or `name: not yet right - detail`, and return `ok`."""
    mark = "correct" if ok else "not yet right"
    print(f"{name}: {mark}{' - ' + detail if detail else ''}")
    return ok


def refuse(name: str, detail: str):
    """Inside a `checker`: print `name: not yet right - detail` and end the grading (False)."""
    verdict(name, False, detail)
    raise _Unanswered(name)


def not_attempted(name: str):
    """Inside a `checker`: print that `name` is not attempted yet and end the grading (False)."""
    print(f"{name}: not attempted yet - write your answer and re-run this cell")
    raise _Unanswered(name)


P2P_HINT = ("On Gloo and NCCL a send waits for its receive at any size: post isend and irecv "
            "together and wait for both, or let even ranks send first, odd ranks receive first")


def answered(name: str, call, deadlock: str = P2P_HINT):
    """`call()`'s value, for use inside a `checker`; if it is not answered yet, a rank raised
    (a send buffer changed before its wait, a send never waited on, ...) or the ranks
    deadlocked, print a message (a verdict naming who waits for what, then `deadlock`, not a
    traceback) and end the grading with False."""
    try:
        return call()
    except DeadlockError as e:
        waits = "; ".join(line.strip() for line in str(e).splitlines()[1:3])
        refuse(name, f"the ranks deadlock ({waits}). {deadlock}")
    except (NotImplementedError, launch.WorkerError) as e:
        if isinstance(e, launch.WorkerError) and "NotImplementedError" not in str(e):
            refuse(name, f"rank {e.rank} raised: {str(e).splitlines()[0]}")
        not_attempted(name)


def answered_number(name: str, answer):
    """A quick check's answer (a number, or a function returning one), for use inside a
    `checker`; anything else is reported and ends the grading with False, as in `answered`."""
    got = answered(name, answer if callable(answer) else lambda: answer)
    if got is None:
        not_attempted(name)
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        refuse(name, f"answer with a number, got {got!r}")
    return got

