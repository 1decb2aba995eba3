"""Allreduce bandwidth: our algorithms beside the framework's built-in (nccl-tests style).

    python -m syncedu.bench collectives [--world-size 2 4] [--sizes-mib 1 16 64]
        [--algorithms builtin ring_pipelined ring] [--repeat 15] [--dtype float32]
    torchrun --nproc-per-node 2 -m syncedu.bench collectives     # the same under torchrun

For each size, every algorithm runs once per round, in an order that rotates
round by round (so drift on a busy machine hits all alike), after a barrier;
a round's time is the slowest rank's. Reported: medians over rounds, algbw =
S / t and busbw = algbw * 2(N-1)/N (nccl-tests, doc/PERFORMANCE.md), and each
algorithm's busbw divided by the built-in's. Results are checked against the
exact sum before timing.

Target (issue 4): ring_pipelined / builtin busbw >= 1.0 at 16 and 64 MiB with 2
ranks. The plain ring ("ring", whole chunks, one step at a time) is there to
show what the pipelining buys.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys

import torch

from syncedu import collectives
from syncedu.collectives.cost import algbw, busbw
from syncedu.comm import launch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _builtin(comm, tensor):
    """The framework's own all_reduce (Gloo/NCCL), the baseline."""
    comm.all_reduce(tensor)


def _algorithms(comm, names, segment_bytes):
    table = {"builtin": _builtin, **collectives.ALGORITHMS}
    if segment_bytes:
        table["ring_pipelined"] = functools.partial(collectives.ring_pipelined_allreduce,
                                                    segment_bytes=segment_bytes)
    return {name: functools.partial(table[name], comm) for name in names}


def _sync(comm) -> None:
    if comm.device.type == "cuda":
        torch.cuda.synchronize()


def measure(comm, nbytes: int, names, repeat: int = 15, warmup: int = 2,
            dtype: str = "float32", segment_bytes: int | None = None) -> dict:
    """Worker: {algorithm: [seconds per round]} (slowest rank per round) and a check."""
    dt = DTYPES[dtype]
    numel = max(1, nbytes // torch.empty((), dtype=dt).element_size())
    algos = _algorithms(comm, names, segment_bytes)
    t = torch.zeros(numel, dtype=dt, device=comm.device)
    ok = {}
    for name, fn in algos.items():  # 1. correctness: small integers sum exactly
        t.fill_(comm.rank % 3 + 1)
        fn(t)
        want = sum(r % 3 + 1 for r in range(comm.world_size))
        ok[name] = bool((t == want).all())
    t.zero_()
    for _ in range(warmup):  # 2. warm-up: buffers, connections, caches
        for fn in algos.values():
            fn(t)
    local = {name: [] for name in algos}
    names = list(algos)
    for i in range(repeat):  # 3. timed rounds, order rotating each round
        for name in names[i % len(names):] + names[: i % len(names)]:
            comm.barrier()
            _sync(comm)
            t0 = comm.now()  # wall clock on real ranks, logical time on simulated ones
            algos[name](t)
            _sync(comm)
            local[name].append(comm.now() - t0)
    slowest = torch.tensor([local[n] for n in names], dtype=torch.float64, device=comm.device)
    comm.all_reduce(slowest, op="max")  # 4. a round takes as long as its slowest rank
    return {"seconds": dict(zip(names, slowest.tolist())), "ok": ok,
            "nbytes": numel * t.element_size(), "world_size": comm.world_size}


def rows(results: list[dict]) -> list[dict]:
    """Medians, algbw, busbw and busbw ratio to the built-in, one row per (size, algorithm)."""
    out = []
    for res in results:
        n, s = res["world_size"], res["nbytes"]
        med = {name: statistics.median(ts) for name, ts in res["seconds"].items()}
        base = busbw("all_reduce", s, med["builtin"], n) if "builtin" in med else None
        for name, t in med.items():
            bb = busbw("all_reduce", s, t, n)
            out.append({"world_size": n, "nbytes": s, "algorithm": name, "seconds": t,
                        "algbw": algbw(s, t), "busbw": bb, "ok": res["ok"][name],
                        "ratio": bb / base if base else float("nan")})
    return out


def table(out: list[dict]) -> str:
    head = (f"{'ranks':>5} {'size':>10} {'algorithm':<17} {'time ms':>9} {'algbw GB/s':>11} "
            f"{'busbw GB/s':>11} {'vs builtin':>10} {'check':>6}")
    lines = [head, "-" * len(head)]
    for r in out:
        lines.append(f"{r['world_size']:>5} {_size(r['nbytes']):>10} {r['algorithm']:<17} "
                     f"{r['seconds'] * 1e3:>9.2f} {r['algbw'] / 1e9:>11.3f} "
                     f"{r['busbw'] / 1e9:>11.3f} {r['ratio']:>10.2f} "
                     f"{'ok' if r['ok'] else 'WRONG':>6}")
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"


def target(out: list[dict]) -> str:
    """The issue's target line: pipelined ring vs builtin busbw at 16 and 64 MiB, 2 ranks."""
    hits = [r for r in out if r["algorithm"] == "ring_pipelined" and r["world_size"] == 2
            and r["nbytes"] in (16 << 20, 64 << 20)]
    if not hits:
        return "target: not measured (needs ring_pipelined and builtin, 2 ranks, 16 and 64 MiB)"
    parts = [f"{_size(r['nbytes'])}: {r['ratio']:.2f}" for r in hits]
    met = all(r["ratio"] >= 1.0 for r in hits)
    return f"target ring_pipelined/builtin busbw >= 1.0 (2 ranks): {', '.join(parts)} -> " \
           f"{'met' if met else 'MISSED'}"


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", type=int, nargs="+", default=[2, 4],
                        help="ranks to start (ignored under torchrun)")
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--algorithms", nargs="+", default=["builtin", "ring_pipelined", "ring"],
                        choices=["builtin", *collectives.ALGORITHMS])
    parser.add_argument("--repeat", type=int, default=15, help="timed rounds per size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--segment-mib", type=float, default=None,
                        help="ring_pipelined's segment (default: collectives.SEGMENT_BYTES)")


def _jobs(args):
    seg = int(args.segment_mib * (1 << 20)) if args.segment_mib else None
    return [(int(mib * (1 << 20)), tuple(args.algorithms), args.repeat, args.warmup,
             args.dtype, seg) for mib in args.sizes_mib]


def main(args) -> int:
    from tqdm import tqdm

    jobs = _jobs(args)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        comm = launch.from_env()
        results = []
        for job in tqdm(jobs, desc="sizes", file=sys.stderr, disable=comm.rank != 0):
            results.append(measure(comm, *job))
        if comm.rank == 0:
            print(table(rows(results)) + "\n" + target(rows(results)))
        return 0
    results = []
    with tqdm(total=len(jobs) * len(args.world_size), desc="sizes", file=sys.stderr) as bar:
        for n in args.world_size:
            with launch.Pool(n, output="quiet", timeout=1800) as pool:
                for job in jobs:
                    results.append(pool.run(measure, args=job)[0])
                    bar.update()
    out = rows(results)
    print(table(out) + "\n" + target(out))
    return 0
