"""Small models for the lessons: an MLP, and a CNN with BatchNorm (for SyncBN)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """in -> (hidden -> ReLU) x depth -> classes."""

    def __init__(self, in_features: int = 64, hidden: int = 64, classes: int = 10,
                 depth: int = 2):
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1")
        layers, width = [], in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of images `x` (flattened to vectors first)."""
        return self.net(x.flatten(1))


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks with BatchNorm on 8x8 images, then a linear classifier."""

    def __init__(self, channels: int = 8, classes: int = 10, in_channels: int = 1,
                 batchnorm: bool = True):
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            norm = nn.BatchNorm2d(cout) if batchnorm else nn.Identity()
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=not batchnorm), norm, nn.ReLU()]

        self.features = nn.Sequential(*block(in_channels, channels), *block(channels, channels),
                                      nn.MaxPool2d(2))
        self.head = nn.Linear(channels * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of images `x`: convolutions, then the linear head."""
        return self.head(self.features(x).flatten(1))


MODELS = {"mlp": MLP, "cnn": SmallCNN}


def make(name: str = "mlp", *, seed: int = 0, **kwargs) -> nn.Module:
    """Model `name` with initial weights fixed by `seed`: every rank starts alike."""
    if name not in MODELS:
        raise ValueError(f"model {name!r} is unknown; choose one of {sorted(MODELS)}")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return MODELS[name](**kwargs)
    finally:
        torch.random.set_rng_state(state)  # don't disturb the caller's random stream
