"""Data parallelism from scratch: `DataParallel(module, comm, strategy=...)`, like DDP.

Every rank trains a full copy of the model on its shard of the global batch and the
ranks average their gradients, so every copy takes the same optimizer step (Li et al.,
"PyTorch Distributed", VLDB 2020). `STRATEGIES`: naive, flat, bucketed.

1. at construction, broadcast rank 0's parameters and buffers (as DDP does);
2. collect the parameters to synchronize: trainable ones, each tied one once;
3. `forward` decides whether the coming backward synchronizes (not inside `no_sync()`),
   as DDP does: wrapping only `backward()` in `no_sync()` still synchronizes;
4. `finish_gradient_synchronization()` waits for the last backward's traffic and
   leaves averaged gradients in `.grad`; call it before the step.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

from syncedu.dp.buckets import MB, Bucket, build_buckets, flatten, trainable_parameters, unflatten_
from syncedu.train.compression import resolve


class GradSync:
    """One way to average gradients: `arm(on)` at forward, `finish()` after backward."""

    def __init__(self, params: list[nn.Parameter], comm, *, timeout: float = 300.0):
        self.params, self.comm, self.timeout, self.armed = params, comm, timeout, False
        self.events: list[tuple[float, float, int]] = []  # (start, end, bytes) per allreduce

    def arm(self, on: bool) -> None:
        """Whether the next backward synchronizes (`on`=False inside `no_sync`)."""
        self.armed = on

    def close(self) -> None:
        """Remove hooks and free buffers; nothing to do for a strategy without them."""

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        t0 = time.perf_counter()
        self.comm.all_reduce(tensor, op="avg")
        self.events.append((t0, time.perf_counter(), tensor.numel() * tensor.element_size()))


def _grad(p: nn.Parameter) -> torch.Tensor:
    """The gradient to send (zeros for a parameter this rank's backward did not reach)."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


class NaiveSync(GradSync):
    """One allreduce per parameter, after backward."""

    def finish(self) -> None:
        """One allreduce per parameter gradient after the backward (contiguous copy if needed)."""
        for p in self.params:
            g = _grad(p)
            tmp = g if g.is_contiguous() else g.contiguous()
            self._all_reduce(tmp)
            if tmp is not g:
                g.copy_(tmp)


class FlatSync(GradSync):
    """Copy every gradient into one flat buffer, one allreduce, copy back."""

    def finish(self) -> None:
        """Concatenate every gradient, one allreduce, copy each slice back into its `.grad`."""
        grads = [_grad(p) for p in self.params]
        flat = flatten(grads)
        self._all_reduce(flat)
        unflatten_(grads, flat)


class BucketedSync(GradSync):
    """Buckets allreduced asynchronously as backward fills them: DDP's overlap."""

    def __init__(self, params, comm, *, bucket_cap_mb: float = 25.0, timeout: float = 300.0):
        super().__init__(params, comm, timeout=timeout)
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} must be > 0")
        self.buckets: list[Bucket] = build_buckets(params, int(bucket_cap_mb * MB)) \
            if params else []
        self._where = {id(p): (b, k) for b in self.buckets for k, p in enumerate(b.params)}
        self._next = 0  # the next bucket to launch
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def arm(self, on: bool) -> None:
        super().arm(on)
        if on:
            for b in self.buckets:
                b.ready, b.work = 0, None
            self._next = 0

    def _on_grad(self, p: nn.Parameter) -> None:
        if not self.armed:
            return
        bucket, k = self._where[id(p)]
        view = bucket.buffer[bucket.offsets[k]:bucket.offsets[k] + p.numel()]
        if p.grad.data_ptr() != view.data_ptr():  # not already there (see finish)
            view.copy_(p.grad.reshape(-1))
        bucket.ready += 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        # In bucket order only: every rank must issue the same collectives in the same order.
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if b.ready < len(b.params):
                if not force:
                    return
                for p, view in b.views():  # backward skipped some: send zeros for them
                    view.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
            b.started = time.perf_counter()
            b.work = self.comm.all_reduce(b.buffer, op="avg", async_op=True)
            self._next += 1

    def finish(self) -> None:
        self._launch_ready(force=True)
        for b in self.buckets:
            if b.work is None:
                continue
            b.work.wait(self.timeout)
            b.work = None
            # (launch, done): done is when we saw it finish, at most that late.
            self.events.append((b.started, time.perf_counter(), b.nbytes))
            for p, view in b.views():
                # The averaged gradient stays in the bucket, no copy back; until
                # zero_grad(set_to_none=True), later backwards accumulate right
                # into it (DDP's gradient_as_bucket_view).
                p.grad = view

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


class CompressedSync(GradSync):
    """Any strategy with a compressor (lesson 07): each of the strategy's groups (parameter,
    all, bucket) averaged by it after backward, blocking; the ledger counts compressed bytes."""

    def __init__(self, params, comm, *, strategy: str, compressor, bucket_cap_mb: float = 25.0,
                 timeout: float = 300.0):
        super().__init__(params, comm, timeout=timeout)
        self.compressor = compressor
        if strategy == "naive":
            self.groups = [(f"param{i}", [p]) for i, p in enumerate(params)]
        elif strategy == "flat":
            self.groups = [("bucket0", params)] if params else []
        else:
            self.groups = [(f"bucket{b.index}", b.params)  # (no bucket for no parameters)
                           for b in build_buckets(params, int(bucket_cap_mb * MB))]

    def finish(self) -> None:
        """Each group's gradients averaged through the compressor; its event records the
        uncompressed bytes (the ledger has what actually travelled).
        """
        for key, group in self.groups:
            grads = [_grad(p) for p in group]
            t0 = time.perf_counter()
            self.compressor.average_(self.comm, grads, key=key)
            nbytes = sum(g.numel() * g.element_size() for g in grads)  # before compression
            self.events.append((t0, time.perf_counter(), nbytes))


STRATEGIES = {"naive": NaiveSync, "flat": FlatSync, "bucketed": BucketedSync}


@contextlib.contextmanager
def sync_paused(wrapper):
    """`wrapper.require_sync` off inside the block, as it was after (every `no_sync`)."""
    old, wrapper.require_sync = wrapper.require_sync, False
    try:
        yield
    finally:
        wrapper.require_sync = old


class DataParallel(nn.Module):
    """Wrap `module` so that training on every rank's shard averages the gradients.

    Like `torch.nn.parallel.DistributedDataParallel` (Li et al., "PyTorch Distributed",
    VLDB 2020): rank 0's parameters and buffers are broadcast at construction, so every rank
    starts equal; each backward then averages the gradients, and since every rank applies the
    same averaged update the parameters stay equal without being sent again.

    Args:
        module: any `nn.Module`; frozen parameters are never sent, tied ones once.
        comm: this rank's `Comm` (real or simulated ranks: the same code).
        strategy: "naive" (one allreduce per gradient, after backward), "flat" (one
            allreduce of every gradient concatenated) or "bucketed" (default: buckets of
            about `bucket_cap_mb`, each allreduced asynchronously as soon as backward has
            filled it, so the traffic overlaps the rest of the backward, as DDP does).
        bucket_cap_mb: bucket size in MB (10^6 bytes) for "bucketed" (default 25.0, DDP's).
        broadcast_buffers: re-broadcast rank 0's buffers (BatchNorm statistics) at every
            synchronizing forward, as DDP's default (default True).
        timeout: seconds any wait for gradient traffic may take before `TimeoutError`
            (default 300.0).
        compression: None (default: fp32 on the wire), "fp16", "bf16" or a compressor from
            `syncedu.compress` (`TopK`, `SignSGD`, `PowerSGD`): the ledger counts the bytes
            actually sent.
    """

    def __init__(self, module: nn.Module, comm, strategy: str = "bucketed", *,
                 bucket_cap_mb: float = 25.0, broadcast_buffers: bool = True,
                 timeout: float = 300.0, compression=None):
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy={strategy!r} is unknown; "
                             f"choose one of {sorted(STRATEGIES)}")
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be > 0 seconds")
        self.module, self.comm, self.strategy = module, comm, strategy
        self.broadcast_buffers, self.require_sync = broadcast_buffers, True
        with torch.no_grad():  # Step 1
            for p in module.parameters():  # each tied parameter once
                comm.broadcast(p.data, src=0)
            self._broadcast_buffers()
        compressor = resolve(compression)
        params = trainable_parameters(module)  # Step 2
        if compressor is not None:
            compressor.check(comm)  # e.g. bf16 needs a backend that can send it
            self.sync: GradSync = CompressedSync(params, comm, strategy=strategy, timeout=timeout,
                                                 compressor=compressor, bucket_cap_mb=bucket_cap_mb)
        else:
            cap = {"bucket_cap_mb": bucket_cap_mb} if strategy == "bucketed" else {}
            self.sync = STRATEGIES[strategy](params, comm, timeout=timeout, **cap)
        self.comm_events = self.sync.events  # (start, end, bytes) per allreduce, perf_counter s

    def _broadcast_buffers(self) -> None:
        for b in self.module.buffers():
            if b.is_contiguous() and b.numel():
                self.comm.broadcast(b, src=0)

    def forward(self, *args, **kwargs):
        """The wrapped module's forward; with grad enabled and outside `no_sync`, it also arms
        the next backward's gradient sync and (`broadcast_buffers`) sends rank 0's buffers.
        """
        sync = self.require_sync and torch.is_grad_enabled()  # Step 3
        if sync and self.broadcast_buffers and self.comm.world_size > 1:
            with torch.no_grad():
                self._broadcast_buffers()
        self.sync.arm(sync)
        return self.module(*args, **kwargs)

    def no_sync(self):
        """Inside this block, forward+backward accumulate gradients locally, unsent."""
        return sync_paused(self)

    def finish_gradient_synchronization(self) -> None:
        """Step 4: wait for (or run) the last backward's traffic; `.grad` is then averaged."""
        if self.sync.armed:
            self.sync.finish()
            self.sync.arm(False)

    def close(self) -> None:
        """Remove the hooks (the module stays usable)."""
        self.sync.close()
