"""train.run(..., optimizer="adamw", weight_decay, betas, eps): every strategy that builds
its own optimizer (ZeRO's three stages included) takes it, and equals "flat" DP."""

import pytest
import torch

from syncedu import train
from syncedu.train.optimizers import make_optimizer
from syncedu.zero.stages import ZeroConfig, ZeroDataParallel

KW = dict(steps=3, global_batch=24, lr=0.05, simulate=True, optimizer="adamw",
          weight_decay=0.1, betas=(0.8, 0.99), eps=1e-7)


def test_zero_stages_with_adamw_equal_flat():
    flat = train.run("flat", 3, **KW)
    plain = train.run("flat", 3, **{**KW, "weight_decay": 0.0})
    assert flat.max_param_diff(plain) > 1e-4  # the decay does something
    for stage in ("zero1", "zero2", "zero3"):
        assert train.run(stage, 3, **KW).max_param_diff(flat) < 1e-5, stage


def test_adam_and_sgd_keep_their_meaning():
    cfg = ZeroConfig(optimizer="adamw", weight_decay=0.1, betas=[0.8, 0.9], eps=1e-6)
    opt = make_optimizer([torch.zeros(2, requires_grad=True)], cfg)
    assert isinstance(opt, torch.optim.AdamW) and cfg.betas == (0.8, 0.9)
    assert opt.defaults["weight_decay"] == 0.1 and opt.defaults["eps"] == 1e-6
    sgd = make_optimizer([torch.zeros(2, requires_grad=True)], ZeroConfig(momentum=0.5))
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.5


@pytest.mark.parametrize("field,value", [("weight_decay", -0.1), ("betas", (0.9,)),
                                         ("betas", (0.9, 1.0)), ("eps", 0.0),
                                         ("optimizer", "lamb")])
def test_bad_optimizer_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"{field}="):
        train.run("zero1", 2, steps=1, global_batch=8, simulate=True,
                  **{"optimizer": "adamw", field: value})
    with pytest.raises(ValueError, match=f"{field}="):
        ZeroConfig(**{"optimizer": "adamw", field: value})


def test_betas_are_for_adam_only():
    with pytest.raises(ValueError, match="betas="):
        ZeroDataParallel(torch.nn.Linear(2, 2), None, betas=(0.5, 0.5))
