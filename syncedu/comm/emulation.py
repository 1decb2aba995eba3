"""Network emulation on real processes: each rank delays its own traffic (no root, no `tc`).

1. Point-to-point: one send port per rank, as in the simulator; a message holds it latency
   + n / bandwidth (+ jitter and loss) and is handed to torch then by a sender thread per
   peer. Not emulated: receive ports and NIC sharing.
2. Collectives: torch's built-in, then a wait until `alphabeta.collective_time` has passed
   since the rank's link was free: collectives in flight together queue on it, one after
   another in the order they are waited for (as buckets on one NIC, and as the simulator's
   ports make them). Not emulated: p2p sends and collectives sharing that link.
3. Compute: `comm.compute(seconds)` sleeps seconds x the rank's slowdown (base.Comm).
"""

from __future__ import annotations

import queue
import threading
import time

from . import alphabeta
from .network import Network
from .work import ThreadWork, Work


class Emulator:
    """Delays one rank's messages and collectives as `network` says."""

    def __init__(self, network: Network, rank: int, world_size: int):
        self.network = network
        self.rank = rank
        self.world_size = world_size
        self._rng = network.rng(rank)
        self._links: dict[int, queue.Queue] = {}
        self._free_at = 0.0  # when the send port is free again
        self._ring_free_at = 0.0  # when the link is free of collectives again (step 2)
        self._lock = threading.Lock()

    def isend(self, start, tensor, dst: int) -> Work:
        """Queue a send to `dst` on the send port; `start()` hands it to torch when due."""
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            depart = max(time.perf_counter(), self._free_at)
            link = self.network.link(self.rank, dst)
            due = depart + link.transfer_time(nbytes) + self.network.noise(self._rng)
            self._free_at = due
            handle = ThreadWork("emulated send")
            self._link(dst).put((due, start, handle))
        return handle

    def _link(self, dst: int) -> queue.Queue:
        if dst not in self._links:
            q: queue.Queue = queue.Queue()
            threading.Thread(target=self._pump, args=(q,), daemon=True,
                             name=f"syncedu-link-{self.rank}-{dst}").start()
            self._links[dst] = q
        return self._links[dst]

    @staticmethod
    def _pump(q: queue.Queue) -> None:
        while True:
            due, start, handle = q.get()
            try:
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                start().wait()
            except BaseException as e:  # surfaced to the caller's wait()
                handle.finish(e)
            else:
                handle.finish()

    def hold(self, kind: str, nbytes: int, t0: float) -> None:
        """Wait until a collective started at `t0` has had its modeled time on the link."""
        steps = 2 * (self.world_size - 1)
        noise = sum(self.network.noise(self._rng) for _ in range(steps)) if steps else 0.0
        with self._lock:
            due = max(t0, self._ring_free_at) + noise + alphabeta.collective_time(
                kind, nbytes, self.world_size, self.network)
            self._ring_free_at = due
        left = due - time.perf_counter()
        if left > 0:
            time.sleep(left)
