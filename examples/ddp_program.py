"""The complete PyTorch DDP program: the script every data-parallel job grows from.

    python examples/ddp_program.py --spawn 2            # mp.spawn starts 2 ranks
    torchrun --standalone --nproc-per-node=2 examples/ddp_program.py

It follows the shape of PyTorch's "Getting Started with Distributed Data
Parallel" tutorial (pytorch.org/tutorials/intermediate/ddp_tutorial.html) and
the DistributedSampler documentation (pytorch.org/docs/stable/data.html),
with the tutorial's loose ends tied: a free port chosen at run time, a timeout
on every wait, `set_epoch` every epoch, the checkpoint loaded with
`map_location`. Every line that a one-process training script would not have
carries a `# sync:` comment.

Steps (each repeated as a `# Step N` comment below):

1. `setup(rank, world_size)`: MASTER_ADDR/MASTER_PORT say where rank 0's
   rendezvous store listens (the `env://` init method); `init_process_group`
   joins the group (Gloo on CPU, NCCL when every rank has its own GPU);
2. the model, seeded identically on every rank, moved to its device, then
   wrapped in `DDP` (`device_ids=[rank]` on GPUs only; DDP also broadcasts
   rank 0's parameters at construction);
3. `DistributedSampler(dataset, num_replicas, rank)`: rank r reads positions
   r, r + N, r + 2N, ... of each epoch's shuffled order; a DataLoader batches
   them (global batch B = N * per-rank batch);
4. every epoch, `sampler.set_epoch(epoch)` reseeds the shuffle (forgotten,
   every epoch repeats epoch 0's order: `--forget-set-epoch` measures that);
   `loss.backward()` is where DDP averages the gradients over the ranks;
5. after each epoch rank 0 saves a checkpoint, a barrier makes sure the file
   is complete, and every rank can load it with `map_location` (a run given
   an existing `--checkpoint` resumes from it);
6. the ranks' losses averaged once at the end; rank 0 writes the final
   parameters (`--out`); `destroy_process_group`; `leave()` exits without the
   interpreter's teardown (a Gloo thread can still be freeing tensors then).

With the sampler's `drop_last=True` and the loader's `drop_last=True`, step j
of epoch e reads exactly `sampling.global_batches`' batch (the same
`randperm` seeded with seed + epoch, the same `batch[r::N]` shard), so this
program trains to the parameters of `train.run("single", 1, ...)` and
`train.run("ddp", N, ...)` with `steps = epochs * (1797 // B)`; the test
checks both (tests/dp/test_ddp_program.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from syncedu.train import data, models

__all__ = ["Config", "setup", "cleanup", "train", "free_port", "spawn", "leave", "main"]


@dataclass(frozen=True)
class Config:
    """One training job (frozen and picklable: mp.spawn sends it to every rank)."""

    epochs: int = 2
    global_batch: int = 64
    lr: float = 0.1
    optimizer: str = "sgd"
    seed: int = 0
    set_epoch: bool = True
    checkpoint: str | None = None
    out: str | None = None
    timeout: float = 60.0

    def __post_init__(self):
        for name in ("epochs", "global_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer={self.optimizer!r} must be 'sgd' or 'adam'")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r} must be > 0")
        if not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r} must be > 0 seconds")


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it; never a fixed 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(rank: int, world_size: int, timeout: float = 60.0) -> torch.device:
    """Step 1: join the process group; returns this rank's device."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in 0..{world_size - 1} (world_size={world_size})")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # sync: rank 0's host (torchrun sets it)
    if "MASTER_PORT" not in os.environ:  # sync: torchrun sets it; spawn() sets a free one
        if world_size > 1:  # the ranks must agree on one port: only their starter can pick it
            raise RuntimeError("MASTER_PORT is not set: start the ranks with spawn() or torchrun")
        os.environ["MASTER_PORT"] = str(free_port())  # sync: a lone rank may pick any free port
    local_rank = int(os.environ.get("LOCAL_RANK", rank))  # torchrun: the GPU index on this node
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    gpus = torch.cuda.is_available() and torch.cuda.device_count() >= local_size
    if gpus:
        torch.cuda.set_device(local_rank)  # sync: one GPU per rank, before NCCL starts
    else:  # ranks share the CPU cores: oversubscribed threads halve the speed
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_size))
    dist.init_process_group("nccl" if gpus else "gloo",  # sync: env:// rendezvous
                            rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    return torch.device("cuda", local_rank) if gpus else torch.device("cpu")


def cleanup() -> None:
    """Step 6: leave the group (frees sockets and NCCL communicators)."""
    dist.destroy_process_group()  # sync:


def _optimizer(params, cfg: Config) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr)
    return torch.optim.SGD(params, lr=cfg.lr)


def resume_checkpoint(model, opt, cfg: Config, device: torch.device) -> int:
    """Step 5: load a checkpoint saved from any device onto this rank's device."""
    if not cfg.checkpoint or not os.path.exists(cfg.checkpoint):
        return 0
    # map_location: the tensors were saved from rank 0's device (cuda:0 on GPUs);
    # without it every rank would load them onto cuda:0.
    state = torch.load(cfg.checkpoint, map_location=device)  # sync: each rank to its device
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return state["epoch"]


def save_checkpoint(model, opt, epoch: int, cfg: Config, rank: int) -> None:
    """Step 5: rank 0 writes, then a barrier: no rank goes on before the file is complete."""
    if cfg.checkpoint and rank == 0:  # sync: one writer; the ranks' copies are identical
        tmp = cfg.checkpoint + ".tmp"
        torch.save({"epoch": epoch, "model": model.module.state_dict(),
                    "optimizer": opt.state_dict()}, tmp)
        os.replace(tmp, cfg.checkpoint)  # a crash mid-write never leaves half a file
    dist.barrier()  # sync: wait for rank 0's write (bounded by the group's timeout)


def train(rank: int, world_size: int, cfg: Config) -> None:
    """One rank's whole job (what mp.spawn and torchrun both run)."""
    device = setup(rank, world_size, cfg.timeout)  # Step 1
    try:
        dataset = data.digits()
        model = models.make("mlp", seed=cfg.seed).to(device)  # Step 2
        if device.type == "cuda":
            model = DDP(model, device_ids=[device.index])  # sync: this rank's one GPU
        else:
            model = DDP(model)  # sync: CPU modules take no device_ids
        sampler = DistributedSampler(dataset, num_replicas=world_size,  # sync: Step 3
                                     rank=rank, shuffle=True, seed=cfg.seed, drop_last=True)
        loader = DataLoader(dataset, batch_size=cfg.global_batch // world_size,  # sync: per rank
                            sampler=sampler, drop_last=True)
        opt = _optimizer(model.parameters(), cfg)
        losses = []
        for epoch in range(resume_checkpoint(model, opt, cfg, device), cfg.epochs):
            if cfg.set_epoch:
                sampler.set_epoch(epoch)  # sync: Step 4: a new shuffle every epoch
            for x, y in loader:
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x.to(device)), y.to(device))
                loss.backward()  # sync: DDP's hooks allreduce-average the gradients here
                opt.step()
                losses.append(loss.item())
            save_checkpoint(model, opt, epoch + 1, cfg, rank)  # Step 5
        _finish(model, losses, cfg, rank, world_size, device)  # Step 6
    finally:
        cleanup()


def _finish(model, losses, cfg: Config, rank: int, world_size: int, device) -> None:
    """Step 6: one allreduce for the global mean loss per step; rank 0 reports."""
    mean = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.all_reduce(mean)  # sync: each rank saw only its shard's loss
    mean /= world_size
    if rank != 0:
        return
    params = {k: v.detach().cpu().clone() for k, v in model.module.named_parameters()}
    if cfg.out:
        torch.save({"params": params, "loss": mean.cpu().tolist(), "config": asdict(cfg),
                    "world_size": world_size, "backend": dist.get_backend()}, cfg.out)
    last = f"{mean[-1].item():.4f}" if len(mean) else "n/a"
    print(f"rank 0 of {world_size} ({dist.get_backend()}): {len(mean)} steps, "
          f"last loss {last}", flush=True)


def spawn(world_size: int, cfg: Config) -> None:
    """Start `world_size` ranks on this machine with mp.spawn; raise if one fails or hangs."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an int >= 1")
    if cfg.global_batch % world_size:
        raise ValueError(f"global_batch={cfg.global_batch} must be a multiple of "
                         f"world_size={world_size}")
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # sync: the children inherit the environment
    os.environ["MASTER_PORT"] = str(free_port())  # sync: chosen now, never hard-coded
    ctx = mp.spawn(_spawned, args=(world_size, cfg), nprocs=world_size, join=False)
    deadline = time.monotonic() + cfg.timeout * (cfg.epochs + 2)
    # join(timeout) raises ProcessRaisedException when a rank fails, and returns
    # True once all have exited: the loop never waits past the deadline.
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"the {world_size} ranks were still running after the deadline")


def _spawned(rank: int, world_size: int, cfg: Config) -> None:
    train(rank, world_size, cfg)  # mp.spawn passes the rank first
    leave()  # sync: exit without teardown (a Gloo thread may still be freeing tensors)


def leave() -> None:
    """After Step 6, on success: exit at once, without the interpreter's teardown.

    A workaround for a PyTorch race, not part of DDP. At exit a Gloo worker thread may
    still be freeing the last allreduce's tensors (the group outlives destroy_process_group
    while the DDP model holds it); that takes the GIL, and Python (3.11 here) ends a thread that
    asks for it during finalization with pthread_exit, whose unwinding through a noexcept
    destructor calls std::terminate: SIGABRT, "terminate called without an active exception"
    (a core dump here; pytorch/pytorch issue 190489 shows the same abort). `os._exit` skips
    atexit handlers: close whatever you add that writes (a log, a SummaryWriter, an
    mp.Queue) before it. After a successful run `main()` therefore never returns.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _parse(argv) -> tuple[int | None, Config]:
    p = argparse.ArgumentParser(prog="python examples/ddp_program.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--spawn", type=int, metavar="N",
                   help="start N ranks with mp.spawn (without it: run under torchrun)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--forget-set-epoch", action="store_true",
                   help="never call sampler.set_epoch (the classic bug)")
    p.add_argument("--checkpoint", help="save after each epoch; resume if it exists")
    p.add_argument("--out", help="rank 0 writes the final parameters and losses here")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take")
    a = p.parse_args(argv)
    return a.spawn, Config(epochs=a.epochs, global_batch=a.global_batch, lr=a.lr,
                           optimizer=a.optimizer, seed=a.seed, set_epoch=not a.forget_set_epoch,
                           checkpoint=a.checkpoint, out=a.out, timeout=a.timeout)


def main(argv=None) -> None:
    nprocs, cfg = _parse(argv)
    if nprocs is not None:
        spawn(nprocs, cfg)
        return
    if "RANK" not in os.environ:
        sys.exit("no RANK in the environment: pass --spawn N, or start it with torchrun")
    world_size = int(os.environ["WORLD_SIZE"])  # sync: torchrun tells each rank who it is
    if cfg.global_batch % world_size:
        raise ValueError(f"global_batch={cfg.global_batch} must be a multiple of "
                         f"world_size={world_size}")
    train(int(os.environ["RANK"]), world_size, cfg)
    leave()  # sync: exit without teardown (a Gloo thread may still be freeing tensors)


if __name__ == "__main__":
    main()
