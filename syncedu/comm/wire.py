"""The wire witness: bytes the loopback interface really carried around a call.

The ledger charges a built-in on real ranks by formula (Gloo hides its messages),
but ranks on one host talk over `lo`, whose byte counter anyone may read:
`measure(comm, lambda: comm.all_reduce(t))` on every rank gives a `WireReading`,
a witness that can disagree with the ledger. `rounds` times:

1. barrier, read the counter, barrier (nobody sends before the reading);
2. run the call, barrier (everyone has sent all its bytes), read again;
3. the same three barriers with no call, for the baseline they cost.

The quietest round is kept (other programs' bytes only add); readings include
TCP/IP headers (about 0.1% at loopback's 64 KiB MTU).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

SYS_COUNTER = Path("/sys/class/net/lo/statistics/tx_bytes")
PROC_NET_DEV = Path("/proc/net/dev")


@dataclass(frozen=True)
class WireReading:
    """Bytes `lo` carried: `bytes` around the call (quietest round), `baseline` without it."""

    bytes: int
    baseline: int
    rounds: int

    @property
    def payload(self) -> int:
        """`bytes` less the barriers' baseline (what the call itself added)."""
        return self.bytes - self.baseline


def available() -> bool:
    """True if this machine exposes a loopback byte counter."""
    return loopback_tx_bytes() is not None


def loopback_tx_bytes() -> int | None:
    """Bytes sent through `lo` since boot, or None where there is no such counter."""
    with contextlib.suppress(OSError, ValueError):
        return int(SYS_COUNTER.read_text())
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in PROC_NET_DEV.read_text().splitlines():
            name, _, fields = line.partition(":")
            if name.strip() == "lo":
                return int(fields.split()[8])  # receive: 8 fields, then transmit bytes
    return None


def measure(comm, call, rounds: int = 5) -> WireReading:
    """What `lo` carried around `call()`; every real rank calls it with the same `rounds`."""
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be an int >= 1")
    if not callable(call):
        raise TypeError(f"call must be a function of no arguments, got {type(call).__name__}")
    if comm.backend == "sim":
        raise ValueError("wire.measure reads the loopback interface: it needs real ranks "
                         "(launch.run), not simulated ones")
    if not available():
        raise RuntimeError(f"no loopback byte counter here ({SYS_COUNTER} and the lo line of "
                           f"{PROC_NET_DEV} are both missing)")
    with_call = [_round(comm, call) for _ in range(rounds)]  # Steps 1-2
    without = [_round(comm, None) for _ in range(rounds)]  # Step 3
    return WireReading(min(with_call), min(without), rounds)


def _round(comm, call) -> int:
    comm.barrier()
    before = loopback_tx_bytes()
    comm.barrier()
    if call is not None:
        call()
    comm.barrier()
    return loopback_tx_bytes() - before
