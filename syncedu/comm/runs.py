"""What `launch` and `sim` runs share: `RunResult` and argument checks (`ValueError`s alike).

The `check_*` validators every public entry of the package uses live here, beside the
engine's own checks: each returns the value it accepts or raises a `ValueError` that names
the parameter and what is allowed."""

from __future__ import annotations

from .ledger import Ledger
from .network import Network
from .rank_output import OUTPUT_MODES
from .trace import Trace


class RunResult(list):
    """Per-rank return values in rank order (`res[r]`), plus `.ledger`, `.trace` and
    `.seconds` (wall-clock of the slowest rank on real ranks, logical on simulated ones)."""

    def __init__(self, values, ledger: Ledger, seconds: float, trace: Trace | None = None):
        super().__init__(values)
        self.ledger = ledger
        self.seconds = float(seconds)
        self.trace = trace if trace is not None else Trace()

    @property
    def world_size(self) -> int:
        """How many ranks ran (one value each)."""
        return len(self)


def check_call(fn, args, kwargs) -> None:
    """`fn(comm, *args, **kwargs)` must be callable with a tuple and a dict."""
    if not callable(fn):
        raise ValueError(f"fn must be callable as fn(comm, *args, **kwargs), got {fn!r}")
    if not isinstance(args, (tuple, list)):
        raise ValueError(f"args must be a tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")


def check_ranks(world_size, limit: int, network, timeout, output, hint: str = "") -> None:
    """What every run checks: world size (1..`limit`), network (None, or a `Network` with one
    `slowdown` factor per rank, if any), timeout and output mode."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) \
            or not 1 <= world_size <= limit:
        raise ValueError(f"world_size={world_size!r} must be an int in 1..{limit}{hint}")
    if network is not None and not isinstance(network, Network):
        raise ValueError(f"network must be a syncedu.Network or None, got {network!r}")
    if network is not None:
        network.check_world_size(world_size)
    check_timeout(timeout)
    check_choice("output", output, OUTPUT_MODES)


def check_timeout(timeout) -> None:
    """`timeout` must be None (wait forever: the caller's choice) or seconds > 0."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be a number of seconds > 0 (or None)")


def check_progress(progress) -> None:
    """`progress` must be None/False (no bar), True (a tqdm bar) or have `.update(n)`."""
    if not (progress is None or isinstance(progress, bool)
            or callable(getattr(progress, "update", None))):
        raise ValueError(f"progress={progress!r} must be None or False (no bar), True (a tqdm "
                         "bar of messages) or an object with .update(n), such as a tqdm bar")


def check_int(name: str, value, low: int = 1) -> int:
    """`value`, or a ValueError naming `name` unless it is an int >= `low`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name}={value!r} must be an int >= {low}")
    return value


def check_number(name: str, value, low: float = 0) -> float:
    """`value`, or a ValueError naming `name` unless it is a real number (not a bool) >= `low`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
        raise ValueError(f"{name}={value!r} must be a number >= {low}")
    return value


def check_bool(name: str, value) -> bool:
    """`value`, or a ValueError naming `name` unless it is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
    return value


def check_choice(name: str, value, allowed):
    """`value`, or a ValueError naming `name` unless it is one of `allowed` (as shown)."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is unknown; choose one of {allowed}")
    return value
