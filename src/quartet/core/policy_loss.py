"""Policy (actor) losses: per-token surrogate losses, optional truncated importance weights, aggregation.

Notation: log-probs of the sampled tokens under the policy being trained (logp), under the policy that
produced the batch's old log-probs (logp_old), and as reported by the rollout engine (logp_rollout); all
[B, T]. A[i, t] are the advantages, m[i, t] the response mask. r = exp(logp - logp_old).

PPO clipped surrogate (Schulman et al. 2017) with asymmetric clip (DAPO's "clip-higher", Yu et al. 2025):
    l1 = -A r,  l2 = -A clip(r, 1 - eps_low, 1 + eps_high),  l = max(l1, l2)
  dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games"), for A < 0 only, c > 1:
    l = min(max(l1, l2), -A c)
  The log-ratio is clamped to [-20, 20] before exp, as in verl, so a stale old log-prob cannot overflow.
GSPO (Zheng et al. 2025), sequence-level ratio, in its GSPO-token form:
    s_i = exp( (1/n_i) sum_t m (logp - logp_old) ),   s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t])
    l = max(-A s_{i,t}, -A clip(s_{i,t}, 1 - eps_low, 1 + eps_high))
  s_{i,t} has the value of s_i and, aggregated with `seq-mean-token-mean`, exactly the gradient of the
  paper's sequence objective. The paper aggregates with seq-mean-token-mean; verl 0.9.1 does not force it
  either: its GSPO loss uses the configured `loss_agg_mode`, and its GSPO example sets seq-mean-token-mean.
  Here too the caller's mode is used as given. No dual clip. The log of s_{i,t}
  is clamped at 10 (verl's guard).
REINFORCE:  l = -A logp (Williams 1992); its gradient equals PPO's at r = 1, without clipping.
Truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"): the rollout engine and the trainer compute slightly different log-probs, so the
per-token loss is multiplied by the constant weight w = min(exp(logp_old - logp_rollout), cap) (no
gradient through w). cap <= 0 or no rollout log-probs: w = 1.

Metrics (masked means over this micro-batch's valid tokens, detached): clip fractions split by bound
(`actor/pg_clipfrac_high`, `actor/pg_clipfrac_low`, their sum `actor/pg_clipfrac` which is verl's), the
dual-clip fraction under verl's key `actor/pg_clipfrac_lower`, the approximate KL between old and new
policy `actor/ppo_kl` = mean(logp_old - logp) (verl's, ratio-based k1) and its non-negative k3 form
`actor/ppo_kl_k3` = mean(r - 1 - log r), and the TIS weight statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from quartet.core.choices import LossAggMode, PolicyLoss
from quartet.core.contracts import ClipParams, TokenLosses
from quartet.core.loss_agg import aggregate_loss
from quartet.core.metrics import (
    PG_CLIPFRAC,
    PG_CLIPFRAC_DUAL,
    PG_CLIPFRAC_HIGH,
    PG_CLIPFRAC_LOW,
    PG_LOSS,
    PPO_KL,
    PPO_KL_K3,
    TIS_CLIPFRAC,
    TIS_WEIGHT_MEAN,
    TensorMetrics,
    masked_mean,
)
from quartet.core.registry import get_policy_loss

__all__ = [
    "POLICY_LOSSES",
    "ClipParams",
    "PolicyLossOutput",
    "TokenLosses",
    "compute_policy_loss",
    "gspo_token_losses",
    "masked_importance_weights",
    "ppo_token_losses",
    "reinforce_token_losses",
    "truncated_importance_weights",
]

LOG_RATIO_CLAMP = 20.0  # verl's bound on logp - logp_old before exp (PPO)
GSPO_LOG_RATIO_MAX = 10.0  # verl's upper bound on the GSPO log-ratio


@dataclass(frozen=True)
class PolicyLossOutput:
    """The scalar to backward (0-d, graph attached) and detached metrics of this micro-batch."""

    loss: torch.Tensor
    metrics: TensorMetrics


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _frac(flags: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return masked_mean(flags.to(torch.float32), valid).detach()


def _kl_metrics(log_ratio: torch.Tensor, valid: torch.Tensor) -> TensorMetrics:
    """Approximate KL(pi_old || pi) from log r = logp - logp_old: k1 (verl's ppo_kl) and k3."""
    lr = log_ratio.detach()
    return {
        PPO_KL: masked_mean(-lr, valid),
        PPO_KL_K3: masked_mean(torch.expm1(lr) - lr, valid),
    }


def _clip_metrics(
    adv: torch.Tensor, unclipped: torch.Tensor, clipped: torch.Tensor, valid: torch.Tensor
) -> TensorMetrics:
    active = clipped > unclipped  # the clipped term wins: the gradient through r is cut
    high = _frac(active & (adv > 0), valid)
    low = _frac(active & (adv < 0), valid)
    return {PG_CLIPFRAC: high + low, PG_CLIPFRAC_HIGH: high, PG_CLIPFRAC_LOW: low}


def ppo_token_losses(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip: ClipParams | None = None,
) -> TokenLosses:
    """PPO clipped surrogate per token, asymmetric clip and optional dual clip.

    Args:
        logprob: [B, T] log pi(a_t) of the policy being trained (gradients flow through it).
        old_logprob: [B, T] log-probs of the policy that collected the batch (no gradient).
        advantages: [B, T].
        response_mask: [B, T] bool or 0/1 (metrics only; `aggregate_loss` masks the losses).
        clip: ratio clipping (defaults: 0.2 / 0.2, no dual clip).
    """
    clip = clip or ClipParams()
    valid = _valid(response_mask)
    adv = advantages.detach()
    log_ratio = torch.clamp(logprob - old_logprob.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip.clip_ratio_low, 1.0 + clip.clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    metrics = _clip_metrics(adv, unclipped, clipped, valid) | _kl_metrics(log_ratio, valid)
    if clip.dual_clip_c > 0:
        bound = -adv * clip.dual_clip_c  # for A < 0: caps the loss of a runaway ratio at c|A|
        metrics[PG_CLIPFRAC_DUAL] = _frac((adv < 0) & (losses > bound), valid)
        losses = torch.where(adv < 0, torch.minimum(losses, bound), losses)
    else:
        metrics[PG_CLIPFRAC_DUAL] = torch.zeros((), device=logprob.device)
    return TokenLosses(losses, metrics)


def gspo_token_losses(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip: ClipParams | None = None,
) -> TokenLosses:
    """GSPO-token losses: the clipped surrogate on the sequence-level ratio s_i (see the module docstring).

    Shapes as in `ppo_token_losses`; `advantages` are usually constant over a row (outcome estimators).
    `clip.dual_clip_c` is ignored (GSPO has no dual clip). GSPO's ranges are small, e.g. 3e-4 / 4e-4.
    """
    clip = clip or ClipParams()
    valid = _valid(response_mask)
    adv = advantages.detach()
    diff = torch.where(valid, logprob - old_logprob.detach(), torch.zeros_like(logprob))
    seq_log_ratio = diff.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1).to(logprob.dtype)
    log_ratio = logprob - logprob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=GSPO_LOG_RATIO_MAX))
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip.clip_ratio_low, 1.0 + clip.clip_ratio_high)
    metrics = _clip_metrics(adv, unclipped, clipped, valid)
    metrics |= _kl_metrics(logprob - old_logprob.detach(), valid)
    metrics[PG_CLIPFRAC_DUAL] = torch.zeros((), device=logprob.device)
    return TokenLosses(torch.maximum(unclipped, clipped), metrics)


def reinforce_token_losses(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip: ClipParams | None = None,
) -> TokenLosses:
    """Plain REINFORCE, -A logp per token; `old_logprob` feeds only the KL metrics, `clip` is unused."""
    valid = _valid(response_mask)
    metrics = _kl_metrics(logprob - old_logprob.detach(), valid)
    zero = torch.zeros((), device=logprob.device)
    metrics |= {PG_CLIPFRAC: zero, PG_CLIPFRAC_HIGH: zero, PG_CLIPFRAC_LOW: zero, PG_CLIPFRAC_DUAL: zero}
    return TokenLosses(-advantages.detach() * logprob, metrics)


def truncated_importance_weights(
    old_logprob: torch.Tensor, rollout_logprob: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> TokenLosses:
    """TIS weights min(exp(logp_old - logp_rollout), cap), detached, [B, T] (in `losses`), and their metrics.

    old_logprob, rollout_logprob, response_mask: [B, T]. Masked positions get weight 1. cap must be > 0.
    """
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    valid = _valid(response_mask)
    raw = torch.exp((old_logprob - rollout_logprob).detach())  # inf is fine: min(inf, cap) = cap
    weights = torch.where(valid, torch.clamp(raw, max=cap), torch.ones_like(raw))
    metrics = {TIS_WEIGHT_MEAN: masked_mean(weights, valid), TIS_CLIPFRAC: _frac(raw > cap, valid)}
    return TokenLosses(weights, metrics)


def masked_importance_weights(
    old_logprob: torch.Tensor,
    rollout_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    low: float,
    high: float,
) -> TokenLosses:
    """Masked IS weights [B, T]: 1 where exp(logp_old - logp_rollout) lies in [low, high], else 0; padding 1.

    The tokens the engine that sampled them saw very differently from the trainer's policy leave the loss
    instead of entering it with a capped weight. `actor/tis_clipfrac` is the fraction masked out.
    """
    if not 0 <= low < high:
        raise ValueError(f"the masked-IS band must satisfy 0 <= low < high, got [{low}, {high}]")
    valid = _valid(response_mask)
    raw = torch.exp((old_logprob - rollout_logprob).detach())
    inside = (raw >= low) & (raw <= high)
    weights = torch.where(valid, inside.to(raw.dtype), torch.ones_like(raw))
    metrics = {TIS_WEIGHT_MEAN: masked_mean(weights, valid), TIS_CLIPFRAC: _frac(~inside, valid)}
    return TokenLosses(weights, metrics)


TokenLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, ClipParams | None], TokenLosses
]

POLICY_LOSSES: Mapping[PolicyLoss, TokenLossFn] = MappingProxyType(
    {
        PolicyLoss.PPO: ppo_token_losses,
        PolicyLoss.GSPO: gspo_token_losses,
        PolicyLoss.REINFORCE: reinforce_token_losses,
    }
)
"""The per-token loss function behind each `PolicyLoss` member (read-only)."""


def compute_policy_loss(
    loss_type: PolicyLoss | str,
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN,
    clip: ClipParams | None = None,
    rollout_logprob: torch.Tensor | None = None,
    tis_cap: float = 0.0,
    tis_mask_low: float | None = None,
    global_token_count: float | int | torch.Tensor | None = None,
    global_seq_count: float | int | torch.Tensor | None = None,
    norm_constant: float | None = None,
) -> PolicyLossOutput:
    """The actor's policy-gradient loss of one micro-batch and its metrics.

    Args:
        loss_type: PPO, GSPO, REINFORCE, or a name registered with `@register_policy_loss`.
        logprob, old_logprob, advantages, response_mask: [B, T] (see `ppo_token_losses`).
        agg_mode: reduction of the per-token losses (`loss_agg.aggregate_loss`).
        clip: ratio clipping for PPO/GSPO.
        rollout_logprob: [B, T] log-probs reported by the rollout engine, for TIS; None disables TIS.
        tis_cap: TIS cap; <= 0 disables TIS.
        tis_mask_low: None truncates the weights at `tis_cap`; a number masks instead: tokens whose ratio
            leaves [tis_mask_low, tis_cap] get weight 0, the others 1 (`masked_importance_weights`).
        global_token_count, global_seq_count, norm_constant: denominators of the aggregation over the whole
            mini-batch (all micro-batches and ranks); see `aggregate_loss`.

    Returns:
        `loss` (0-d) to add to the other terms and backward, and metrics including `actor/pg_loss`.
    """
    builtin = loss_type in {p.value for p in PolicyLoss}
    fn = POLICY_LOSSES[PolicyLoss(loss_type)] if builtin else get_policy_loss(str(loss_type))
    token = fn(logprob, old_logprob, advantages, response_mask, clip)
    losses, metrics = token.losses, dict(token.metrics)
    if rollout_logprob is not None and tis_cap > 0:
        tis = (
            truncated_importance_weights(old_logprob, rollout_logprob, response_mask, tis_cap)
            if tis_mask_low is None
            else masked_importance_weights(old_logprob, rollout_logprob, response_mask, tis_mask_low, tis_cap)
        )
        losses = losses * tis.losses
        metrics |= tis.metrics
    loss = aggregate_loss(
        losses,
        response_mask,
        agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        norm_constant=norm_constant,
    )
    metrics[PG_LOSS] = loss.detach()
    return PolicyLossOutput(loss, metrics)
