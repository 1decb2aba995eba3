"""Small models for the lessons: an MLP, a CNN with BatchNorm (for SyncBN), and a small GPT
(lesson 10's sharded transformer: tied embedding, `nn.MultiheadAttention`, LayerNorm)."""

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


class Block(nn.Module):
    """A pre-LayerNorm transformer block: causal self-attention, then a 4x MLP (GPT-2's)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        # No bias: a key bias's gradient is zero but for rounding, which Adam blows up to
        # steps of about lr (a property of attention; lesson 10 compares runs with AdamW).
        self.attn = nn.MultiheadAttention(width, heads, bias=False, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)  # True: masked
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=future, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, `layers` blocks, a final LayerNorm and a head that shares
    the token embedding's weight (tied, as GPT-2's). The defaults: 42,112 parameters, the tied
    embedding 38.9% of them. Input: token ids (batch, time); output: logits (batch, time, vocab)."""

    def __init__(self, vocab: int = 512, context: int = 16, width: int = 32, heads: int = 4,
                 layers: int = 2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied: one tensor, two uses
        nn.init.normal_(self.wte.weight, std=0.02)  # GPT-2's scale: N(0, 1) makes huge logits

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


MODELS = {"mlp": MLP, "cnn": SmallCNN, "gpt": GPT}


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
