"""Data-parallel training speed: our naive / flat / bucketed strategies vs DDP.

The same `train.run` job for every strategy on one warm `launch.Pool`, alternated round
by round after a warm-up round; steps/s = steps / `train_seconds`; medians. "ddp" is
DDP's own allreduce, "ddp_counted" adds the counting comm hook `train.run` uses.
Targets: bucketed >= 0.95x DDP and >= 0.97x flat (2 ranks, Gloo).
"""

from __future__ import annotations

import statistics

from benchmarks import bar
from syncedu import train
from syncedu.comm import launch

TARGETS = {"ddp": 0.95, "flat": 0.97}  # bucketed / each, at least


def measure(world_size: int = 2, rounds: int = 5, steps: int = 30, hidden: int = 1024,
            depth: int = 3, bucket_mb: float = 4.0, global_batch: int = 128,
            strategies=("ddp", "ddp_counted", "bucketed", "flat", "naive"),
            progress=None) -> dict:
    """Median steps/s of each strategy over `rounds` alternated rounds."""
    job = dict(steps=steps, global_batch=global_batch, lr=0.05, bucket_cap_mb=bucket_mb,
               model_kwargs={"hidden": hidden, "depth": depth}, progress=False)
    rates: dict[str, list[float]] = {s: [] for s in strategies}
    with launch.Pool(world_size, output="quiet") as pool:
        for s in strategies:  # warm-up: imports, allocator, DDP's bucket rebuild
            _run(s, world_size, pool, dict(job, steps=3))
        for _ in range(rounds):
            for s in strategies:
                rates[s].append(_run(s, world_size, pool, job).steps_per_second)
            if progress:
                progress()
    params = sum(p.numel() for p in train.train_rank.models.make(
        "mlp", hidden=hidden, depth=depth).parameters())
    return {"rates": {s: statistics.median(v) for s, v in rates.items()}, "all": rates,
            "world_size": world_size, "rounds": rounds, "steps": steps, "params": params,
            "bucket_mb": bucket_mb, "global_batch": global_batch}


def _run(name: str, world_size: int, pool, job: dict):
    strategy = "ddp" if name.startswith("ddp") else name
    return train.run(strategy, world_size, pool=pool, ddp_hook=name == "ddp_counted", **job)


def report(m: dict) -> str:
    r = m["rates"]
    lines = [f"data-parallel benchmark: world_size={m['world_size']}, MLP with {m['params']:,} "
             f"parameters ({m['params'] * 4 / 2**20:.1f} MiB of gradients), global batch "
             f"{m['global_batch']}, buckets {m['bucket_mb']} MB, median of {m['rounds']} "
             f"rounds x {m['steps']} steps"]
    for s, v in r.items():
        rel = f"  ({v / r['ddp']:.2f}x ddp)" if "ddp" in r else ""
        lines.append(f"  {s:<10}{v:9.1f} steps/s{rel}")
    for other, target in TARGETS.items():
        if other in r and "bucketed" in r:
            ratio = r["bucketed"] / r[other]
            lines.append(f"  bucketed / {other} = {ratio:.2f} (target >= {target}: "
                         f"{'met' if ratio >= target else 'MISSED'})")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--global-batch", type=int, default=128)


def main(args) -> int:
    with bar(args.rounds, "dp rounds") as progress:
        m = measure(args.world_size, args.rounds, args.steps, args.hidden, args.depth,
                    args.bucket_mb, args.global_batch, progress=progress.update)
    print(report(m))
    return 0
