"""Allreduce bandwidth: our algorithms beside the framework's built-in (nccl-tests style).

    python -m benchmarks collectives [--world-size 2 4] [--sizes-mib 1 16 64]
    torchrun --nproc-per-node 2 -m benchmarks collectives     # the same under torchrun
    python -m benchmarks collectives --backend shm --world-size 2 --sizes-mib 16 64

Per size: 1. each algorithm's sum checked exact (small integers); 2. warm-up;
3. `repeat` rounds, every algorithm once per round in a rotating order, each after a
barrier; a round's time is the slowest rank's. Reported: medians, algbw = S / t and
busbw = algbw * 2(N-1)/N (nccl-tests, doc/PERFORMANCE.md), and busbw over the built-in's.
Target: ring_pipelined / builtin >= 1.0 at 16 and 64 MiB on 2 ranks.

`--backend shm` (syncedu/comm/shm.py) runs the transports side by side in the same ranks,
round by round: `gloo_builtin` (torch.distributed's all_reduce on the Gloo group every shm
run keeps, loopback TCP), our algorithms and `builtin` over shared memory, and `memcpy`
(each rank copies S bytes while the others do: the limit a copy-based transport works
against; its "busbw" is S / t). Target: ring_pipelined / gloo_builtin >= 2.0 at 16 and
64 MiB on 2 ranks. `--keep-freed-memory`: the ranks' allocator keeps what they free, so the
receive buffers the algorithms allocate per call (32 MiB at 64 MiB on 2 ranks) stop
page-faulting on every call, for every variant alike.
"""

from __future__ import annotations

import functools
import os
import statistics

import torch

from benchmarks import bar, rotated
from benchmarks import table as text_table
from syncedu import collectives
from syncedu.collectives.cost import algbw, busbw
from syncedu.comm import launch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def rounds(comm, algos: dict, t: torch.Tensor, repeat: int, warmup: int = 1,
           clock=None) -> dict:
    """Steps 1-3 for `algos` {name: fn(t)} on every rank: the result row of `rows`."""
    clock = clock or comm.now  # wall clock on real ranks, logical time on simulated ones
    sync = torch.cuda.synchronize if t.is_cuda else (lambda: None)
    want, ok = sum(r % 3 + 1 for r in range(comm.world_size)), {}
    for name, fn in algos.items():
        t.fill_(comm.rank % 3 + 1)
        fn(t)
        ok[name] = bool((t == want).all())
    t.zero_()
    for _ in range(warmup):
        for fn in algos.values():
            fn(t)
    names, local = list(algos), {name: [] for name in algos}
    for i in range(repeat):
        for name in rotated(names, i):
            comm.barrier()
            sync()
            t0 = clock()
            algos[name](t)
            sync()
            local[name].append(clock() - t0)
    slowest = torch.tensor([local[n] for n in names], dtype=torch.float64, device=t.device)
    comm.all_reduce(slowest, op="max")  # a round takes as long as its slowest rank
    return {"seconds": dict(zip(names, slowest.tolist())), "ok": ok, "nbytes": t.nbytes,
            "world_size": comm.world_size}


def measure(comm, nbytes: int, names, repeat: int = 15, warmup: int = 2,
            dtype: str = "float32", segment_bytes: int | None = None) -> dict:
    """Worker: `rounds` of the algorithms `names` on an `nbytes` tensor."""
    t = torch.zeros(max(1, nbytes // DTYPES[dtype].itemsize), dtype=DTYPES[dtype],
                    device=comm.device)
    copy = torch.empty_like(t)
    algos = {"builtin": lambda c, t: c.all_reduce(t), **collectives.ALGORITHMS,
             "gloo_builtin": lambda c, t: torch.distributed.all_reduce(t),  # shm runs: Gloo's
             "memcpy": lambda c, t: copy.copy_(t)}
    if segment_bytes:
        algos["ring_pipelined"] = functools.partial(collectives.ring_pipelined_allreduce,
                                                    segment_bytes=segment_bytes)
    out = rounds(comm, {n: functools.partial(algos[n], comm) for n in names}, t, repeat, warmup)
    if "memcpy" in names:  # its check: the copy is the tensor (it sums nothing)
        out["ok"]["memcpy"] = bool(torch.equal(copy, t))
    return out


def rows(results: list[dict]) -> list[dict]:
    """Medians, algbw, busbw and busbw ratio to the built-in, one row per (size, algorithm)."""
    out = []
    for res in results:
        n, s = res["world_size"], res["nbytes"]
        med = {name: statistics.median(ts) for name, ts in res["seconds"].items()}
        ref = "gloo_builtin" if "gloo_builtin" in med else "builtin"
        base = busbw("all_reduce", s, med[ref], n) if ref in med else None
        for name, t in med.items():
            bb = algbw(s, t) if name == "memcpy" else busbw("all_reduce", s, t, n)
            out.append({"world_size": n, "nbytes": s, "size": _size(s), "algorithm": name,
                        "seconds": t, "ms": t * 1e3, "algbw": algbw(s, t) / 1e9,
                        "busbw": bb / 1e9, "check": "ok" if res["ok"][name] else "WRONG",
                        "ratio": bb / base if base else float("nan"),
                        "of_memcpy": bb / algbw(s, med["memcpy"]) if "memcpy" in med else
                        float("nan")})
    return out


def table(out: list[dict]) -> str:
    return text_table(out, [("ranks", "world_size", ">5"), ("size", "size", ">10"),
                            ("algorithm", "algorithm", "<17"), ("time ms", "ms", ">9.2f"),
                            ("algbw GB/s", "algbw", ">11.3f"), ("busbw GB/s", "busbw", ">11.3f"),
                            ("vs builtin", "ratio", ">10.2f"), ("of memcpy", "of_memcpy", ">9.2f"),
                            ("check", "check", ">6")])


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"


def target(out: list[dict]) -> str:
    """The target line: pipelined ring vs the built-in's busbw at 16 and 64 MiB, 2 ranks
    (with gloo_builtin measured beside it, the shm target: >= 2.0 over Gloo's)."""
    shm = any(r["algorithm"] == "gloo_builtin" for r in out)
    goal, ref = (2.0, "gloo_builtin") if shm else (1.0, "builtin")
    hits = [r for r in out if r["algorithm"] == "ring_pipelined" and r["world_size"] == 2
            and r["nbytes"] in (16 << 20, 64 << 20)]
    if not hits:
        return f"target: not measured (needs ring_pipelined and {ref}, 2 ranks, 16 and 64 MiB)"
    parts = ", ".join(f"{r['size']}: {r['ratio']:.2f}" for r in hits)
    met = "met" if all(r["ratio"] >= goal for r in hits) else "MISSED"
    return f"target ring_pipelined/{ref} busbw >= {goal} (2 ranks): {parts} -> {met}"


def add_arguments(parser) -> None:
    parser.add_argument("--world-size", type=int, nargs="+", default=[2, 4],
                        help="ranks to start (ignored under torchrun)")
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--algorithms", nargs="+", default=None,
                        choices=["builtin", "gloo_builtin", "memcpy", *collectives.ALGORITHMS],
                        help="default: builtin ring_pipelined ring (shm: gloo_builtin and "
                             "memcpy too)")
    parser.add_argument("--backend", choices=["auto", "gloo", "shm"], default="auto",
                        help="shm: Gloo's built-in and a memcpy beside shared memory")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="ranks' glibc malloc keeps freed memory (MALLOC_MMAP_THRESHOLD_, "
                             "MALLOC_TRIM_THRESHOLD_, mallopt(3)): a fresh 32 MiB buffer then "
                             "does not page-fault on every call; applies to every variant")
    parser.add_argument("--repeat", type=int, default=15, help="timed rounds per size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--segment-mib", type=float, default=None,
                        help="ring_pipelined's segment (default: collectives.SEGMENT_BYTES)")


def main(args) -> int:
    if args.keep_freed_memory:  # inherited by the ranks, read by glibc at their start
        os.environ.update(MALLOC_MMAP_THRESHOLD_=str(1 << 30), MALLOC_TRIM_THRESHOLD_=str(1 << 32))
    seg = int(args.segment_mib * (1 << 20)) if args.segment_mib else None
    names = args.algorithms or (["gloo_builtin", "ring_pipelined", "ring", "builtin", "memcpy"]
                                if args.backend == "shm" else ["builtin", "ring_pipelined", "ring"])
    jobs = [(int(mib * (1 << 20)), tuple(names), args.repeat, args.warmup,
             args.dtype, seg) for mib in args.sizes_mib]
    results = []
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        comm = launch.from_env(args.backend)
        results = [measure(comm, *job) for job in jobs]
        if comm.rank:
            return 0
    else:
        with bar(len(jobs) * len(args.world_size), "sizes") as progress:
            for n in args.world_size:
                with launch.Pool(n, output="quiet", timeout=1800, backend=args.backend) as pool:
                    for job in jobs:
                        results.append(pool.run(measure, args=job)[0])
                        progress.update()
    print(table(rows(results)) + "\n" + target(rows(results)))
    return 0
