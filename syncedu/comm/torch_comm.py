"""`TorchComm`: the `Comm` interface on real processes, over torch.distributed.

Gloo on CPU, NCCL when each rank has a GPU: the algorithm code is the same. Each
call is charged to the rank's ledger by `Comm` before it reaches torch. When a
`Network` is given, messages are delayed as the model says (emulation.py), so a
slow or straggling cluster can be felt on one laptop.

`TorchComm()` with no arguments wraps the default process group of a script
that called `torch.distributed.init_process_group` itself (e.g. under torchrun).

Used in: every notebook that launches real ranks.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .base import Comm, Work
from .emulation import Emulator

_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


class TorchWork(Work):
    """Wraps a torch.distributed work handle; `wait()` honours a timeout."""

    def __init__(self, work, after=None):
        self._work = work
        self._after = after  # emulated delay still owed once the data has arrived

    def wait(self, timeout: float | None = None) -> None:
        if self._work is not None:
            if timeout is None:
                self._work.wait()
            else:
                self._work.wait(timedelta(seconds=timeout))
            self._work = None
        if self._after is not None:
            after, self._after = self._after, None
            after()


class TorchComm(Comm):
    """One real rank: torch.distributed point-to-point and collectives.

    Args:
        group: a torch.distributed process group (default: the default group).
        device: where this rank's tensors live (default: the current CUDA device
            for NCCL, else the CPU).
        network: optional `Network` to emulate (latency, bandwidth, stragglers).
    """

    def __init__(self, group=None, *, device: torch.device | str | None = None, network=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call "
                               "torch.distributed.init_process_group() first, or start ranks "
                               "with syncedu.launch.run / launch.from_env()")
        super().__init__(dist.get_rank(group), dist.get_world_size(group), network)
        if network is not None:
            network.check_world_size(self.world_size)
        self.group = group
        self.backend = str(dist.get_backend(group))
        if device is None:
            device = (torch.device("cuda", torch.cuda.current_device())
                      if self.backend == "nccl" else torch.device("cpu"))
        self.device = torch.device(device)
        self._emu = Emulator(network, self.rank, self.world_size) if network is not None else None
        self._t0 = time.perf_counter()

    def _global(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)

    # ------------------------------------------------------------ p2p
    def _isend(self, tensor, dst, tag):
        if self._emu is not None:
            return self._emu.isend(lambda: self._raw_isend(tensor, dst, tag), tensor, dst)
        return TorchWork(self._raw_isend(tensor, dst, tag))

    def _raw_isend(self, tensor, dst, tag):
        return dist.isend(tensor, self._global(dst), group=self.group, tag=tag)

    def _irecv(self, tensor, src, tag):
        work = dist.irecv(tensor, self._global(src), group=self.group, tag=tag)
        return TorchWork(work)

    def _recv_any(self, tensor, tag):
        if self.backend == "nccl":
            raise NotImplementedError("NCCL has no any-source receive: use the Gloo backend")
        src = dist.recv(tensor, None, group=self.group, tag=tag)  # a global rank
        return src if self.group is None else dist.get_group_rank(self.group, src)

    # ---------------------------------------------------- collectives
    # Each runs torch's built-in; with emulation the rank then waits until the
    # modeled ring time has passed (Emulator.collective).
    def _timed(self, kind: str, nbytes: int, call) -> None:
        if self._emu is None:
            call()
        else:
            self._emu.collective(kind, nbytes, call)

    def _broadcast(self, tensor, src):
        self._timed("broadcast", _nb(tensor),
                    lambda: dist.broadcast(tensor, self._global(src), group=self.group))

    def _reduce(self, tensor, dst, op):
        self._timed("reduce", _nb(tensor),
                    lambda: dist.reduce(tensor, self._global(dst), op=_OPS[op], group=self.group))

    def _all_reduce(self, tensor, op):
        self._timed("all_reduce", _nb(tensor),
                    lambda: dist.all_reduce(tensor, op=_OPS[op], group=self.group))

    def _reduce_scatter(self, output, inputs, op):
        def call():
            if self._has_reduce_scatter:
                try:
                    dist.reduce_scatter(output, list(inputs), op=_OPS[op], group=self.group)
                    return
                except RuntimeError as e:  # older Gloo builds lack reduce_scatter
                    if "support" not in str(e).lower():
                        raise
                    self._has_reduce_scatter = False
            flat = torch.cat([t.reshape(-1) for t in inputs])
            dist.all_reduce(flat, op=_OPS[op], group=self.group)
            output.copy_(flat.view(len(inputs), -1)[self.rank].view_as(output))
        self._timed("reduce_scatter", _nb(output) * self.world_size, call)

    _has_reduce_scatter = True

    def _all_gather(self, outputs, tensor):
        self._timed("all_gather", _nb(tensor) * self.world_size,
                    lambda: dist.all_gather(list(outputs), tensor, group=self.group))

    def _barrier(self):
        self._timed("barrier", 0, lambda: dist.barrier(group=self.group))

    def _compute(self, seconds: float) -> None:
        time.sleep(seconds)


def _nb(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()

