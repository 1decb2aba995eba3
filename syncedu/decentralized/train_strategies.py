"""This topic's `train.run` strategies, registered:

1. "dpsgd" (`topology=`): D-PSGD (Lian, Zhang, Zhang, Hsieh, Zhang & Liu, "Can Decentralized
   Algorithms Outperform Centralized Algorithms?", NeurIPS 2017): each rank takes its local
   optimizer step, then one gossip round of its parameters with its neighbours:
   x_{k+1} = W (x_k - lr g_k), the "adapt-then-combine" order of diffusion methods (Sayed,
   "Adaptation, Learning, and Optimization over Networks", 2014); the paper's Algorithm 1
   takes x_{k+1} = W x_k - lr g_k, which lets the gossip overlap the gradient computation.
   No global collective while training; at
   the end one exact average, so the history's parameters are the ranks' mean (the model the
   paper's rate is stated for) and every rank holds it.
2. "streaming_diloco" (`inner_steps=H`, `fragments=F`, `strategy_config=StreamingConfig(...)`):
   streaming.py, the harness's optimizer as the inner one (`optimizer=`, `lr=`).
"""

from __future__ import annotations

import torch

from syncedu.decentralized.gossip import check_topology, gossip
from syncedu.decentralized.streaming import StreamingConfig, StreamingDiLoCo, check_schedule, layers
from syncedu.train import models
from syncedu.train.strategies import Parts, make_optimizer, register
from syncedu.tuning.local_sgd import average_parameters, broadcast_state, copy_flat


def _check_dpsgd(cfg) -> None:
    check_topology(cfg.topology, cfg.world_size)
    if cfg.strategy_config is not None:
        raise ValueError(f"strategy='dpsgd' takes topology=, not strategy_config="
                         f"{cfg.strategy_config!r}")


@register("dpsgd", check=_check_dpsgd)
def _dpsgd(module, comm, cfg) -> Parts:  # Step 1
    broadcast_state(comm, module)
    params, rounds = [p for p in module.parameters() if p.requires_grad], [0]

    def after_step():
        flat = torch.nn.utils.parameters_to_vector(params).detach()
        gossip(comm, flat, cfg.topology, round=rounds[0])
        copy_flat(params, flat)
        rounds[0] += 1

    return Parts(module, make_optimizer(params, cfg), after_step=after_step,
                 close=lambda: average_parameters(comm, params))


def _check_streaming(cfg) -> None:
    config = cfg.strategy_config
    if config is not None and not isinstance(config, StreamingConfig):
        raise ValueError(f"strategy='streaming_diloco' takes strategy_config=StreamingConfig"
                         f"(...) or None, got {config!r}")
    model = models.make(cfg.model, seed=cfg.seed, **dict(cfg.model_kwargs))
    check_schedule(cfg.inner_steps, cfg.fragments, len(layers(model)),
                   (config or StreamingConfig()).delay)


@register("streaming_diloco", check=_check_streaming)
def _streaming(module, comm, cfg) -> Parts:  # Step 2
    inner = make_optimizer(module.parameters(), cfg)
    algo = StreamingDiLoCo(module, comm, inner, inner_steps=cfg.inner_steps,
                           fragments=cfg.fragments, config=cfg.strategy_config)
    return Parts(module, inner, after_step=algo.after_step, close=algo.finish)
