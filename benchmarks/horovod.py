"""Horovod beside torch.distributed, in the same ranks: allreduce busbw and training steps/s.

One `horovod.run` job whose ranks also join a torch.distributed Gloo group, so both
libraries run on the same processes, cores and loopback, alternated round by round:

1. allreduce of S bytes: "builtin" (Gloo), "ring" (ours) and "horovod" (`hvd.allreduce_`),
   timed as `bench collectives` times them (busbw = algbw * 2(N-1)/N, nccl-tests);
2. training: the same `train.run` job with "horovod" and "ddp" (DDP's own allreduce, no
   counting hook), alternated; steps/s = steps / train_seconds; medians after a warm-up.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist

from benchmarks.collectives import rounds as timed_rounds
from benchmarks.collectives import rows, table
from syncedu import collectives
from syncedu.comm import TorchComm
from syncedu.comm.launch import free_port
from syncedu.horovod import launch as horovod_launch
from syncedu.horovod import training as horovod_train
from syncedu.train import train_rank
from syncedu.train.config import TrainConfig


def _join_torch(hvd):
    """Step 0: a torch.distributed Gloo group on the Horovod ranks; a TorchComm on it."""
    # name= is needed: by default it is the object's type name, "int" on rank 0 and
    # "NoneType" elsewhere, and tensor names that differ between ranks hang Horovod.
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0,
                                name="torch_port")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # else Gloo may pick an unreachable NIC
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=hvd.rank(),
                            world_size=hvd.size(), timeout=datetime.timedelta(seconds=120))
    return TorchComm()


def _busbw(comm, hvd, nbytes: int, repeat: int) -> dict:
    """Step 1 for one size: `bench.collectives.rounds` of the three allreduces."""
    numel = max(1, nbytes // 4)
    name = f"bench.{numel}"  # the same name on every rank (names that differ hang Horovod)
    algos = {"builtin": lambda t: dist.all_reduce(t),
             "ring": lambda t: collectives.ALGORITHMS["ring"](comm, t),
             "horovod": lambda t: hvd.allreduce_(t, op=hvd.Sum, name=name)}
    return timed_rounds(comm, algos, torch.zeros(numel), repeat, clock=time.perf_counter)


def _steps_per_second(comm, hvd, job: dict, rounds: int) -> dict:
    """Step 2: {"horovod": [steps/s per round], "ddp": [...]}, warm-up round dropped."""
    rates = {"horovod": [], "ddp": []}
    for r in range(rounds + 1):
        for strategy in (("horovod", "ddp") if r % 2 else ("ddp", "horovod")):
            cfg = TrainConfig(strategy=strategy, world_size=comm.world_size, ddp_hook=False,
                              **job)
            rank_comm = horovod_train.HorovodComm(hvd) if strategy == "horovod" else comm
            session = train_rank.Session(rank_comm, cfg)
            session.run(0, cfg.steps)
            session.result()
            if r:
                rates[strategy].append(cfg.steps / session.elapsed)
    slowest = torch.tensor([rates["horovod"], rates["ddp"]], dtype=torch.float64)
    comm.all_reduce(slowest, op="min")  # a round is as fast as its slowest rank
    return {"horovod": slowest[0].tolist(), "ddp": slowest[1].tolist()}


def _rank(sizes, repeat: int, job: dict, rounds: int) -> dict:
    import horovod.torch as hvd

    hvd.init()
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.size()))
        comm = _join_torch(hvd)
        out = {"collectives": [_busbw(comm, hvd, s, repeat) for s in sizes]}
        out["training"] = _steps_per_second(comm, hvd, job, rounds) if rounds else None
        dist.destroy_process_group()
        return out
    finally:
        hvd.shutdown()


def measure(world_size: int = 2, sizes_mib=(1, 16), repeat: int = 10, rounds: int = 5,
            steps: int = 30, hidden: int = 512, depth: int = 3, global_batch: int = 128,
            timeout: float = 900.0) -> dict:
    """Run the benchmark in one Horovod job; rank 0's merged numbers."""
    if rounds < 0 or repeat < 1:
        raise ValueError(f"rounds={rounds} must be >= 0 and repeat={repeat} >= 1")
    job = dict(steps=steps, global_batch=global_batch, lr=0.05,
               model_kwargs={"hidden": hidden, "depth": depth})
    sizes = [int(m * 2**20) for m in sizes_mib]
    res = horovod_launch.run(_rank, world_size, args=(sizes, repeat, job, rounds),
                             timeout=timeout)[0]
    res["rows"] = rows(res["collectives"])
    res["job"], res["world_size"] = job, world_size
    if res["training"]:
        res["rates"] = {k: statistics.median(v) for k, v in res["training"].items()}
    return res


def report(m: dict) -> str:
    lines = [table(m["rows"])]
    if m.get("rates"):
        r, j, kw = m["rates"], m["job"], m["job"]["model_kwargs"]
        lines += ["", f"training, {m['world_size']} ranks, MLP hidden={kw['hidden']} "
                  f"depth={kw['depth']}, global batch {j['global_batch']}, "
                  f"{j['steps']} steps, median of {len(m['training']['ddp'])} rounds:",
                  f"  horovod {r['horovod']:8.1f} steps/s", f"  ddp     {r['ddp']:8.1f} steps/s",
                  f"  horovod / ddp = {r['horovod'] / r['ddp']:.2f}"]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeat", type=int, default=10, help="timed allreduces per size")
    parser.add_argument("--rounds", type=int, default=5, help="training rounds (0: none)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the job")


def main(args) -> int:
    ok, why = horovod_launch.available()
    if not ok:
        print(f"skipped: {why}")
        return 0
    m = measure(args.world_size, args.sizes_mib, args.repeat, args.rounds, args.steps,
                args.hidden, args.depth, timeout=args.timeout)
    print(report(m))
    return 0 if all(r["check"] == "ok" for r in m["rows"]) else 1  # a wrong sum fails it
