"""`Comm`: the one interface every algorithm in syncedu is written against.

One rank's view of `world_size` ranks (`TorchComm`, `SimComm` or `LocalComm`). This base
class validates the arguments, charges the ledger (point-to-point by payload bytes,
"counted"; built-ins as a ring would send them, "modeled", unless the backend counts their
messages) and calls the backend's `_isend`, `_all_reduce`, ... hooks to move the data.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch

from .ledger import RankLedger, ring_allreduce_charge
from .network import Network
from .work import CollectiveWork, Work

REDUCE_OPS = ("sum", "prod", "max", "min", "avg")
# What a backend reduces with once "avg" is a sum: `REDUCE_FNS[op](acc, x, out=acc)`.
REDUCE_FNS = {"sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")


class Comm(ABC):
    """One rank's communicator. Subclasses implement the underscore methods."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    counts_builtins = False  # True: the backend counts its built-ins' messages (simulator)

    def __init__(self, rank: int, world_size: int, network=None):
        self.rank = rank
        self.world_size = world_size
        self.network = network
        self.ledger = RankLedger(rank)
        self._scopes: list[str] = []
        self._t0 = time.perf_counter()
        # Where this rank sits: one node unless the network (a cluster) says otherwise.
        net = network if network is not None else Network()
        self.node, self.local_rank = net.node_of(rank), net.local_rank_of(rank)
        self.local_world_size = net.local_world_size_of(rank, world_size)

    def _root(self, root: int, name: str) -> None:
        if not isinstance(root, int) or not 0 <= root < self.world_size:
            raise ValueError(f"{name}={root!r} must be a rank in 0..{self.world_size - 1}")

    def _op(self, op: str, tensor: torch.Tensor):
        """(the op the backend runs, what is left after it): "avg" is a sum, then / N."""
        if op not in REDUCE_OPS:
            raise ValueError(f"op={op!r} is not supported; choose one of {REDUCE_OPS}")
        return ("sum", lambda: tensor.div_(self.world_size)) if op == "avg" else (op, None)

    def _charge(self, op: str, sent: int = 0, received: int = 0, msgs_sent: int = 0,
                msgs_received: int = 0, kind: str = "counted") -> None:
        self.ledger.record(self._scopes[-1] if self._scopes else op, sent, received,
                           msgs_sent, msgs_received, kind=kind)

    def _charge_builtin(self, op: str, sent: int = 0, received: int = 0, msgs_sent: int = 0,
                        msgs_received: int = 0) -> None:
        """A built-in by formula, "modeled"; only the call where its messages are counted."""
        if self.counts_builtins:
            self._charge(op)
        else:
            self._charge(op, sent, received, msgs_sent, msgs_received, kind="modeled")

    def _charge_chain(self, op: str, nbytes: int, first: int) -> None:
        """A chain first -> first+1 -> ... -> first-1: all send but the last, receive but first."""
        n = self.world_size
        sends = int(n > 1 and self.rank != (first - 1) % n)
        recvs = int(n > 1 and self.rank != first)
        self._charge_builtin(op, sent=sends * nbytes, received=recvs * nbytes,
                             msgs_sent=sends, msgs_received=recvs)

    def _charge_ring_half(self, op: str, part: int) -> None:
        """Half a ring (reduce-scatter or all-gather): N-1 messages of `part` bytes each way."""
        k = self.world_size - 1
        self._charge_builtin(op, sent=k * part, received=k * part, msgs_sent=k, msgs_received=k)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Charge everything sent inside the block to ledger op `name` (e.g. "ring_allreduce")."""
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        """Send `tensor` to rank `dst`; returns when the data has been handed over."""
        self.isend(tensor, dst, tag).wait()

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        """Receive from rank `src` into `tensor` (in place); returns `tensor`."""
        self.irecv(tensor, src, tag).wait()
        return tensor

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> Work:
        """Start sending `tensor` to `dst`; do not modify it before `.wait()`."""
        self._check_p2p(tensor, dst, "dst")
        self._charge("send", tensor.nbytes, 0, 1, 0)
        return self._isend(tensor, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> Work:
        """Start receiving from `src` into `tensor`; valid after `.wait()`."""
        self._check_p2p(tensor, src, "src")
        self._charge("recv", 0, tensor.nbytes, 0, 1)
        return self._irecv(tensor, src, tag)

    def _check_p2p(self, tensor, peer, name: str) -> None:
        # The cheap test first: simulated rings send millions of messages.
        if type(peer) is not int or not 0 <= peer < self.world_size or peer == self.rank:
            if not isinstance(peer, int) or isinstance(peer, bool):
                raise TypeError(f"{name} must be an int rank, got {type(peer).__name__}")
            if not 0 <= peer < self.world_size or peer == self.rank:
                raise ValueError(f"{name}={peer} must be another rank in "
                                 f"0..{self.world_size - 1} (this is rank {self.rank})")
        if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
            _check_tensor(tensor, "tensor")

    def recv_any(self, tensor: torch.Tensor, tag: int = 0) -> int:
        """Receive the next `tag` message from any rank (the first to arrive); return that rank."""
        _check_tensor(tensor, "tensor")
        self._charge("recv", received=tensor.nbytes, msgs_received=1)
        return self._recv_any(tensor, tag)

    def _recv_any(self, tensor: torch.Tensor, tag: int) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no any-source receive")

    def _done(self, work: Work | None, async_op: bool, result, then=None):
        """Return `result` once `work` is done, or (async_op) a handle that finishes it."""
        if async_op:
            return CollectiveWork(work, then)
        if work is not None:
            work.wait()
        if then is not None:
            then()
        return result

    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False):
        """Copy `src`'s tensor into every rank's `tensor` (charged as a chain)."""
        _check_tensor(tensor, "tensor")
        self._root(src, "src")
        self._charge_chain("broadcast", tensor.nbytes, src)
        work = self._broadcast(tensor, src, async_op) if self.world_size > 1 else None
        return self._done(work, async_op, tensor)

    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: str = "sum",
               async_op: bool = False):
        """Reduce every rank's `tensor` into `dst`'s (a chain ending at `dst`)."""
        _check_tensor(tensor, "tensor")
        self._root(dst, "dst")
        op, then = self._op(op, tensor)
        self._charge_chain("reduce", tensor.nbytes, (dst + 1) % self.world_size)
        work = self._reduce(tensor, dst, op, async_op) if self.world_size > 1 else None
        return self._done(work, async_op, tensor, then if self.rank == dst else None)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", async_op: bool = False):
        """Reduce `tensor` over all ranks, in place (charged as a ring allreduce)."""
        _check_tensor(tensor, "tensor")
        op, then = self._op(op, tensor)
        n = self.world_size
        self._charge_builtin("all_reduce", **ring_allreduce_charge(
            tensor.numel(), tensor.element_size(), n, self.rank))
        work = self._all_reduce(tensor, op, async_op) if n > 1 else None
        return self._done(work, async_op, tensor, then)

    def reduce_scatter(self, output: torch.Tensor, input_list: list[torch.Tensor],
                       op: str = "sum", async_op: bool = False):
        """Rank r gets the reduction of every rank's `input_list[r]` in `output`."""
        _check_tensor(output, "output")
        self._check_list(input_list, "input_list", output)
        op, then = self._op(op, output)
        n = self.world_size
        # Ring, rank r ending with chunk r: it sends every chunk but its own, gets all but r-1's.
        self._charge_ring_half("reduce_scatter", output.nbytes)
        work = self._reduce_scatter(output, input_list, op, async_op) if n > 1 else None
        if n == 1:
            output.copy_(input_list[0])
        return self._done(work, async_op, output, then)

    def all_gather(self, tensor_list: list[torch.Tensor], tensor: torch.Tensor,
                   async_op: bool = False):
        """Every rank gets every rank's `tensor`: `tensor_list[r]` is rank r's."""
        _check_tensor(tensor, "tensor")
        self._check_list(tensor_list, "tensor_list", tensor)
        n = self.world_size
        # Ring: rank r forwards every chunk but (r + 1)'s and receives all but its own.
        self._charge_ring_half("all_gather", tensor.nbytes)
        work = self._all_gather(tensor_list, tensor, async_op) if n > 1 else None
        if n == 1:
            tensor_list[0].copy_(tensor)
        return self._done(work, async_op, tensor_list)

    def barrier(self, async_op: bool = False):
        """Wait for every rank (charged as dissemination, Hensgen et al. 1988: log2 N rounds)."""
        rounds = (self.world_size - 1).bit_length()
        self._charge_builtin("barrier", msgs_sent=rounds, msgs_received=rounds)
        work = self._barrier(async_op) if self.world_size > 1 else None
        return self._done(work, async_op, None)

    def _check_list(self, tensors, name: str, like: torch.Tensor) -> None:
        if not isinstance(tensors, (list, tuple)) or len(tensors) != self.world_size:
            raise ValueError(f"{name} must be a list of world_size={self.world_size} tensors")
        shape, dtype = like.shape, like.dtype
        for i, t in enumerate(tensors):
            if isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype \
                    and t.is_contiguous():
                continue  # the common case, checked cheaply (1024 ranks: a million of these)
            _check_tensor(t, f"{name}[{i}]")
            if t.shape != like.shape or t.dtype != like.dtype:
                raise ValueError(f"{name}[{i}] has shape {tuple(t.shape)} and dtype {t.dtype}; "
                                 f"expected {tuple(like.shape)} and {like.dtype}")

    def compute(self, seconds: float) -> None:
        """Spend `seconds` of modeled compute (times this rank's network slowdown)."""
        if seconds < 0:
            raise ValueError(f"seconds={seconds} must be >= 0")
        self._compute(seconds * self.slowdown)

    @property
    def slowdown(self) -> float:
        """This rank's compute slowdown factor from the network model (1.0 = normal)."""
        return self.network.slowdown_of(self.rank) if self.network is not None else 1.0

    def now(self) -> float:
        """Seconds since the run started (logical time on simulated ranks)."""
        return time.perf_counter() - self._t0

    def start_clock(self) -> None:
        """Make `now()` count from here (a launcher calls it when `fn` starts)."""
        self._t0 = time.perf_counter()

    def _compute(self, seconds: float) -> None:
        time.sleep(seconds)

    # Backend hooks: each returns a `Work` still to wait for (collectives: or None, once done).
    @abstractmethod
    def _isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work: ...

    @abstractmethod
    def _irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work: ...

    @abstractmethod
    def _broadcast(self, tensor: torch.Tensor, src: int, async_op: bool) -> Work | None: ...

    @abstractmethod
    def _reduce(self, tensor: torch.Tensor, dst: int, op: str, async_op: bool) -> Work | None: ...

    @abstractmethod
    def _all_reduce(self, tensor: torch.Tensor, op: str, async_op: bool) -> Work | None: ...

    @abstractmethod
    def _reduce_scatter(self, output: torch.Tensor, inputs: list, op: str,
                        async_op: bool) -> Work | None: ...

    @abstractmethod
    def _all_gather(self, outputs: list, tensor: torch.Tensor, async_op: bool) -> Work | None: ...

    @abstractmethod
    def _barrier(self, async_op: bool) -> Work | None: ...

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size}, "
                f"backend={getattr(self, 'backend', '?')!r})")
