"""The gradient noise scale, measured during data-parallel training for one extra scalar.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training"
(arXiv 1812.06162), Appendix A.1: a batch of B samples has E|G_B|^2 = |G|^2 +
tr(Sigma) / B; measured at two batches, that solves for |G|^2 and tr(Sigma), and
B_simple = tr(Sigma) / |G|^2 predicts the critical batch size. Data parallelism has
both batches: each rank's gradient (b = B / N) and the allreduced one (B). Steps:

1. each rank computes the squared norm of its local gradient;
2. it appends that number to the flat gradient, so one allreduce (averaging)
   returns the big-batch gradient and the mean small-batch squared norm;
3. every rank solves the two equations (the same numbers everywhere);
4. the single-step estimates are noisy (even negative), so |G|^2 and tr(Sigma)
   are averaged over steps (an EMA here) and B_simple is their ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def two_batch(small_sq: float, big_sq: float, b_small: float, b_big: float) -> tuple[float, float]:
    """Step 3: (|G|^2, tr(Sigma)) from squared gradient norms at batches b_small < b_big."""
    if not 0 < b_small < b_big:
        raise ValueError(f"b_small={b_small!r} and b_big={b_big!r} must satisfy "
                         "0 < b_small < b_big")
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return g2, trace


def allreduce_with_norms(comm, flat_grad: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Steps 1-2: average `flat_grad` over the ranks in place; return it and mean |g_r|^2.

    `flat_grad` is this rank's local gradient (the mean over its own samples)
    as one float32 vector; one allreduce of numel + 1 elements does both.
    """
    local_sq = flat_grad.double().pow(2).sum().to(flat_grad.dtype)  # Step 1
    buf = torch.cat([flat_grad, local_sq.reshape(1)])  # Step 2: one extra scalar
    comm.all_reduce(buf, op="avg")
    flat_grad.copy_(buf[:-1])
    return flat_grad, float(buf[-1])


@dataclass
class NoiseScale:
    """Step 4: running estimates of |G|^2, tr(Sigma) and B_simple from each step's norms."""

    ema: float = 0.9  # weight of the past in the moving averages (0: no averaging)
    g2: float = 0.0
    trace: float = 0.0
    steps: int = 0
    history: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 <= self.ema < 1:
            raise ValueError(f"ema={self.ema!r} must be in [0, 1)")

    def update(self, small_sq: float, big_sq: float, b_small: float, b_big: float) -> float:
        """Fold one pair of gradient norms into the running estimates; the new B_simple."""
        g2, trace = two_batch(small_sq, big_sq, b_small, b_big)
        self.g2 = self.ema * self.g2 + (1 - self.ema) * g2
        self.trace = self.ema * self.trace + (1 - self.ema) * trace
        self.steps += 1
        self.history.append(self.b_simple)
        return self.b_simple

    @property
    def b_simple(self) -> float:
        """tr(Sigma) / |G|^2 of the averages (bias of the EMA's zero start cancels in the ratio)."""
        if not self.steps or self.g2 <= 0:
            return float("nan")
        return self.trace / self.g2
