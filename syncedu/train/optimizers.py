"""The optimizers a config can name: "sgd", "adam", "adamw", and their options, checked once.

Shared by `TrainConfig` and ZeRO's config, so "adamw" means torch.optim.AdamW everywhere
(decoupled weight decay, Loshchilov & Hutter, ICLR 2019); "adam" and "sgd" add
`weight_decay` * p to the gradient, as torch does.
"""

from __future__ import annotations

import torch

from syncedu.comm.runs import check_choice, check_number

OPTIMIZERS = ("sgd", "adam", "adamw")
DEFAULT_BETAS, DEFAULT_EPS = (0.9, 0.999), 1e-8


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_optimizer_options(cfg) -> None:
    """Check `cfg`'s optimizer, lr, momentum, weight_decay, betas and eps (a list of betas
    becomes a tuple)."""
    check_choice("optimizer", cfg.optimizer, OPTIMIZERS)
    if not cfg.lr > 0:
        raise ValueError(f"lr={cfg.lr!r} must be > 0")
    if not 0 <= cfg.momentum < 1 or (cfg.momentum and cfg.optimizer != "sgd"):
        raise ValueError(f"momentum={cfg.momentum!r} must be in [0, 1), and 0 unless "
                         f"optimizer='sgd' (Adam keeps its own moments)")
    if isinstance(cfg.betas, list):
        object.__setattr__(cfg, "betas", tuple(cfg.betas))
    check_number("weight_decay", cfg.weight_decay, 0)
    if not (isinstance(cfg.betas, tuple) and len(cfg.betas) == 2
            and all(_number(b) and 0 <= b < 1 for b in cfg.betas)):
        raise ValueError(f"betas={cfg.betas!r} must be two numbers in [0, 1)")
    if not (_number(cfg.eps) and cfg.eps > 0):
        raise ValueError(f"eps={cfg.eps!r} must be a number > 0")
    if cfg.optimizer == "sgd" and (cfg.betas != DEFAULT_BETAS or cfg.eps != DEFAULT_EPS):
        raise ValueError(f"betas={cfg.betas!r} and eps={cfg.eps!r} apply to optimizer='adam' "
                         f"or 'adamw' only; leave them at their defaults for 'sgd'")


def make_optimizer(params, cfg) -> torch.optim.Optimizer:
    """SGD(lr, momentum, weight_decay) or Adam / AdamW(lr, betas, eps, weight_decay)."""
    if cfg.optimizer in ("adam", "adamw"):
        cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
        return cls(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
