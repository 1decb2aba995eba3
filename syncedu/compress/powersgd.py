"""PowerSGD: each gradient matrix sent as two thin rank-r factors, (n + m) r numbers.

Source: Vogels, Karimireddy & Jaggi, NeurIPS 2019 (Algorithm 1), with torch's
`powerSGD_hook` choices, so both send the same bytes: shape (n, ...) is an n x m
matrix, compressed only if (n + m) r * min_compression_rate < n m; the rest is
allreduced plainly in one flat buffer. Steps of `average_` on one bucket:

0. before step `start_iter` allreduce everything plainly (>= 2 under DDP, which
   rebuilds its buckets after step 1: pytorch#51427);
1. M = gradient + this rank's error; allreduce the uncompressed rest;
2. P = M Q, Q from the last step (warm start) or seeded random, equal on all ranks;
3. allreduce all P's (one flat buffer) and orthonormalize each P;
4. Q = M^T P; allreduce all Q's and divide by N;
5. the average is about P Q^T; the error is M - P Q^T.

P P^T M projects M onto span(P): ||M - P Q^T||_F <= ||M||_F, 0 if rank(M) <= r.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from syncedu.comm.runs import check_int
from syncedu.compress.base import Compressor, check_flags
from syncedu.dp.buckets import flatten, unflatten_


@dataclass(frozen=True)
class PowerSGD(Compressor):
    """Rank-`rank` PowerSGD from step `start_iter` on (warm-up: plain allreduce)."""

    rank: int = 1
    start_iter: int = 2
    error_feedback: bool = True
    warm_start: bool = True
    min_compression_rate: float = 2.0
    seed: int = 0
    name: ClassVar[str] = "powersgd"

    def __post_init__(self):
        for pname, low in (("rank", 1), ("start_iter", 0), ("seed", 0)):
            check_int(pname, getattr(self, pname), low)
        check_flags(self, "error_feedback", "warm_start")
        if not self.min_compression_rate >= 1:
            raise ValueError(f"min_compression_rate={self.min_compression_rate!r} must be >= 1")

    def plan(self, shapes) -> list[tuple[int, int, int] | None]:
        """(n, m, r) for each shape worth compressing, None for those sent plainly."""
        out = []
        for shape in shapes:
            n = shape[0] if len(shape) > 1 else 0
            m = torch.Size(shape[1:]).numel()
            r = min(n, m, self.rank)
            out.append((n, m, r) if n and (n + m) * r * self.min_compression_rate < n * m
                       else None)
        return out

    def wire_elements(self, shapes) -> int:
        """Elements this compressor allreduces for tensors of `shapes`: sum of r(n+m) + rest."""
        return sum((p[0] + p[1]) * p[2] if p else torch.Size(shape).numel()
                   for shape, p in zip(shapes, self.plan(shapes)))

    @staticmethod
    def orthonormalize(p: torch.Tensor) -> torch.Tensor:
        """Orthonormal columns spanning p's (reduced QR; Gram-Schmidt in the paper)."""
        return torch.linalg.qr(p).Q

    def compress(self, m: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One power-iteration step on one rank: (orthonormal P, Q = M^T P)."""
        p = self.orthonormalize(m @ q)
        return p, m.t() @ p

    @staticmethod
    def decompress(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """The rank-r approximation P Q^T of a matrix from its two factors."""
        return p @ q.t()

    def residual(self, comm, key: str = "bucket") -> torch.Tensor | None:
        """This rank's error-feedback residual for bucket `key` (None before `start_iter`)."""
        return self._state.get((key, comm.rank), {}).get("error")

    def _step(self, comm, key: str) -> int:
        """This rank's step number, counted from the bucket keys it has seen.

        The invariant: within one step every bucket key comes once, so a key seen again opens
        the next step (torch's hook uses `bucket.is_last()` instead). A key first seen late,
        as after DDP rebuilds its buckets in step 2, joins the current step: it is new to
        `seen`, so it does not advance the count. Each (key, step) then draws its own seeded
        Q, identical on every rank without a broadcast (`_fresh_q`).
        """
        st = self.state(comm, ("steps",), lambda: {"step": 0, "seen": set()})
        if key in st["seen"]:
            st["step"] += 1
            st["seen"] = set()
        st["seen"].add(key)
        return st["step"]

    def _fresh_q(self, key: str, step: int, m: int, r: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(key.encode())
                                          + 7919 * step)
        return torch.randn(m, r, generator=g)

    def average_(self, comm, tensors, key="bucket") -> None:
        tensors = list(tensors)
        if not tensors:
            return
        n = comm.world_size
        step = self._step(comm, key)
        if step < self.start_iter:                            # Step 0
            unflatten_(tensors, comm.all_reduce(flatten(tensors)).div_(n))
            return
        st = self.state(comm, key, dict)
        grads = flatten(tensors)
        if self.error_feedback:                               # Step 1
            error = st.get("error")  # none yet, or stale after DDP rebuilt its buckets
            grads = grads + (error if error is not None and error.shape == grads.shape else 0)
        parts = list(grads.split([t.numel() for t in tensors]))
        plan = self.plan([t.shape for t in tensors])
        rest = [i for i, p in enumerate(plan) if p is None]
        if rest:
            plain = comm.all_reduce(torch.cat([parts[i] for i in rest])).div_(n)
            for i, chunk in zip(rest, plain.split([parts[i].numel() for i in rest])):
                parts[i] = chunk
        mats = [(i, parts[i].view(p[0], p[1]), p[2]) for i, p in enumerate(plan) if p]
        if mats:
            approx = self.compress_matrices(comm, st, key, step, mats)
            for (i, _, _), a in zip(mats, approx):
                parts[i] = a.reshape(-1)
        out = torch.cat(parts)
        if self.error_feedback:                               # Step 5 (error)
            error = list((grads - out).split([t.numel() for t in tensors]))
            for i in rest:  # sent exactly: no compression error to carry over
                error[i] = torch.zeros_like(error[i])
            st["error"] = torch.cat(error)
        unflatten_(tensors, out)

    def compress_matrices(self, comm, st, key, step, mats):
        n = comm.world_size
        qs = st.get("q") if self.warm_start else None
        if qs is None or [q.shape for q in qs] != [(m.shape[1], r) for _, m, r in mats]:
            qs = [self._fresh_q(f"{key}/{i}", step, m.shape[1], r) for i, m, r in mats]
        else:
            qs = [self.orthonormalize(q) for q in qs]
        ps = [m @ q for (_, m, _), q in zip(mats, qs)]        # Step 2
        flat_p = comm.all_reduce(flatten(ps))                 # Step 3
        ps = [self.orthonormalize(p) for p in _split_like(flat_p, ps)]
        qs = [m.t() @ p for (_, m, _), p in zip(mats, ps)]    # Step 4
        flat_q = comm.all_reduce(flatten(qs)).div_(n)
        qs = _split_like(flat_q, qs)
        if self.warm_start:
            st["q"] = qs
        return [self.decompress(p, q) for p, q in zip(ps, qs)]  # Step 5


def _split_like(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    return [c.view_as(t) for c, t in zip(flat.split([t.numel() for t in like]), like)]
