"""A rank dies, torchrun's elastic agent restarts the group, training resumes from the checkpoint.

    python examples/elastic_ddp.py --launch          # the whole demo, with a timeout
    torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 1 --monitor-interval 0.5 \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT \\
        examples/elastic_ddp.py --checkpoint ckpt.pt --out out.pt

Run it by its path (from the repository's root, as above), or import it with
`syncedu.ui.show.program("elastic_ddp")`: it imports its sibling `ddp_program` as a plain
module, which needs this folder on `sys.path` (not `python -m examples.elastic_ddp`).

Lesson 03's DDP program (`ddp_program`'s setup and checkpoints) in which, on the first
attempt, rank `crash_rank` exits halfway through epoch `crash_epoch` (the half epoch it had
trained since the last checkpoint is lost, and redone). Then (PyTorch's "torchrun
(Elastic Launch)" documentation):

1. the agent, polling every `--monitor-interval` s, sees rank 1 exit non-zero (rank 0,
   blocked in an allreduce with a dead peer, fails too);
2. it stops the survivors and, while `--max-restarts` allow, starts the group again,
   `TORCHELASTIC_RESTART_COUNT` one higher;
3. every rank loads the last checkpoint (taken at epoch ends: the restarted run sees the
   batches of an uninterrupted one) and trains the epochs left;
4. rank 0 writes the final parameters, the attempt and the epoch it resumed at.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import ddp_program  # its sibling in examples/ (a script's folder is first on sys.path)
import psutil
import torch
import torch.nn.functional as F
from ddp_program import Config
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from syncedu.comm.runs import check_int
from syncedu.train import data, models


def worker(cfg: Config, crash_rank: int = 1, crash_epoch: int = 1) -> None:
    """One rank's job under torchrun; on attempt 0, `crash_rank` dies halfway through `crash_epoch`."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # sync: set by the agent
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = ddp_program.setup(rank, world_size, cfg.timeout)
    try:
        model = DDP(models.make("mlp", seed=cfg.seed).to(device))  # sync: rank 0's weights
        dataset = data.digits()
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank,  # sync
                                     shuffle=True, seed=cfg.seed, drop_last=True)
        loader = DataLoader(dataset, batch_size=cfg.global_batch // world_size,
                            sampler=sampler, drop_last=True)
        opt = ddp_program._optimizer(model.parameters(), cfg)  # the program's: SGD by default
        start = ddp_program.resume_checkpoint(model, opt, cfg, device)  # Step 3: 0 on a fresh start
        for epoch in range(start, cfg.epochs):
            sampler.set_epoch(epoch)  # sync: the same shuffle as an uninterrupted run
            for i, (x, y) in enumerate(loader):
                if attempt == 0 and rank == crash_rank and epoch == crash_epoch and i == len(loader) // 2:
                    os._exit(1)  # the failure on purpose, mid-epoch: this process just vanishes
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x.to(device)), y.to(device)).backward()  # sync: allreduce
                opt.step()
            ddp_program.save_checkpoint(model, opt, epoch + 1, cfg, rank)  # sync: + barrier
        if rank == 0 and cfg.out:  # Step 4
            params = {k: v.detach().cpu().clone() for k, v in model.module.named_parameters()}
            torch.save({"params": params, "attempt": attempt, "resumed_at": start}, cfg.out)
    finally:
        ddp_program.cleanup()


@dataclass(frozen=True)
class ElasticResult:
    """What `launch_elastic` saw: torchrun's exit code, rank 0's result, the time it took."""

    returncode: int
    params: dict
    attempt: int  # TORCHELASTIC_RESTART_COUNT of the attempt that finished
    resumed_at: int  # the epoch that attempt started from (0: from scratch)
    seconds: float
    output: str


def _stop(proc: subprocess.Popen) -> None:
    """Stop torchrun (SIGTERM, then SIGKILL) and every worker it started: each in a session
    of its own (`start_new_session=True`), so torchrun's process group misses them."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:  # torchrun already exited (and was reaped)
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
            break
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(family, timeout=5)


def launch_elastic(*, nproc: int = 2, max_restarts: int = 1, crash_rank: int | None = 1,
                   crash_epoch: int = 1, epochs: int = 2, global_batch: int = 64,
                   lr: float = 0.1, monitor_interval: float = 0.5, timeout: float = 120.0,
                   workdir: str | None = None) -> ElasticResult:
    """Run the job under torchrun (`crash_rank=None`: no failure) on 127.0.0.1 and a free
    port; raise if it fails or hangs, and leave no process behind."""
    for name, value, low in (("nproc", nproc, 1), ("epochs", epochs, 1),
                             ("max_restarts", max_restarts, 0), ("global_batch", global_batch, 1)):
        check_int(name, value, low)
    if crash_rank is not None and not 0 <= crash_rank < nproc:
        raise ValueError(f"crash_rank={crash_rank!r} must be None or in 0..{nproc - 1}")
    if not 0 <= crash_epoch < epochs:
        raise ValueError(f"crash_epoch={crash_epoch!r} must be in 0..{epochs - 1}")
    if not timeout > 0 or not monitor_interval > 0:
        raise ValueError(f"timeout={timeout!r} and monitor_interval={monitor_interval!r} "
                         "must be > 0")
    work = Path(workdir or tempfile.mkdtemp(prefix="syncedu-elastic-"))
    ckpt, out = work / "elastic_ckpt.pt", work / "elastic_out.pt"
    for f in (ckpt, out):
        f.unlink(missing_ok=True)  # a fresh job: no checkpoint from an earlier run
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
           "--monitor-interval", str(monitor_interval), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{ddp_program.free_port()}", "--rdzv-id",
           uuid.uuid4().hex, "--local-addr", "127.0.0.1", os.path.abspath(__file__),
           "--checkpoint", str(ckpt), "--out", str(out), "--epochs", str(epochs),
           "--global-batch", str(global_batch), "--lr", str(lr),
           "--crash-rank", str(-1 if crash_rank is None else crash_rank),
           "--crash-epoch", str(crash_epoch), "--timeout", str(min(timeout, 60.0))]
    # A store of its own for each attempt: with the agent's shared across restarts (torch's
    # default since 2.4), a restarted rank can read the dead attempt's Gloo address
    # ("connectFullMesh failed ... Connection refused"; pytorch/pytorch#135712).
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=work, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"torchrun was still running after timeout={timeout} s; "
                           "its processes were stopped") from None
    finally:
        _stop(proc)  # no worker may outlive torchrun (also stops a hung one before the raise)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{output[-3000:]}")
    res = torch.load(out)
    return ElasticResult(proc.returncode, res["params"], res["attempt"], res["resumed_at"],
                         seconds, output)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python examples/elastic_ddp.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--launch", action="store_true", help="run the whole demo under torchrun")
    p.add_argument("--checkpoint", help="save after each epoch; resume if it exists")
    p.add_argument("--out", help="rank 0 writes the final parameters here")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--crash-rank", type=int, default=1, help="-1: nobody crashes")
    p.add_argument("--crash-epoch", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take")
    a = p.parse_args(argv)
    if a.launch:
        r = launch_elastic(epochs=a.epochs, global_batch=a.global_batch, lr=a.lr,
                           crash_rank=None if a.crash_rank < 0 else a.crash_rank,
                           crash_epoch=a.crash_epoch)
        print(f"finished on attempt {r.attempt}, resumed at epoch {r.resumed_at}, "
              f"{r.seconds:.1f} s")
    elif "RANK" not in os.environ:
        sys.exit("no RANK in the environment: pass --launch, or start it with torchrun")
    else:
        worker(Config(epochs=a.epochs, global_batch=a.global_batch, lr=a.lr,
                      checkpoint=a.checkpoint, out=a.out, timeout=a.timeout),
               a.crash_rank, a.crash_epoch)
        ddp_program.leave()  # no teardown for Gloo's threads to abort in (see leave())


if __name__ == "__main__":
    main()
