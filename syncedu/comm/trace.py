"""`Trace`: one record per message a run moved, stored column-wise.

Every message on simulated ranks; the point-to-point ones on real ranks. A record
has `src`, `dst`, `nbytes`, `tag` (-1 for a built-in's), `op` (the ledger op),
`start` (left the sender), `end` (in at the receiver; real ranks: the send
completed) and `chunk` (-1 if none); `trace.src` (etc.) is a numpy column. Past
`limit` records, later ones are only counted (`dropped`; `complete` turns False).
"""

from __future__ import annotations

from collections import Counter, namedtuple

import numpy as np

FIELDS = ("src", "dst", "nbytes", "tag", "op", "start", "end", "chunk")
Record = namedtuple("Record", FIELDS)
LIMIT = 4_000_000  # records kept per trace
_DTYPES = (np.int64, np.int64, np.int64, np.int64, object, np.float64, np.float64, np.int64)


class Trace:
    """Every message of one run, column-wise (module docstring)."""

    def __init__(self, limit: int = LIMIT):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"Trace: limit={limit!r} must be an int >= 0 (records kept)")
        self._rows: list[tuple] = []  # one tuple per message, columns once read
        self._blocks: list[tuple[np.ndarray, ...]] = []  # earlier messages, as arrays
        self._cache: tuple[np.ndarray, ...] | None = None
        self.limit, self.dropped, self._room = limit, 0, limit

    @property
    def complete(self) -> bool:
        """False if messages were left out because the trace was full (`dropped` of them)."""
        return self.dropped == 0

    def add(self, src: int, dst: int, nbytes: int, tag: int, op: str, start: float,
            end: float, chunk: int = -1) -> None:
        """Record one message."""
        if self._room <= 0:
            self.dropped += 1
            return
        self._room -= 1
        self._rows.append((src, dst, nbytes, tag, op, start, end, chunk))
        self._cache = None

    def _keep(self, n: int) -> int:
        """How many of `n` new records fit; the rest are dropped."""
        self._flush()
        self._cache = None
        keep = min(n, max(self._room, 0))
        self.dropped += n - keep
        self._room -= keep
        return keep

    def add_block(self, src, dst, nbytes, tag: int, op: str, start, end, chunk) -> None:
        """Record many messages at once (array-likes of equal length; tag and op shared)."""
        keep = self._keep(int(np.size(src)))
        if keep == 0:
            return

        def col(a, dtype):
            return np.asarray(a, dtype=dtype).ravel()[:keep]

        # tag and op stay scalars until someone reads the columns (_columns)
        self._blocks.append((col(src, np.int64), col(dst, np.int64), col(nbytes, np.int64),
                             int(tag), str(op), col(start, np.float64), col(end, np.float64),
                             col(chunk, np.int64)))

    def extend(self, other: Trace) -> None:
        """Append every record of `other` (e.g. another rank's, on real ranks)."""
        if len(other):
            cols = other._columns()
            keep = self._keep(len(cols[0]))
            self._blocks.append(tuple(c[:keep] for c in cols))
        self.dropped += other.dropped

    def _flush(self) -> None:
        if self._rows:
            self._blocks.append(tuple(np.array(col, dtype=dt)
                                      for col, dt in zip(zip(*self._rows), _DTYPES)))
            self._rows.clear()

    @staticmethod
    def _full(block: tuple) -> tuple[np.ndarray, ...]:
        """A block with its shared tag and op spelled out per record."""
        if isinstance(block[4], np.ndarray):
            return block
        n = len(block[0])
        ops = np.empty(n, dtype=object)
        ops[:] = block[4]
        return block[:3] + (np.full(n, block[3], np.int64), ops) + block[5:]

    def _columns(self) -> tuple[np.ndarray, ...]:
        if self._cache is None:
            self._flush()
            self._blocks = [self._full(b) for b in self._blocks]
            if not self._blocks:
                self._cache = tuple(np.array([], dtype=dt) for dt in _DTYPES)
            elif len(self._blocks) == 1:
                self._cache = self._blocks[0]
            else:
                self._cache = tuple(np.concatenate(cols) for cols in zip(*self._blocks))
                self._blocks = [self._cache]
        return self._cache

    def __len__(self) -> int:
        return len(self._rows) + sum(len(b[0]) for b in self._blocks)

    def __iter__(self):
        cols = self._columns()
        for row in zip(*(c.tolist() for c in cols)):
            yield Record(*row)

    def __getitem__(self, i: int) -> Record:
        return Record(*(c[i].item() if hasattr(c[i], "item") else c[i]
                        for c in self._columns()))

    def __getattr__(self, name: str) -> np.ndarray:
        if name in FIELDS:
            return self._columns()[FIELDS.index(name)]
        raise AttributeError(f"Trace has no attribute {name!r}; columns are {FIELDS}")

    def __getstate__(self):  # (sent back from real ranks by pickle)
        return {"cols": self._columns(), "limit": self.limit, "dropped": self.dropped}

    def __setstate__(self, state) -> None:
        self.__init__(state["limit"])
        self._blocks = [state["cols"]]
        self._room -= len(state["cols"][0])
        self.dropped = state["dropped"]

    def __repr__(self) -> str:
        cut = "" if self.complete else f", {self.dropped} more dropped (limit {self.limit})"
        return f"Trace({len(self)} messages, ops {sorted(set(self.op.tolist()))}{cut})"

    def only(self, op: str | None = None, src: int | None = None,
             dst: int | None = None) -> Trace:
        """The records of one op (and/or one sender, one receiver), as a new Trace."""
        cols = self._columns()
        keep = np.ones(len(cols[0]), dtype=bool)
        for column, value in ((4, op), (0, src), (1, dst)):
            if value is not None:
                keep &= cols[column] == value
        out = Trace.__new__(Trace)
        out.__setstate__({"cols": tuple(c[keep] for c in cols), "limit": self.limit, "dropped": 0})
        return out

    def pairs(self) -> Counter:
        """Counter of (src, dst) -> number of messages."""
        return Counter(zip(self.src.tolist(), self.dst.tolist()))

    def neighbours_only(self, world_size: int) -> bool:
        """True if every message went to the next or previous rank of a ring of `world_size`."""
        step = (self.dst - self.src) % world_size
        return bool(((step == 1) | (step == world_size - 1)).all())

    def busiest_receiver(self) -> tuple[int, int]:
        """(rank, number of distinct senders) of the rank that hears from most ranks (a root
        hears from everybody, a ring's ranks from one or two)."""
        senders = Counter(d for _, d in set(zip(self.src.tolist(), self.dst.tolist())))
        rank = max(senders, key=lambda r: (senders[r], -r), default=-1)
        return rank, senders[rank]
