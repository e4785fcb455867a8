"""Masked reductions and the standard metric names of an RL step.

Reductions. For x and a mask m of the same shape (or m broadcastable to x), with valid set V = {m != 0}:

    masked_sum(x, m)  = sum_{i in V} x_i
    masked_mean(x, m) = masked_sum(x, m) / |V|
    masked_var(x, m)  = sum_{i in V} (x_i - mean)^2 / (|V| - 1)      (unbiased, like torch.var)
    masked_max / masked_min over V

Departures from verl's `torch_functional` helpers, on purpose:
- Masked positions are selected out with `torch.where`, never multiplied by 0, so a NaN or inf sitting in
  padding (a log-prob of -inf after the end of a response) cannot leak into the result.
- An empty valid set gives 0 (mean, max, min, var), never NaN or an error: a micro-batch whose rows are
  all tool tokens or padding must not poison a dashboard or an all-reduce. `masked_var` with one valid
  element gives 0 as well (verl raises).
- A mask is read as boolean (non-zero = valid); fractional weights are not supported.

Metric names. The string constants below are the keys the trainer logs. Where verl logs the same
quantity we use verl's exact key, so dashboards of both can be overlaid; keys verl does not have are new
names in the same prefixes. Note one verl quirk kept for compatibility: `actor/pg_clipfrac_lower` is the
fraction of tokens clipped by the DUAL clip (ratio > c with negative advantage), not the lower bound of the
ordinary clip; the lower and upper bounds of the ordinary clip are `actor/pg_clipfrac_low` and
`actor/pg_clipfrac_high`, and `actor/pg_clipfrac` is their sum.

Metrics that a loss computes per micro-batch are detached 0-d tensors (`TensorMetrics`), so the training
loop can accumulate them without a device-to-host sync per micro-batch; driver-side metrics (data,
advantages, filters) are plain floats (`Metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "ADV_SINGLETON_GROUPS",
    "ADVANTAGES_MAX",
    "ADVANTAGES_MEAN",
    "ADVANTAGES_MIN",
    "DYNAMIC_SAMPLING_DROPPED_GROUPS",
    "DYNAMIC_SAMPLING_DROPPED_SAMPLES",
    "DYNAMIC_SAMPLING_KEPT_GROUPS",
    "ENTROPY",
    "KL_COEF",
    "KL_LOSS",
    "OVERLONG_FRACTION",
    "OVERLONG_PENALTY_MEAN",
    "PG_CLIPFRAC",
    "PG_CLIPFRAC_DUAL",
    "PG_CLIPFRAC_HIGH",
    "PG_CLIPFRAC_LOW",
    "PG_LOSS",
    "PPO_KL",
    "PPO_KL_K3",
    "PROMPT_LENGTH_CLIP_RATIO",
    "PROMPT_LENGTH_MAX",
    "PROMPT_LENGTH_MEAN",
    "PROMPT_LENGTH_MIN",
    "RESPONSE_LENGTH_CLIP_RATIO",
    "RESPONSE_LENGTH_MAX",
    "RESPONSE_LENGTH_MEAN",
    "RESPONSE_LENGTH_MIN",
    "RETURNS_MAX",
    "RETURNS_MEAN",
    "RETURNS_MIN",
    "REWARDS_MAX",
    "REWARDS_MEAN",
    "REWARDS_MIN",
    "REWARD_KL_PENALTY",
    "REWARD_KL_PENALTY_COEF",
    "SCORE_MAX",
    "SCORE_MEAN",
    "SCORE_MIN",
    "TIS_CLIPFRAC",
    "TIS_WEIGHT_MEAN",
    "VALUES_MAX",
    "VALUES_MEAN",
    "VALUES_MIN",
    "VF_CLIPFRAC",
    "VF_EXPLAINED_VAR",
    "VF_LOSS",
    "VPRED_MEAN",
    "Metrics",
    "TensorMetrics",
    "batch_data_metrics",
    "explained_variance",
    "logprob_diff_metrics",
    "source_score_metrics",
    "masked_count",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_std",
    "masked_sum",
    "masked_var",
]

Metrics = dict[str, float]
"""Driver-side metrics: plain floats by name."""

TensorMetrics = dict[str, torch.Tensor]
"""Per-micro-batch metrics: detached 0-d tensors by name (no host sync until the loop asks)."""

# ---- actor (verl names) -------------------------------------------------------------------------------
PG_LOSS = "actor/pg_loss"
"""Policy-gradient loss of the micro-batch (as aggregated for backward)."""
PG_CLIPFRAC = "actor/pg_clipfrac"
"""Fraction of valid tokens whose ratio clip is active (either bound): verl's definition."""
PG_CLIPFRAC_DUAL = "actor/pg_clipfrac_lower"
"""Fraction of valid tokens clipped by the dual clip (A < 0, ratio above c). verl's name for it."""
PPO_KL = "actor/ppo_kl"
"""Masked mean of log(pi_old / pi): the ratio-based approximate KL (k1) between old and new policy."""
ENTROPY = "actor/entropy"
"""Policy entropy, aggregated like the loss."""
KL_LOSS = "actor/kl_loss"
"""KL(pi || pi_ref) term of the actor loss (before its coefficient)."""
KL_COEF = "actor/kl_coef"
"""Coefficient of the KL loss term."""
REWARD_KL_PENALTY = "actor/reward_kl_penalty"
"""In-reward KL: mean over sequences of the token-mean KL estimate."""
REWARD_KL_PENALTY_COEF = "actor/reward_kl_penalty_coeff"
"""Coefficient of the in-reward KL penalty (verl's spelling, `coeff`)."""

# ---- actor (new names) --------------------------------------------------------------------------------
PG_CLIPFRAC_HIGH = "actor/pg_clipfrac_high"
"""Fraction of valid tokens clipped at the upper bound 1 + clip_ratio_high (A > 0)."""
PG_CLIPFRAC_LOW = "actor/pg_clipfrac_low"
"""Fraction of valid tokens clipped at the lower bound 1 - clip_ratio_low (A < 0)."""
PPO_KL_K3 = "actor/ppo_kl_k3"
"""Masked mean of r - 1 - log r, r = pi/pi_old: non-negative low-variance version of `actor/ppo_kl`."""
TIS_WEIGHT_MEAN = "actor/tis_weight_mean"
"""Mean truncated importance weight min(pi_old / pi_rollout, cap) over valid tokens."""
TIS_CLIPFRAC = "actor/tis_clipfrac"
"""Fraction of valid tokens whose importance weight hit the TIS cap."""

# ---- critic (verl names) ------------------------------------------------------------------------------
VF_LOSS = "critic/vf_loss"
"""Clipped value loss (with the 0.5 factor)."""
VF_CLIPFRAC = "critic/vf_clipfrac"
"""Fraction of valid tokens where the clipped value term is the larger one."""
VPRED_MEAN = "critic/vpred_mean"
"""Mean predicted value over valid tokens."""
VF_EXPLAINED_VAR = "critic/vf_explained_var"
"""1 - Var[returns - values] / Var[returns] over valid tokens."""
SCORE_MEAN = "critic/score/mean"
SCORE_MAX = "critic/score/max"
SCORE_MIN = "critic/score/min"
REWARDS_MEAN = "critic/rewards/mean"
REWARDS_MAX = "critic/rewards/max"
REWARDS_MIN = "critic/rewards/min"
ADVANTAGES_MEAN = "critic/advantages/mean"
ADVANTAGES_MAX = "critic/advantages/max"
ADVANTAGES_MIN = "critic/advantages/min"
RETURNS_MEAN = "critic/returns/mean"
RETURNS_MAX = "critic/returns/max"
RETURNS_MIN = "critic/returns/min"
VALUES_MEAN = "critic/values/mean"
VALUES_MAX = "critic/values/max"
VALUES_MIN = "critic/values/min"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_MAX = "response_length/max"
RESPONSE_LENGTH_MIN = "response_length/min"
RESPONSE_LENGTH_CLIP_RATIO = "response_length/clip_ratio"
"""Fraction of responses that reached the maximum response length (truncated)."""
PROMPT_LENGTH_MEAN = "prompt_length/mean"
PROMPT_LENGTH_MAX = "prompt_length/max"
PROMPT_LENGTH_MIN = "prompt_length/min"
PROMPT_LENGTH_CLIP_RATIO = "prompt_length/clip_ratio"

# ---- advantages and reward shaping (new names) --------------------------------------------------------
ADV_SINGLETON_GROUPS = "critic/advantages/singleton_groups"
"""Prompt groups with one sample: a group baseline is undefined, so their advantage is 0."""
DYNAMIC_SAMPLING_KEPT_GROUPS = "dynamic_sampling/kept_groups"
"""Prompt groups kept by the dynamic-sampling filter (rewards not all equal)."""
DYNAMIC_SAMPLING_DROPPED_GROUPS = "dynamic_sampling/dropped_groups"
"""Prompt groups dropped by the dynamic-sampling filter (all rewards equal: zero advantage)."""
DYNAMIC_SAMPLING_DROPPED_SAMPLES = "dynamic_sampling/dropped_samples"
"""Samples (responses) in the dropped groups."""
OVERLONG_PENALTY_MEAN = "reward/overlong_penalty/mean"
"""Mean DAPO overlong penalty over the batch (<= 0)."""
OVERLONG_FRACTION = "reward/overlong_fraction"
"""Fraction of responses inside the overlong buffer or beyond (penalty < 0)."""


def _valid(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    valid = mask if mask.dtype == torch.bool else mask != 0
    return valid.expand_as(x) if valid.shape != x.shape else valid


def masked_count(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Number of valid (non-zero) mask entries, over `dim` or over everything; int64."""
    valid = mask if mask.dtype == torch.bool else mask != 0
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x over valid entries. x: any shape; mask: same shape (or broadcastable), bool or 0/1."""
    kept = torch.where(_valid(x, mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over valid entries (over `dim`, or over all); 0 where there is none."""
    count = masked_count(_valid(x, mask), dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, unbiased: bool = True
) -> torch.Tensor:
    """Variance of x over valid entries, two-pass (stable); 0 with fewer than 2 (unbiased) or 1 entries."""
    valid = _valid(x, mask)
    count = masked_count(valid, dim).to(x.dtype)
    mean = masked_mean(x, valid, dim)
    centred = x - (mean if dim is None else mean.unsqueeze(dim))
    sq = masked_sum(centred * centred, valid, dim)
    denom = (count - 1.0) if unbiased else count
    return sq / denom.clamp(min=1.0)


def masked_std(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, unbiased: bool = True
) -> torch.Tensor:
    """Square root of `masked_var`."""
    return masked_var(x, mask, dim, unbiased).sqrt()


def _masked_extreme(x: torch.Tensor, mask: torch.Tensor, dim: int | None, largest: bool) -> torch.Tensor:
    valid = _valid(x, mask)
    fill = torch.tensor(float("-inf") if largest else float("inf"), dtype=x.dtype, device=x.device)
    filled = torch.where(valid, x, fill)
    if dim is None:
        out = filled.max() if largest else filled.min()
        return torch.where(valid.any(), out, torch.zeros_like(out))
    out = filled.amax(dim=dim) if largest else filled.amin(dim=dim)
    return torch.where(valid.any(dim=dim), out, torch.zeros_like(out))


def masked_max(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Largest x over valid entries (over `dim`, or over all); 0 where there is none. Floating x only."""
    return _masked_extreme(x, mask, dim, largest=True)


def masked_min(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Smallest x over valid entries (over `dim`, or over all); 0 where there is none. Floating x only."""
    return _masked_extreme(x, mask, dim, largest=False)


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    """1 - Var[returns - values] / (Var[returns] + eps) over valid tokens (verl's `vf_explained_var`).

    values, returns, mask: [B, T]. 1 means the critic predicts returns perfectly, 0 means no better than
    their mean, negative means worse. Unbiased variances (the bias cancels up to `eps`). Fewer than two
    valid tokens: 0 (no variance to explain).
    """
    var_ret = masked_var(returns, mask)
    var_res = masked_var(returns - values, mask)
    out = 1.0 - var_res / (var_ret + eps)
    return torch.where(masked_count(mask) >= 2, out, torch.zeros_like(out))


def _stats(prefix_names: tuple[str, str, str], x: torch.Tensor, mask: torch.Tensor) -> Metrics:
    mean_name, max_name, min_name = prefix_names
    return {
        mean_name: float(masked_mean(x, mask)),
        max_name: float(masked_max(x, mask)),
        min_name: float(masked_min(x, mask)),
    }


def batch_data_metrics(
    token_level_scores: torch.Tensor,
    token_level_rewards: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    response_lengths: torch.Tensor | None = None,
    max_response_length: int | None = None,
    prompt_lengths: torch.Tensor | None = None,
    max_prompt_length: int | None = None,
) -> Metrics:
    """The data dashboard of one step, under verl's keys (`critic/score/mean`, `response_length/mean`, ...).

    token_level_scores, token_level_rewards, advantages, returns, values, response_mask: [B, T].
    Scores and rewards are summed per sequence (over valid tokens) and then reduced over sequences;
    advantages, returns and values are reduced over valid tokens. response_lengths / prompt_lengths: [B]
    (default response length: valid tokens per row; pass the full length, tool tokens included, for
    multi-turn); the clip ratio is the fraction of lengths >= the given maximum.
    """
    valid = _valid(token_level_scores, response_mask)
    every_row = torch.ones(valid.shape[0], dtype=torch.bool, device=valid.device)
    metrics: Metrics = {}
    metrics |= _stats(
        (SCORE_MEAN, SCORE_MAX, SCORE_MIN), masked_sum(token_level_scores, valid, -1), every_row
    )
    metrics |= _stats(
        (REWARDS_MEAN, REWARDS_MAX, REWARDS_MIN), masked_sum(token_level_rewards, valid, -1), every_row
    )
    metrics |= _stats((ADVANTAGES_MEAN, ADVANTAGES_MAX, ADVANTAGES_MIN), advantages, valid)
    metrics |= _stats((RETURNS_MEAN, RETURNS_MAX, RETURNS_MIN), returns, valid)
    if values is not None:
        metrics |= _stats((VALUES_MEAN, VALUES_MAX, VALUES_MIN), values, valid)
        metrics[VF_EXPLAINED_VAR] = float(explained_variance(values, returns, valid))
    lengths = (masked_count(valid, -1) if response_lengths is None else response_lengths).double()
    metrics |= _stats((RESPONSE_LENGTH_MEAN, RESPONSE_LENGTH_MAX, RESPONSE_LENGTH_MIN), lengths, every_row)
    if max_response_length is not None:
        metrics[RESPONSE_LENGTH_CLIP_RATIO] = float((lengths >= max_response_length).double().mean())
    if prompt_lengths is not None:
        plen = prompt_lengths.double()
        metrics |= _stats((PROMPT_LENGTH_MEAN, PROMPT_LENGTH_MAX, PROMPT_LENGTH_MIN), plen, every_row)
        if max_prompt_length is not None:
            metrics[PROMPT_LENGTH_CLIP_RATIO] = float((plen >= max_prompt_length).double().mean())
    return metrics


def source_score_metrics(
    token_level_scores: torch.Tensor, response_mask: torch.Tensor, data_sources: Sequence[str]
) -> Metrics:
    """`reward/<data_source>/mean`: the mean sequence score (`critic/score`'s per-row sum) of each data
    source's rows in the step's batch, for every source present; [B, T] tensors, one source per row.

    Keyed by data source (verl's row field, the key validation logs under, `val-core/<source>/...`), not by
    a task name: every row has one, whatever made it (a built-in task, files, a reasoning-gym mixture,
    whose sources are `reasoning_gym/<task>`). Logged whenever a source is in the batch, even alone: a
    mixture's step can draw one source only, and its curve must not skip that step.
    """
    if len(data_sources) != token_level_scores.shape[0]:
        raise ValueError(f"{len(data_sources)} data sources for {token_level_scores.shape[0]} rows")
    per_row = masked_sum(token_level_scores, _valid(token_level_scores, response_mask), -1).double().tolist()
    totals: dict[str, list[float]] = {}
    for source, score in zip(data_sources, per_row, strict=True):
        totals.setdefault(str(source), []).append(score)
    return {f"reward/{source}/mean": sum(v) / len(v) for source, v in sorted(totals.items())}


def logprob_diff_metrics(
    rollout_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """`rollout/logprob_diff_max` and `_mean`: |engine - trainer| log-probs of the same tokens, [B, R].

    After a weight sync both sides hold the same weights; what remains is numerics (dtype, kernels). A
    large mean means the engine samples from another policy than the one being trained (stale weights, a
    different temperature, a model mismatch) and PPO's ratios are off.
    """
    diff = (rollout_logprobs.float() - trainer_logprobs.float()).abs()
    return {
        "rollout/logprob_diff_max": float(masked_max(diff, mask)),
        "rollout/logprob_diff_mean": float(masked_mean(diff, mask)),
    }
