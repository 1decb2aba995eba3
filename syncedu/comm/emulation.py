"""Network emulation on real processes: wait as the `Network` model says.

No root, no `tc`: each rank delays its own traffic.

1. Point-to-point: as in the simulator (sim.py), each rank has one send port.
   A message leaves when the port is free, holds it for
   d = latency + n / bandwidth (+ seeded jitter and loss), and is handed to
   torch.distributed at departure + d by a sender thread per peer, so messages
   out of one rank take turns, as on one NIC. (The receive port is not
   emulated: a rank receiving from several peers at once gets them sooner
   than the simulator would say.)
2. Collectives: the rank runs torch's built-in, then waits until the time a ring
   would take on the modeled network has passed (`ring_seconds`).
3. Compute: `comm.compute(seconds)` sleeps seconds times the rank's slowdown
   (in base.Comm).

Used in: notebooks/00_start_here, 04_parameter_server, 09_tuning_playbook.
"""

from __future__ import annotations

import math
import queue
import threading
import time

from .base import ThreadWork, Work
from .network import Network


def ring_seconds(kind: str, nbytes: int, world_size: int, network: Network) -> float:
    """Modeled time of a built-in collective of `nbytes` done as a ring (or chain)."""
    n, a, bw = world_size, network.latency, network.bandwidth
    if n == 1:
        return 0.0
    chunk = -(-nbytes // n)  # the largest ring chunk
    if kind == "all_reduce":
        return 2 * (n - 1) * (a + chunk / bw)
    if kind in ("reduce_scatter", "all_gather"):
        return (n - 1) * (a + chunk / bw)
    if kind in ("broadcast", "reduce"):
        return (n - 1) * (a + nbytes / bw)
    if kind == "barrier":  # dissemination: ceil(log2 N) rounds of empty messages
        return math.ceil(math.log2(n)) * a
    raise ValueError(f"kind={kind!r} is not a known collective")


class Emulator:
    """Delays one rank's messages and collectives as `network` says."""

    def __init__(self, network: Network, rank: int, world_size: int):
        self.network = network
        self.rank = rank
        self.world_size = world_size
        self._rng = network.rng(rank)
        self._links: dict[int, queue.Queue] = {}
        self._free_at = 0.0  # when the send port is free again
        self._lock = threading.Lock()

    def isend(self, start, tensor, dst: int) -> Work:
        """Queue a send to `dst` on the send port; `start()` hands it to torch when due."""
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            depart = max(time.perf_counter(), self._free_at)
            due = depart + self.network.transfer_time(nbytes) + self.network.noise(self._rng)
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

    def collective(self, kind: str, nbytes: int, call) -> None:
        """Run `call()`, then wait out the rest of the modeled ring time."""
        t0 = time.perf_counter()
        call()
        steps = 2 * (self.world_size - 1)
        noise = sum(self.network.noise(self._rng) for _ in range(steps)) if steps else 0.0
        left = t0 + ring_seconds(kind, nbytes, self.world_size, self.network) + noise
        left -= time.perf_counter()
        if left > 0:
            time.sleep(left)
