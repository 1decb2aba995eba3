"""`TorchComm`: the `Comm` interface on real processes, over torch.distributed.

Gloo on CPU, NCCL when each rank has a GPU: the algorithm code is the same. With
a `Network`, messages are delayed as the model says (emulation.py). `TorchComm()`
wraps the default process group of a script that called `init_process_group`."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .base import Comm, Work
from .emulation import Emulator
from .trace import Trace
from .work import CollectiveWork

_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN}


class TorchWork(CollectiveWork):
    """Wraps a torch.distributed work handle (or None), then `after()` once, the emulated
    delay still owed once the data has arrived: `TorchWork(work, after=None)`. `wait()` waits
    for torch's handle at most `timeout` seconds, then the delay owed."""

    def _wait_inner(self, timeout: float | None) -> None:
        if timeout is None:
            self._inner.wait()
        else:
            self._inner.wait(timedelta(seconds=timeout))


class TorchComm(Comm):
    """One real rank on `group` (default: the default group); `device` defaults to the
    current CUDA device for NCCL, else the CPU; `network`: a `Network` to emulate."""

    def __reduce__(self):
        # A comm wraps its own process's process group: a copy in another process (the
        # launcher, say) would look alive and fail at its first call with torch's "Default
        # process group has not been initialized". Refuse the copy, and say why.
        raise TypeError(f"a TorchComm works only inside fn, on its own rank (rank {self.rank} "
                        "of its process group); return tensors or numbers, not the comm")

    def __init__(self, group=None, *, device: torch.device | str | None = None, network=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call "
                               "torch.distributed.init_process_group() first, or start ranks "
                               "with syncedu.launch.run / launch.from_env()")
        super().__init__(dist.get_rank(group), dist.get_world_size(group), network)
        self.ledger.kind = "modeled"  # a built-in's messages are Gloo's/NCCL's: charged by formula
        self.trace = Trace()  # this rank's point-to-point sends (launch.run merges them)
        if network is not None:
            network.check_world_size(self.world_size)
        self.group = group
        self.backend = str(dist.get_backend(group))
        if device is None:
            device = (torch.device("cuda", torch.cuda.current_device())
                      if self.backend == "nccl" else torch.device("cpu"))
        self.device = torch.device(device)
        self._emu = Emulator(network, self.rank, self.world_size) if network is not None else None
        if not (network is not None and network.is_cluster):
            self._place_from_env()

    def _place_from_env(self) -> None:
        """Under torchrun: node and local rank from LOCAL_RANK / LOCAL_WORLD_SIZE."""
        local, size = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
        if self.group is not None or local is None or size is None:
            return  # one node: local rank = rank (set by Comm)
        self.local_rank, self.local_world_size = int(local), int(size)
        self.node = int(os.environ.get("GROUP_RANK", self.rank // max(1, int(size))))

    def _global(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    def _isend(self, tensor, dst, tag):
        start, op = self.now(), self._scopes[-1] if self._scopes else "send"
        if self._emu is not None:
            work = self._emu.isend(lambda: self._raw_isend(tensor, dst, tag), tensor, dst)
        else:
            work = TorchWork(self._raw_isend(tensor, dst, tag))
        nbytes = tensor.nbytes  # traced once waited for (`end`: the send completed)
        return CollectiveWork(work, lambda: self.trace.add(self.rank, dst, nbytes, tag, op, start,
                                                            self.now()))

    def _raw_isend(self, tensor, dst, tag):
        return dist.isend(tensor, self._global(dst), group=self.group, tag=tag)

    def _irecv(self, tensor, src, tag):
        return TorchWork(dist.irecv(tensor, self._global(src), group=self.group, tag=tag))

    def _recv_any(self, tensor, tag):
        if self.backend == "nccl":
            raise NotImplementedError("NCCL has no any-source receive: use the Gloo backend")
        src = dist.recv(tensor, None, group=self.group, tag=tag)  # a global rank
        return src if self.group is None else dist.get_group_rank(self.group, src)

    # Each runs torch's built-in `dist.<kind>`; with emulation, waiting on it then also waits
    # until the modeled time since the call has passed (Emulator.hold).
    def _timed(self, kind: str, nbytes: int, async_op: bool, *args, **kwargs) -> Work:
        t0 = time.perf_counter()
        work = getattr(dist, kind)(*args, group=self.group, async_op=async_op, **kwargs)
        return TorchWork(work, None if self._emu is None else
                         (lambda: self._emu.hold(kind, nbytes, t0)))

    def _broadcast(self, tensor, src, async_op):
        return self._timed("broadcast", tensor.nbytes, async_op, tensor, self._global(src))

    def _reduce(self, tensor, dst, op, async_op):
        return self._timed("reduce", tensor.nbytes, async_op, tensor, self._global(dst),
                           op=_OPS[op])

    def _all_reduce(self, tensor, op, async_op):
        return self._timed("all_reduce", tensor.nbytes, async_op, tensor, op=_OPS[op])

    def _reduce_scatter(self, output, inputs, op, async_op):  # Gloo has it since torch 2.8
        return self._timed("reduce_scatter", output.nbytes * self.world_size, async_op, output,
                           list(inputs), op=_OPS[op])

    def _all_gather(self, outputs, tensor, async_op):
        return self._timed("all_gather", tensor.nbytes * self.world_size, async_op,
                           list(outputs), tensor)

    def _barrier(self, async_op):
        return self._timed("barrier", 0, async_op)
