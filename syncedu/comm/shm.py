"""`ShmComm`: point-to-point through shared memory between the ranks of one machine.

Gloo on one host sends every byte through loopback TCP: a copy into the kernel, the TCP
stack, a copy out. NCCL inside a node never uses the network: its P2P and SHM transports
copy through GPU or host memory (NVIDIA/nccl src/transport/p2p.cc, shm.cc). This is the SHM
idea on CPU processes (`launch.run(..., backend="shm")`). Each ordered pair of ranks on one
node (src -> dst) owns a ring buffer of `CAPACITY` bytes in dst's segment, with two counters
on cache lines of their own: bytes `written` (only src moves it) and bytes `read` (only dst).

1. Set-up: rank r creates segment r (one slot per rank of its node), every rank maps the
   segments of its node, then each unlinks its own. From then on the memory lives exactly as
   long as the processes that map it: no name survives a normal end, a kill or a closed pool.
2. A message is a stream of pieces, a 16-byte header (size, tag) and the payload, that the
   sender copies into the ring at most `STEP` bytes at a time, advancing `written` after
   each copy; the receiver copies out what is there and advances `read`. Flow control: the
   sender is never more than `CAPACITY` bytes ahead, so a message of any size streams
   through; a header that disagrees with the receive (size, tag) raises, naming both.
3. Progress happens in `wait()`: waiting on any handle moves every send and receive of this
   rank forward (two ranks that both send before they receive do not deadlock); it spins,
   then sleeps, and past its timeout raises `TimeoutError` naming the peer.
4. The built-in collectives are exchanges over this point-to-point, every byte counted:
   reduce-scatter then all-gather for `all_reduce` (lesson 01's identity), each rank
   reducing its piece in rank order, so every rank holds the same bits for any `op`.

Ranks of other nodes (two `torchrun` agents) are reached over Gloo, as NCCL uses NET across
nodes; `comm.transport_bytes` counts what each transport carried. Counters are 8-byte aligned
words with one writer each; x86's store order (TSO) makes the data visible before the counter
that announces it (a weaker memory model would need fences). There is no any-source receive
(`recv_any`, the parameter server's): Gloo's would miss what came through shared memory.
"""

from __future__ import annotations

import os
import secrets
import struct
import tempfile
import threading
import time
from collections import deque
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from .base import REDUCE_FNS
from .ledger import ring_chunks
from .torch_comm import TorchComm
from .work import Work

CAPACITY = 4 << 20  # ring buffer bytes per ordered pair of ranks
STEP = 512 << 10  # bytes per copy before the counter moves: the receiver starts early
SLOT = 128 + CAPACITY  # `written` at byte 0, `read` at byte 64, then the ring
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
BUILTIN_TAG = 1 << 20  # tag of the built-ins' messages: never mixed up with a user's


class ShmWork(Work):
    """One message in flight: its pieces (header, payload) and how far they have been copied."""

    def __init__(self, comm: ShmComm, peer: int, sending: bool, pieces: list, expect=None):
        self.comm, self.peer, self.sending, self.pieces = comm, peer, sending, pieces
        self.expect, self.piece, self.pos, self.done = expect, 0, 0, False

    def wait(self, timeout: float | timedelta | None = None) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        self.comm._wait(self, self.comm.timeout if seconds is None else seconds)


class ShmComm(TorchComm):
    """A `TorchComm` whose point-to-point and built-ins between ranks of one node go through
    shared memory (module docstring). `prefix`: the segments' file name (None: rank 0 draws
    one); `timeout`: seconds a `wait()` without its own timeout may take."""

    counts_builtins = True  # every built-in's messages are counted, not modeled

    def __init__(self, group=None, *, prefix: str | None = None, timeout: float = 300.0,
                 network=None):
        super().__init__(group, network=network)
        self.backend, self.timeout, self._lock = "shm", timeout, threading.Lock()
        self.transport_bytes = {"shm": 0, "gloo": 0}  # payload bytes sent by each, ever
        box = [prefix or f"syncedu-{secrets.token_hex(6)}"]
        dist.broadcast_object_list(box, src=self._global(0), group=group)  # rank 0's name
        first = self.rank - self.local_rank
        self._node = range(first, first + self.local_world_size)
        paths = {r: os.path.join(SHM_DIR, f"{box[0]}-{self._global(r)}") for r in self._node}
        with open(os.open(paths[self.rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600), "wb") as f:
            f.truncate(SLOT * len(self._node))  # Step 1: zeros, so both counters start at 0
        dist.barrier(group)
        maps = {r: np.memmap(paths[r], mode="r+") for r in self._node}  # bytes, mapped shared
        dist.barrier(group)  # everyone mapped everything: the names can go
        os.unlink(paths[self.rank])
        me, words = self.rank - first, {r: memoryview(m).cast("q") for r, m in maps.items()}
        # a segment's bytes as (tensor, memoryview): a GPU tensor copies through the first
        rings = {r: (torch.from_numpy(m), memoryview(m)) for r, m in maps.items()}
        # (peer, sending) -> (ring bytes, counter words, slot's first byte)
        self._chan = {(r, s): (rings[r], words[r], me * SLOT) if s else
                      (rings[self.rank], words[self.rank], (r - first) * SLOT)
                      for r in self._node if r != self.rank for s in (True, False)}
        self._queues = {key: deque() for key in self._chan}

    # ---------------------------------------------------------------- point-to-point
    def _raw_isend(self, tensor, dst, tag):
        local = (dst, True) in self._chan
        self.transport_bytes["shm" if local else "gloo"] += tensor.nbytes
        return self._post(dst, True, tensor, tag) if local else super()._raw_isend(tensor, dst, tag)

    def _irecv(self, tensor, src, tag):
        if (src, False) in self._chan:
            return self._post(src, False, tensor, tag)
        return super()._irecv(tensor, src, tag)

    def _post(self, peer: int, sending: bool, tensor: torch.Tensor, tag: int) -> ShmWork:
        payload = tensor.detach().reshape(-1).view(torch.uint8)
        payload = payload if payload.is_cuda else memoryview(payload.numpy())  # CPU: cheaper steps
        header = memoryview(struct.pack("qq", len(payload), tag) if sending else bytearray(16))
        work = ShmWork(self, peer, sending, [header] + ([payload] if len(payload) else []),
                       None if sending else (len(payload), tag))
        with self._lock:
            self._queues[(peer, sending)].append(work)
            self._progress()  # start at once: a send may fit in the ring
        return work

    def _move(self, work: ShmWork) -> bool:
        """Step 2: copy what fits (send) or what has come (receive); True if anything moved."""
        rings, words, base = self._chan[(work.peer, work.sending)]
        w, r = words[base // 8], words[base // 8 + 8]
        mine, room = (w, CAPACITY - (w - r)) if work.sending else (r, w - r)
        start, counter = mine, base // 8 + (0 if work.sending else 8)
        while room and work.piece < len(work.pieces):
            piece, at = work.pieces[work.piece], mine % CAPACITY
            n = min(room, len(piece) - work.pos, CAPACITY - at, STEP)
            ring, lo = rings[isinstance(piece, memoryview)], base + 128 + at
            if work.sending:
                ring[lo:lo + n] = piece[work.pos:work.pos + n]
            else:
                piece[work.pos:work.pos + n] = ring[lo:lo + n]
            mine, room, work.pos = mine + n, room - n, work.pos + n
            words[counter] = mine  # after the data (TSO)
            if work.pos == len(piece):
                work.piece, work.pos = work.piece + 1, 0
                if work.piece == 1 and work.expect not in (None, tuple(piece.cast("q"))):
                    raise RuntimeError(f"rank {work.peer} sent {tuple(piece.cast('q'))} (bytes, "
                                       f"tag) to rank {self.rank}, which expects {work.expect}")
        return mine != start

    def _progress(self) -> bool:
        moved = False
        for queue in self._queues.values():
            while queue:
                moved |= self._move(queue[0])
                if queue[0].piece < len(queue[0].pieces):
                    break
                queue.popleft().done = True
        return moved

    def _wait(self, work: ShmWork, timeout: float) -> None:
        """Step 3: make progress until `work` is done; spin, then sleep; give up at `timeout`."""
        deadline, idle = time.monotonic() + timeout, 0
        while not work.done:
            with self._lock:
                idle = 0 if self._progress() else idle + 1
            if idle > 50:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: {('recv from', 'send to')[work.sending]}"
                                       f" rank {work.peer} not done in {timeout:g} s (shm)")
                time.sleep(2e-5 if idle < 5000 else 1e-3)

    def _recv_any(self, tensor, tag):  # Gloo's would miss what came through shared memory
        raise NotImplementedError("backend='shm' has no any-source receive: use 'gloo'")

    # ---------------------------------------------------------------- built-ins (Step 4)
    def _exchange(self, name: str, sends: list, recvs: list) -> None:
        """Post every receive, then every send, of one built-in; wait for all of them.
        `sends[p]` / `recvs[p]`: the tensor for rank p (None or missing: no message)."""
        with self.scope(self._scopes[-1] if self._scopes else name):
            works = [self.irecv(t, p, BUILTIN_TAG) for p, t in enumerate(recvs)
                     if t is not None and p != self.rank]
            for work in works + [self.isend(t, p, BUILTIN_TAG) for p, t in enumerate(sends)
                                 if t is not None and p != self.rank]:
                work.wait()

    def _reduce_scatter(self, output, inputs, op, async_op, name="reduce_scatter"):
        parts = [output if p == self.rank else torch.empty_like(output)
                 for p in range(self.world_size)]
        output.copy_(inputs[self.rank])  # (all_reduce: the same tensor, no copy)
        self._exchange(name, inputs, parts)
        # In rank order, the same bits on every rank; p0 op p1 == p1 op p0 bit for bit, so
        # ranks 0 and 1 reduce into their own piece and skip a copy.
        a = self.rank if self.rank < 2 else 0
        for part in [t for p, t in enumerate(parts) if p != a]:
            REDUCE_FNS[op](parts[a], part, out=parts[a])
        output.copy_(parts[a])

    def _all_gather(self, outputs, tensor, async_op, name="all_gather"):
        self._exchange(name, [tensor] * self.world_size, outputs)
        outputs[self.rank].copy_(tensor)

    def _all_reduce(self, tensor, op, async_op, name="all_reduce"):
        flat = tensor.detach().view(-1)
        pieces = list(torch.split(flat, ring_chunks(flat.numel(), self.world_size)))
        self._reduce_scatter(pieces[self.rank], pieces, op, async_op, name)
        self._all_gather(pieces, pieces[self.rank], async_op, name)

    def _reduce(self, tensor, dst, op, async_op):  # every rank gets it: simple, still correct
        self._all_reduce(tensor, op, async_op, "reduce")

    def _broadcast(self, tensor, src, async_op):
        self._exchange("broadcast", [tensor] * self.world_size if self.rank == src else [],
                       [tensor if p == src else None for p in range(self.world_size)])
    # (barrier: Gloo's, inherited; it carries no payload)
