"""What every lesson's exercise checkers share (each topic's own are in its `exercisesNN.py`).

A checker prints a verdict and returns None (a cell shows only the verdict); its
`.grade(answer)` returns True/False for tests. An answer that still raises
`NotImplementedError` (the notebook's stub) is "not attempted yet", not a failure, so
the notebooks run top to bottom before anyone has solved anything.
"""

from __future__ import annotations

import functools

from syncedu.comm import launch


def checker(grade):
    """Turn `grade(answer) -> bool` into a notebook checker that prints and returns None."""
    @functools.wraps(grade)
    def check(*args, **kwargs) -> None:
        grade(*args, **kwargs)
    check.grade = grade
    return check


def verdict(name: str, ok: bool, detail: str = "") -> bool:
    mark = "correct" if ok else "not yet right"
    print(f"{name}: {mark}{' - ' + detail if detail else ''}")
    return ok


def attempt(name: str, call):
    """(True, `call()`), or (False, None) and a message if it is not answered yet or a rank
    raised."""
    try:
        return True, call()
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
