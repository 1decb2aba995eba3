"""Read a Horovod timeline (`HOROVOD_TIMELINE=file`): spans per tensor, fused collectives per step.

Horovod writes a Chrome-trace JSON file (Horovod docs, "Horovod Timeline";
`horovod/common/timeline.cc`): each tensor is a "process" (`pid`, named by a
`process_name` metadata event), and each of its phases a `B`/`E` pair: at top level
`NEGOTIATE_ALLREDUCE` (the coordinator waits for every rank's request), then
`ALLREDUCE`, whose activities are `QUEUE`, `MEMCPY_IN_FUSION_BUFFER`, `GLOO_ALLREDUCE`
(the collective itself, on this build) and `MEMCPY_OUT_FUSION_BUFFER`.

1. `parse(text)`: pair each `E` with the last open `B` of its pid -> `Span`s, in seconds
   from the first event, even from a file cut short (a killed job's partial last line);
2. `collectives(spans)`: overlapping `GLOO_ALLREDUCE` spans travelled in one fused buffer
   (the background thread runs one collective at a time): the collectives actually sent;
3. `per_step(...)`: how many collectives each training step made.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Span", "Collective", "parse", "load", "collectives", "per_step", "segments",
           "fusion_buffers"]


@dataclass(frozen=True)
class Span:
    """One phase of one tensor: `name` from `start` to `end` (s), `depth` 0 = top level."""

    tensor: str
    name: str
    start: float
    end: float
    depth: int


@dataclass(frozen=True)
class Collective:
    """One fused collective: the tensors that travelled together, and when."""

    start: float
    end: float
    tensors: tuple[str, ...]


def _events(text: str) -> list[dict]:
    """Step 1: the JSON events, object after object, even from a file whose end was cut off."""
    decoder, events, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in "[], \n\r\t":
            i += 1
        try:
            event, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the end, or a partial last event
        events.append(event)
    return events


def parse(text: str) -> list[Span]:
    """Step 1: every closed `B`/`E` pair as a `Span`, sorted by start."""
    events = _events(text)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M"
             and e.get("name") == "process_name" and "name" in e.get("args", {})}
    t0 = min((e["ts"] for e in events if "ts" in e), default=0)
    open_: dict[int, list[tuple[str, float]]] = {}
    spans = []
    for e in events:
        ph, pid = e.get("ph"), e.get("pid")
        if ph == "B":
            open_.setdefault(pid, []).append((e["name"], (e["ts"] - t0) / 1e6))
        elif ph == "E" and open_.get(pid):
            name, start = open_[pid].pop()
            spans.append(Span(names.get(pid, str(pid)), name, start, (e["ts"] - t0) / 1e6,
                              len(open_[pid])))
    return sorted(spans, key=lambda s: (s.start, s.tensor))


def load(path) -> list[Span]:
    """`parse` the timeline file at `path`."""
    return parse(Path(path).read_text())


def collectives(spans: list[Span], activity: str = "GLOO_ALLREDUCE") -> list[Collective]:
    """Step 2: clusters of overlapping `activity` spans = the fused collectives, in order."""
    out: list[list[Span]] = []
    for s in sorted((s for s in spans if s.name == activity), key=lambda s: s.start):
        if out and s.start <= max(x.end for x in out[-1]):
            out[-1].append(s)
        else:
            out.append([s])
    return [Collective(min(x.start for x in c), max(x.end for x in c),
                       tuple(sorted({x.tensor for x in c}))) for c in out]


def per_step(colls: list[Collective], tensors_per_step: int) -> list[int]:
    """Step 3: collectives per step, a step ending once all `tensors_per_step` tensors went."""
    if tensors_per_step < 1:
        raise ValueError(f"tensors_per_step={tensors_per_step} must be >= 1")
    counts, seen, n = [], 0, 0
    for c in colls:
        n += 1
        seen += len(c.tensors)
        if seen >= tensors_per_step:
            counts.append(n)
            seen, n = 0, 0
    return counts


def segments(spans: list[Span], names=("NEGOTIATE_ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER",
                                       "GLOO_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER")):
    """`(tensor, phase, start, end)` rows of the phases worth drawing, for a plot."""
    return [(s.tensor, s.name, s.start, s.end) for s in spans if s.name in names]


def fusion_buffers(sizes: list[int], backward: float, cycle: float, threshold: int,
                   seconds=lambda nbytes: 0.0, *, starts: bool = False) -> list:
    """Step 4 (a model): the fused buffers Horovod would send for one backward.

    `sizes`: gradient bytes per tensor in backward's order, ready over `backward` s in
    proportion to their bytes. Horovod 0.28.1's background loop (`RunLoopOnce`,
    common/operations.cc:751-760 and 832): a cycle takes every tensor ready by its start,
    packs them into buffers of at most `threshold` bytes (or one tensor) and runs their
    allreduces inside the same loop, `seconds(nbytes)` each; the next cycle starts `cycle` s
    after this one or when its allreduces end, whichever is later (the cycle is a minimum
    period). So tensors that become ready during an allreduce fuse into the next buffer.
    `starts=True`: `(nbytes, start)` pairs instead, `start` (s from the backward's start) when
    the loop begins that buffer's allreduce: its pass's start, after the pass's earlier
    buffers. A schedule must start each buffer there, not when its last byte was ready.
    """
    if not sizes or backward < 0 or cycle <= 0 or threshold < 0:
        raise ValueError("sizes must be non-empty, backward >= 0, cycle > 0 and threshold >= 0")
    ready = [backward * c / sum(sizes) for c in itertools.accumulate(sizes)]
    out, at, i, t = [], [], 0, 0.0
    while i < len(sizes):
        t += cycle * max(0, math.ceil((ready[i] - t) / cycle - 1e-9))  # idle cycles: nothing ready
        first, current = len(out), 0
        while i < len(sizes) and ready[i] <= t + 1e-12:
            if current and current + sizes[i] > threshold:
                out.append(current)
                current = 0
            current, i = current + sizes[i], i + 1
        out.append(current)
        at += itertools.accumulate((seconds(b) for b in out[first:-1]), initial=t)
        t = max(t + cycle, at[-1] + seconds(out[-1]))
    return list(zip(out, at)) if starts else out
