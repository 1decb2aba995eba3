"""Step 2 of a simulated message: the links and the clocks (ports, NICs, latency model).

A message leaves when its sender's port is free and holds it latency + n / bandwidth
("port": Hockney 1994; Thakur, Rabenseifner & Gropp 2005) or n / bandwidth ("wire":
LogGP), plus seeded jitter and loss; it comes in at the receiver's port at the first
free slot from its start (and books both nodes' NICs between nodes). Each side is
booked by its own rank in program order, so the scheduler's order never matters.
"""

from __future__ import annotations

from bisect import bisect_right


class Message:
    """One message in flight: a private copy of the data and its timing."""

    __slots__ = ("data", "src", "chan", "start", "dur", "what", "nbytes", "left", "rdv")

    def __init__(self, data, src: int, chan, start: float, dur: float, what: str,
                 nbytes: int, left: float, rdv):
        self.data, self.src, self.chan, self.what, self.nbytes = data, src, chan, what, nbytes
        self.start = start  # from when it may come in at the receiver's port (and NIC)
        self.dur = dur  # how long it holds that port: latency + bytes / bandwidth (+ noise)
        self.left = left  # when it left the sender (the trace's start)
        self.rdv = rdv  # a rendezvous send's handle, told when a receive matches it


class RecvPort:
    """A port (a rank's receive side, or a NIC): sorted, disjoint busy intervals, first-fit
    (so a message that left early but is waited for late still comes in early, in a gap)."""

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts: list[float] = []
        self.ends: list[float] = []

    def reserve(self, earliest: float, dur: float) -> float:
        """Book `dur` seconds at the first free slot from `earliest`; return its start."""
        if dur <= 0:
            return earliest
        starts, ends = self.starts, self.ends
        if not ends or ends[-1] < earliest:  # the common cases: nothing booked after...
            starts.append(earliest)
            ends.append(earliest + dur)
            return earliest
        if ends[-1] == earliest:  # ... or right up to it: one longer interval
            ends[-1] = earliest + dur
            return earliest
        i = bisect_right(ends, earliest)  # busy intervals before i end in time
        t = earliest
        while i < len(starts) and starts[i] < t + dur:
            t = max(t, ends[i])
            i += 1
        self._insert(i, t, t + dur)
        return t

    def busy_until(self) -> float:
        """Logical time the port's last booked transfer ends (-inf: never used)."""
        return self.ends[-1] if self.ends else float("-inf")

    def append(self, t: float, end: float) -> None:
        """Book [t, end), known to start at or after every interval booked so far."""
        self._insert(len(self.starts), t, end)

    def _insert(self, i: int, t: float, end: float) -> None:
        starts, ends = self.starts, self.ends
        left = i > 0 and ends[i - 1] == t
        right = i < len(starts) and starts[i] == end
        if left and right:  # the new interval closes a gap: merge three into one
            ends[i - 1] = ends.pop(i)
            starts.pop(i)
        elif left:
            ends[i - 1] = end
        elif right:
            starts[i] = t
        else:
            starts.insert(i, t)
            ends.insert(i, end)


class Clock:
    """One rank's logical clock, send port and receive port (and its noise stream)."""

    __slots__ = ("now", "send_free", "port", "rng")

    def __init__(self, rng=None):
        self.now = 0.0
        self.send_free = 0.0
        self.port = RecvPort()
        self.rng = rng

    def advance(self, t: float) -> None:
        """Move this rank's logical clock forward to `t` (never back)."""
        if t > self.now:
            self.now = t


class Wires:
    """The time model of one run: every rank's `Clock` and, on a cluster, the NICs."""

    def __init__(self, network, world_size: int):
        self.net = network
        det = network.deterministic
        self.clocks = [Clock(None if det else network.rng(r)) for r in range(world_size)]
        self.cluster = network.is_cluster
        self.wire = network.latency_model == "wire"
        self.left = 0.0  # the last message's departure (depart)
        # Each rank's node and its NICs' ports, looked up once: millions of messages ask.
        self.node = [network.node_of(r) for r in range(world_size)]
        self.nics: dict[tuple, RecvPort] = {}  # (node, nic, "out" | "in") -> port
        self.nic_out = [self._nic(r, "out") for r in range(world_size)] if self.cluster else []
        self.nic_in = [self._nic(r, "in") for r in range(world_size)] if self.cluster else []

    def depart(self, src: int, dst: int, nbytes: int) -> tuple[float, float, float]:
        """Book the sender's port (and NIC); return (start, dur, send end) of the message at
        the receiver ("wire": latency later, n / B long); its departure goes in `self.left`."""
        c, net = self.clocks[src], self.net
        start = c.send_free if c.send_free > c.now else c.now
        across = self.cluster and self.node[src] != self.node[dst]
        link = (net.inter if across else net.intra) if self.cluster else net
        xfer = nbytes / link.bandwidth
        if across:  # the bytes queue at the node's NIC
            start = self.nic_out[src].reserve(start, xfer)
        self.left = start  # when it leaves (the trace's start; one rank runs at a time)
        if self.wire:  # latency (+ noise) is in flight, not on the port
            delay = link.latency + net.noise(c.rng) if c.rng is not None else link.latency
            c.send_free = start + xfer
            return start + delay, xfer, c.send_free
        dur = link.latency + xfer + net.noise(c.rng) if c.rng is not None else link.latency + xfer
        end = c.send_free = start + dur
        return start, dur, end

    def arrive(self, dst: int, src: int, start: float, dur: float, nbytes: int) -> float:
        """Book the receiver's port (and NIC) from `start`; return the arrival."""
        t = start
        if self.cluster and self.node[src] != self.node[dst]:
            t = self.nic_in[dst].reserve(start, nbytes / self.net.inter.bandwidth)
        return self.clocks[dst].port.reserve(t, dur) + dur

    def _nic(self, rank: int, way: str) -> RecvPort:
        return self.nics.setdefault((self.node[rank], self.net.nic_of(rank), way), RecvPort())
