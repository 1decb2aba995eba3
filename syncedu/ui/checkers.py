"""What every lesson's exercise checkers share: a checker prints a verdict and returns None;
its `.grade(answer)` returns True/False for tests. A stub that still raises
`NotImplementedError` is "not attempted yet", so notebooks run before anything is solved."""

from __future__ import annotations

import functools

from syncedu.comm import launch
from syncedu.comm.errors import DeadlockError


def checker(grade):
    """Turn `grade(answer) -> bool` into a notebook checker that prints and returns None."""
    @functools.wraps(grade)
    def check(*args, **kwargs) -> None:
        grade(*args, **kwargs)
    check.grade = grade
    return check


def verdict(name: str, ok: bool, detail: str = "") -> bool:
    """Print `name: correct` or `name: not yet right - detail`, and return `ok`."""
    mark = "correct" if ok else "not yet right"
    print(f"{name}: {mark}{' - ' + detail if detail else ''}")
    return ok


P2P_HINT = ("On Gloo and NCCL a send waits for its receive at any size: post isend and irecv "
            "together and wait for both, or let even ranks send first, odd ranks receive first")


def attempt(name: str, call, deadlock: str = P2P_HINT):
    """(True, `call()`), or (False, None) and a message if it is not answered yet, a rank
    raised (a send buffer changed before its wait, a send never waited on, ...) or the ranks
    deadlocked (a verdict naming who waits for what, then `deadlock`, not a traceback)."""
    try:
        return True, call()
    except DeadlockError as e:
        waits = "; ".join(line.strip() for line in str(e).splitlines()[1:3])
        verdict(name, False, f"the ranks deadlock ({waits}). {deadlock}")
    except (NotImplementedError, launch.WorkerError) as e:
        if isinstance(e, launch.WorkerError) and "NotImplementedError" not in str(e):
            verdict(name, False, f"rank {e.rank} raised: {str(e).splitlines()[0]}")
        else:
            print(f"{name}: not attempted yet - write your answer and re-run this cell")
    return False, None


def number(name: str, answer):
    """(ok, value) of a quick check's answer: a number, or a function returning one."""
    ok, got = attempt(name, answer if callable(answer) else lambda: answer)
    if ok and got is None:
        print(f"{name}: not attempted yet - write your answer and re-run this cell")
        return False, None
    if ok and (isinstance(got, bool) or not isinstance(got, (int, float))):
        verdict(name, False, f"answer with a number, got {got!r}")
        return False, None
    return ok, got
