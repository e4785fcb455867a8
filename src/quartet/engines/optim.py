"""AdamW on the trainable (float32 master) parameters, and the learning-rate schedule of `OptimConfig`.

Weight decay applies to matrices only: biases and norm weights (1-D parameters) are excluded, as in
Hugging Face's Trainer and nanoGPT (verl decays everything; decaying a norm's gain toward 0 is not a
regulariser anyone wants).

Schedule (transformers' constant and cosine-with-min-lr schedules, stepped once per optimizer step): linear
warmup from 0 to `lr` over `warmup_steps` (the first step runs at lr 0 when warmup_steps > 0, as in
transformers and verl), then constant, or a half cosine from `lr` down to `min_lr_ratio * lr` at
`total_steps`. The factors are computed here as transformers computes them (tests/engines/test_train_step.py
compares them): importing its schedules imports `transformers.trainer_utils` and peft, ~0.4 s of every
host's start.

Non-finite gradients (`optimizer_step`): if the global gradient norm is inf or NaN the optimizer step is
skipped and the gradients dropped; the scheduler still advances, so the learning rate stays tied to the
trainer's step count (as in verl).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from functools import partial

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from quartet.config.optim import LrSchedule, OptimConfig
from quartet.engines.dist import to_local_full
from quartet.engines.tensor_parallel import clip_grad_norm

__all__ = ["build_optimizer", "build_scheduler", "fused_supported", "optimizer_step", "trainable_parameters"]


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
    fused = cfg.fused if cfg.fused is not None else fused_supported(params)
    groups = _groups(params, cfg.weight_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None)


def fused_supported(params: list[nn.Parameter]) -> bool:
    """torch's fused AdamW takes these parameters: floating point, all on one kind of device, CPU or CUDA."""
    kinds = {p.device.type for p in params}
    return len(kinds) == 1 and kinds <= {"cpu", "cuda"} and all(p.is_floating_point() for p in params)


def warmup_constant_factor(step: int, *, warmup_steps: int) -> float:
    """The learning-rate factor of step `step`: linear warmup from 0, then 1."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return 1.0


def warmup_cosine_factor(step: int, *, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """The learning-rate factor of step `step`: linear warmup from 0, then a half cosine from 1 down to
    `min_ratio` at `total_steps`."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
    return max(0.0, factor * (1 - min_ratio) + min_ratio)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> LambdaLR:
    """Warmup then constant or cosine (see the module doc); `total_steps` counts optimizer steps."""
    if cfg.schedule is LrSchedule.COSINE:
        cosine = partial(
            warmup_cosine_factor,
            warmup_steps=cfg.warmup_steps,
            total_steps=total_steps,
            min_ratio=cfg.min_lr_ratio,
        )
        return LambdaLR(optimizer, cosine)
    return LambdaLR(optimizer, partial(warmup_constant_factor, warmup_steps=cfg.warmup_steps))


def optimizer_step(
    params: list[nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    grad_clip: float,
    several_meshes: bool,
) -> tuple[float, float]:
    """Clip the gradients of `params` to `grad_clip` (0: no clipping), step the optimizer unless their norm
    is not finite, drop the gradients, step the schedule. Returns (norm before clipping, lr of this step).

    `several_meshes` (tensor or expert parallelism): the parameters are DTensors on two meshes, their norm
    reduced per placement (`tensor_parallel.clip_grad_norm`).
    """
    max_norm = grad_clip if grad_clip > 0 else math.inf
    if several_meshes:
        grad_norm = clip_grad_norm(params, max_norm)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False)
        grad_norm = float(to_local_full(norm))
    lr = float(scheduler.get_last_lr()[0])
    finite = math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # frees gradient memory until the next step
    with warnings.catch_warnings():
        if not finite:  # torch warns about a scheduler step without an optimizer step: intended here
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
        scheduler.step()
    return grad_norm, lr
