"""This topic's `train.run` strategies, registered:

1. "local_sgd" (`sync_every=H`, `start_local_at=`): local SGD (local_sgd.py);
2. "diloco" (`strategy_config=DiLoCoConfig(...)`): the harness's optimizer is DiLoCo's
   inner one, so `optimizer`, `lr` and `weight_decay` must be the config's inner ones;
3. "noise_scale": data parallelism whose one allreduce also carries each rank's squared
   gradient norm (noise_scale.py); `History.extra["noise"]` is B_simple per step.
"""

from __future__ import annotations

import torch

from syncedu.train.strategies import Parts, make_optimizer, register
from syncedu.tuning.diloco import DiLoCo, DiLoCoConfig
from syncedu.tuning.local_sgd import LocalSGD, broadcast_state, copy_flat
from syncedu.tuning.noise_scale import NoiseScale, allreduce_with_norms


@register("local_sgd")
def _local_sgd(module, comm, cfg) -> Parts:  # Step 1
    local = LocalSGD(module, comm, cfg.sync_every, start_local_at=cfg.start_local_at)
    return Parts(module, make_optimizer(module.parameters(), cfg), after_step=local.after_step,
                 close=local.finish)


def _check_diloco(cfg) -> None:
    config = cfg.strategy_config
    if not isinstance(config, DiLoCoConfig):
        raise ValueError(f"strategy='diloco' needs strategy_config=DiLoCoConfig(...), "
                         f"got {config!r}")
    inner = ("adamw", config.inner_lr, config.weight_decay)
    if (cfg.optimizer, cfg.lr, cfg.weight_decay) != inner:
        raise ValueError(f"strategy='diloco' steps with its inner AdamW: pass optimizer="
                         f"'adamw', lr={config.inner_lr} and weight_decay={config.weight_decay}"
                         f" (the config's inner_lr and weight_decay), got {cfg.optimizer!r}, "
                         f"{cfg.lr} and {cfg.weight_decay}")


@register("diloco", check=_check_diloco)
def _diloco(module, comm, cfg) -> Parts:  # Step 2
    algo = DiLoCo(module, comm, cfg.strategy_config)
    return Parts(module, algo.inner, after_step=algo.after_step, close=algo.finish)


def _check_noise_scale(cfg) -> None:
    if cfg.world_size < 2 or cfg.accumulation != 1:
        raise ValueError(f"strategy='noise_scale' compares the ranks' batches with the global "
                         f"one: world_size={cfg.world_size} must be >= 2 and "
                         f"accumulation={cfg.accumulation} must be 1")


@register("noise_scale", check=_check_noise_scale)
def _noise_scale(module, comm, cfg) -> Parts:  # Step 3
    broadcast_state(comm, module)
    params, scale = [p for p in module.parameters() if p.requires_grad], NoiseScale()

    def finish():
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat, small_sq = allreduce_with_norms(comm, flat)
        scale.update(small_sq, float(flat.double().pow(2).sum()),
                     cfg.global_batch // comm.world_size, cfg.global_batch)
        copy_flat([p.grad for p in params], flat)

    return Parts(module, make_optimizer(params, cfg), finish=finish,
                 report=lambda: {"noise": scale.history})
