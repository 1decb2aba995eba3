"""Gradient compressors: compression ratio, compute cost per MB, time per step on real ranks.

Per compressor and gradient size (one square-ish fp32 matrix, for PowerSGD): ratio =
fp32 allreduce bytes / bytes it sent (rank 0's ledger); compute ms/MB = its `average_`
on one rank alone (`syncedu.compress.cost.Alone`: no traffic); step ms = `average_` on 2
real ranks, median over rounds that alternate the compressors, after a barrier
(`syncedu.compress.cost.timed`, which lesson 07 runs too).
"""

from __future__ import annotations

import math

import torch

from benchmarks import table
from syncedu.comm import launch, sim
from syncedu.comm.ledger import ring_allreduce_elements
from syncedu.compress import PowerSGD, SignSGD, TopK
from syncedu.compress.cost import Alone, average, timed


def compressors() -> dict:
    """Name -> compression spec (None: the fp32 allreduce baseline)."""
    return {"fp32": None, "fp16": "fp16", "bf16": "bf16", "topk 1%": TopK(0.01),
            "signsgd": SignSGD(), "powersgd r4": PowerSGD(4, start_iter=0)}


def _shape(size_mb: float) -> tuple[int, int]:
    side = max(2, int(math.sqrt(size_mb * 2**20 / 4)))
    return side, side


def _one(comm, spec, shape) -> None:
    average(comm, spec, torch.randn(*shape))


def measure(sizes_mb=(1, 16), rounds: int = 5, repeats: int = 5, world_size: int = 2,
            specs: dict | None = None) -> list[dict]:
    """One row per (compressor, size): ratio, compute ms/MB, step ms on real ranks."""
    specs = compressors() if specs is None else specs
    rows = []
    with launch.Pool(world_size, output="quiet") as pool:
        for size in sizes_mb:
            shape = _shape(size)
            mb = shape[0] * shape[1] * 4 / 2**20
            alone = timed(Alone(), specs, shape, repeats, rounds)
            step = pool.run(timed, args=(specs, shape, repeats, rounds), timeout=600)[0]
            for name, spec in specs.items():
                sent = sim.run(_one, world_size, args=(spec, shape)).ledger.sent[0]
                rows.append({"compressor": name, "size_mb": mb, "shape": shape,
                             "ratio": 4 * ring_allreduce_elements(shape[0] * shape[1],
                                                                  world_size, 0)[0] / sent,
                             "compute_ms_per_mb": alone[name] * 1e3 / mb,
                             "step_ms": step[name] * 1e3})
    return rows


def report(rows: list[dict], world_size: int = 2) -> str:
    base = {r["size_mb"]: r["step_ms"] for r in rows if r["compressor"] == "fp32"}
    rows = [dict(r, rel=r["step_ms"] / base.get(r["size_mb"], float("nan"))) for r in rows]
    return (f"compression benchmark: {world_size} real ranks (Gloo), one fp32 matrix per "
            "step; ratio from the ledger, compute on one rank alone, step = average_ "
            "(median)\n" + table(rows, [
                ("compressor", "compressor", "<12"), ("MiB", "size_mb", ">6.1f"),
                ("ratio", "ratio", ">8.1f"), ("compute ms/MB", "compute_ms_per_mb", ">14.2f"),
                ("step ms", "step_ms", ">9.2f"), ("vs fp32", "rel", ">8.2f")]))


def add_arguments(parser) -> None:
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 16.0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)


def main(args) -> int:
    rows = measure(tuple(args.sizes_mb), args.rounds, args.repeats, args.world_size)
    print(report(rows, args.world_size))
    return 0
