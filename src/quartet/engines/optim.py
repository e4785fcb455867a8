"""AdamW on the trainable (float32 master) parameters, and the learning-rate schedule of `OptimConfig`.

Weight decay applies to matrices only: biases and norm weights (1-D parameters) are excluded, as in
Hugging Face's Trainer and nanoGPT (verl decays everything; decaying a norm's gain toward 0 is not a
regulariser anyone wants).

Schedule (transformers' own functions, stepped once per optimizer step): linear warmup from 0 to `lr`
over `warmup_steps` (the first step runs at lr 0 when warmup_steps > 0, as in transformers and verl), then
constant, or a half cosine from `lr` down to `min_lr_ratio * lr` at `total_steps`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from quartet.config.optim import LrSchedule, OptimConfig

__all__ = ["build_optimizer", "build_scheduler", "trainable_parameters"]


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters with requires_grad, each once (tied weights appear once)."""
    return [p for p in module.parameters() if p.requires_grad]


def _groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict[str, object]]:
    params = list(params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(module: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of `module` (call after sharding: it holds the sharded ones)."""
    params = trainable_parameters(module)
    if not params:
        raise ValueError("the model has no trainable parameter; pass optim=None for a frozen engine")
    return torch.optim.AdamW(_groups(params, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> LambdaLR:
    """Warmup then constant or cosine (see the module doc); `total_steps` counts optimizer steps."""
    if cfg.schedule is LrSchedule.COSINE:
        scheduler: LambdaLR = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer,
            num_warmup_steps=cfg.warmup_steps,
            num_training_steps=total_steps,
            min_lr_rate=cfg.min_lr_ratio,
        )
        return scheduler
    constant: LambdaLR = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=cfg.warmup_steps)
    return constant
