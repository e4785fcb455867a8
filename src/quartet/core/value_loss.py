"""Critic loss: the clipped value loss of PPO, and the explained-variance metric.

With new value predictions V (vpreds), the values V_old recorded when the batch was collected, returns R
and the clip range eps_v (`cliprange_value`), per valid token:

    V_clip = V_old + clip(V - V_old, -eps_v, eps_v)
    l      = 0.5 * max((V - R)^2, (V_clip - R)^2)
    L      = aggregate(l)      (any `LossAggMode`, with global denominators for gradient accumulation)

This is the form of OpenAI's baselines / TRL / verl (the 0.5 is applied to the per-token loss, which is the
same as verl's 0.5 * aggregate). It departs from the PPO paper (Schulman et al. 2017), whose value loss
is the plain squared error: clipping keeps the critic from moving far from V_old in one update, and the
max makes it pessimistic (the clipped prediction is used only when it is worse).

Metrics: `critic/vf_loss`, `critic/vf_clipfrac` (fraction of valid tokens where the clipped term is
strictly larger, i.e. clipping is active) and `critic/vpred_mean`. The explained variance
1 - Var[R - V] / Var[R] is `metrics.explained_variance`; like verl, the step logs it once as
`critic/vf_explained_var` from the batch's values and returns (`metrics.batch_data_metrics`), so this
module does not log a second, per-micro-batch value under the same key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quartet.core.choices import LossAggMode
from quartet.core.loss_agg import aggregate_loss
from quartet.core.metrics import (
    VF_CLIPFRAC,
    VF_LOSS,
    VPRED_MEAN,
    TensorMetrics,
    masked_mean,
)

__all__ = ["ValueLossOutput", "compute_value_loss", "value_token_losses"]


@dataclass(frozen=True)
class ValueLossOutput:
    """The scalar to backward (0-d, graph attached) and detached metrics of this micro-batch."""

    loss: torch.Tensor
    metrics: TensorMetrics


def value_token_losses(
    vpreds: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss 0.5 max((V - R)^2, (V_clip - R)^2) and the 'clip active' flags.

    All [B, T]; gradients flow through `vpreds` only. Masking is the caller's (`aggregate_loss`).
    """
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value must be > 0, got {cliprange_value}")
    old, target = old_values.detach(), returns.detach()
    # clamp(V, V_old - eps, V_old + eps) rather than V_old + clamp(V - V_old, ...): an unclipped V stays
    # bit-identical, so rounding cannot mark it as clipped.
    v_clip = torch.clamp(vpreds, old - cliprange_value, old + cliprange_value)
    unclipped = (vpreds - target) ** 2
    clipped = (v_clip - target) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped


def compute_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float = 0.5,
    *,
    agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN,
    global_token_count: float | int | torch.Tensor | None = None,
    global_seq_count: float | int | torch.Tensor | None = None,
    norm_constant: float | None = None,
) -> ValueLossOutput:
    """The critic's clipped value loss of one micro-batch and its metrics.

    Args:
        vpreds: [B, T] values predicted by the critic being trained.
        old_values: [B, T] values recorded before the update (`values` in the batch).
        returns: [B, T] regression targets (GAE returns).
        response_mask: [B, T] bool or 0/1.
        cliprange_value: eps_v (`CriticConfig.cliprange_value`).
        agg_mode, global_token_count, global_seq_count, norm_constant: see `loss_agg.aggregate_loss`.
    """
    valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    losses, active = value_token_losses(vpreds, old_values, returns, cliprange_value)
    loss = aggregate_loss(
        losses,
        valid,
        agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        norm_constant=norm_constant,
    )
    metrics: TensorMetrics = {
        VF_LOSS: loss.detach(),
        VF_CLIPFRAC: masked_mean(active.to(torch.float32), valid),
        VPRED_MEAN: masked_mean(vpreds.detach(), valid),
    }
    return ValueLossOutput(loss, metrics)
