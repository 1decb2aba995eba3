"""The ledger: who sent how many payload bytes and messages, per rank and per op.

Every `Comm` keeps a `RankLedger`, merged at the end of a run into `res.ledger`:
`sent[r]`, `received[r]`, `ops["all_reduce"].sent[r]`, and the same split as
`.counted` (messages the engine moved) and `.modeled` (built-ins on real ranks,
charged by formula as a ring would send them: Gloo and NCCL hide their messages;
wire.py measures what they put on the loopback wire, a witness that can disagree).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def ring_chunks(numel: int, world_size: int) -> list[int]:
    """The rings' split of `numel` into `world_size` chunks, the first `numel % world_size`
    one larger (so the ledger's charge and the algorithms agree)."""
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


def ring_allreduce_elements(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """Elements rank `rank` sends and receives in a ring allreduce (Patarasuk & Yuan 2009):
    every chunk but r, then every chunk but r + 1; it receives what r - 1 sends."""
    n = world_size
    base, extra = divmod(numel, n)  # chunk c has base + (c < extra) elements (ring_chunks)

    def sent_by(r: int) -> int:
        return 0 if n == 1 else 2 * (numel - base) - (r < extra) - ((r + 1) % n < extra)

    return sent_by(rank), sent_by((rank - 1) % n)


def ring_allreduce_charge(numel: int, element_size: int, world_size: int, rank: int) -> dict:
    """`RankLedger.record`'s bytes and messages of rank `rank` in one ring allreduce."""
    sent, received = ring_allreduce_elements(numel, world_size, rank)
    msgs = 2 * (world_size - 1)
    return dict(sent=sent * element_size, received=received * element_size, msgs_sent=msgs,
                msgs_received=msgs)


@dataclass
class OpCount:
    """Bytes and messages of one op (or of everything) on one rank."""

    sent: int = 0
    received: int = 0
    msgs_sent: int = 0
    msgs_received: int = 0
    calls: int = 0


KINDS = ("counted", "modeled")


def _add(ops: dict, op: str, sent: int, received: int, msgs_sent: int, msgs_received: int,
         calls: int) -> None:
    c = ops.setdefault(op, OpCount())
    c.sent += sent
    c.received += received
    c.msgs_sent += msgs_sent
    c.msgs_received += msgs_received
    c.calls += calls


@dataclass
class RankLedger:
    """One rank's calls: `ops` per op, `kinds[kind]` the same per kind (`kind`: the default)."""

    rank: int
    ops: dict[str, OpCount] = field(default_factory=dict)
    kind: str = "counted"
    kinds: dict[str, dict[str, OpCount]] = field(
        default_factory=lambda: {k: {} for k in KINDS})

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"RankLedger: kind={self.kind!r} must be one of {KINDS}")

    def record(self, op: str, sent: int = 0, received: int = 0,
               msgs_sent: int = 0, msgs_received: int = 0, calls: int = 1,
               kind: str | None = None) -> None:
        """Charge one call of `op`; `kind`: "counted", "modeled" or None (the default)."""
        kind = kind or self.kind
        if kind not in self.kinds:
            raise ValueError(f"record: kind={kind!r} must be one of {KINDS}")
        _add(self.ops, op, sent, received, msgs_sent, msgs_received, calls)
        _add(self.kinds[kind], op, sent, received, msgs_sent, msgs_received, calls)

    def merge(self, other: RankLedger, kinds: tuple[str, ...] = KINDS) -> None:
        """Add `other`'s entries (of `kinds`) to this ledger, each under its own kind."""
        for kind in kinds:
            for name, c in other.kinds[kind].items():
                self.record(name, c.sent, c.received, c.msgs_sent, c.msgs_received, c.calls,
                            kind=kind)

    def only(self, kind: str) -> RankLedger:
        """A ledger of this rank's `kind` entries alone."""
        out = RankLedger(self.rank, kind=kind)
        out.merge(self, (kind,))
        return out

    def reset(self) -> None:
        """Forget every charge (a new run starts from zero bytes)."""
        self.ops.clear()
        for ops in self.kinds.values():
            ops.clear()

    @property
    def sent(self) -> int:
        """Payload bytes this rank sent, summed over its ops."""
        return sum(c.sent for c in self.ops.values())

    @property
    def received(self) -> int:
        """Payload bytes this rank received, summed over its ops."""
        return sum(c.received for c in self.ops.values())


@dataclass(frozen=True)
class OpLedger:
    """Per-rank lists for one op (or the total): index r is rank r."""

    sent: list[int]
    received: list[int]
    msgs_sent: list[int]
    msgs_received: list[int]
    calls: list[int]


class Ledger:
    """A run's merged ledger: per-rank lists `sent`, `received`, ...; `ops[name]`, `counted`
    and `modeled` the same for one op or kind."""

    def __init__(self, rank_ledgers: list[RankLedger], _names: list[str] | None = None):
        self.world_size = len(rank_ledgers)
        names = _names or sorted({op for rl in rank_ledgers for op in rl.ops})
        if _names is None:  # the total: split it (the same op names, zeros where none)
            self.counted = Ledger([rl.only("counted") for rl in rank_ledgers], names)
            self.modeled = Ledger([rl.only("modeled") for rl in rank_ledgers], names)
        self.ops: dict[str, OpLedger] = {name: self._collect(rank_ledgers, name) for name in names}
        self._total = self._collect(rank_ledgers, None)

    @staticmethod
    def _collect(rank_ledgers: list[RankLedger], name: str | None) -> OpLedger:
        def get(rl: RankLedger, attr: str) -> int:
            counts = rl.ops.values() if name is None else [rl.ops.get(name, OpCount())]
            return sum(getattr(c, attr) for c in counts)

        attrs = ("sent", "received", "msgs_sent", "msgs_received", "calls")
        return OpLedger(*[[get(rl, a) for rl in rank_ledgers] for a in attrs])

    sent = property(lambda self: self._total.sent)
    received = property(lambda self: self._total.received)
    msgs_sent = property(lambda self: self._total.msgs_sent)
    msgs_received = property(lambda self: self._total.msgs_received)

    def rows(self) -> list[tuple[str, int, int, int, int, int]]:
        """(op, rank, bytes sent, bytes received, messages sent, messages received)."""
        return [(name, r, op.sent[r], op.received[r], op.msgs_sent[r], op.msgs_received[r])
                for name, op in self.ops.items() for r in range(self.world_size)]

    def table(self) -> str:
        """A fixed-width text table: one row per (op, rank) plus a total per rank."""
        head = f"{'op':<16}{'rank':>5}{'sent B':>14}{'recv B':>14}{'msgs out':>10}{'msgs in':>9}"
        lines = [head, "-" * len(head)]
        for name, r, s, rcv, ms, mr in self.rows():
            lines.append(f"{name:<16}{r:>5}{s:>14,}{rcv:>14,}{ms:>10}{mr:>9}")
        for r in range(self.world_size):
            lines.append(f"{'total':<16}{r:>5}{self.sent[r]:>14,}{self.received[r]:>14,}"
                         f"{self.msgs_sent[r]:>10}{self.msgs_received[r]:>9}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Ledger(world_size={self.world_size}, sent={self.sent}, received={self.received})"

    def _repr_pretty_(self, p, cycle) -> None:  # IPython display
        p.text(self.table())
