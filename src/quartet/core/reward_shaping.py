"""Reward shaping helpers: where an outcome score sits, DAPO's overlong penalty, DAPO's dynamic sampling.

Outcome score placement. A rule or a reward model scores a whole response (one number R_i); the token
rewards the estimators read are r[i, t] = R_i at the LAST VALID token of row i (the last token the model
wrote, so a trailing tool output or padding never holds it) and 0 elsewhere. Rows without any valid token
get nothing (there is no token to credit).

Overlong penalty (DAPO, Yu et al. 2025, eq. "soft overlong punishment"), with L_max the maximum response
length and L_cache the buffer before it:

    R_len(L) = 0                                    L <= L_max - L_cache
             = ((L_max - L_cache) - L) / L_cache    L_max - L_cache < L <= L_max
             = -1                                   L > L_max

scaled by `penalty_factor` (verl's `overlong_buffer.penalty_factor`) and added to the score. The length
is the caller's: the number of generated tokens (tool outputs included or not: the budget that truncates).

Dynamic sampling (DAPO): a prompt group whose responses all have the same reward gives every response a
group-relative advantage of 0, so it only dilutes the batch; the filter drops such groups and counts them.
A group of one sample is kept, as in verl (its "all equal" is trivial; a group estimator gives it 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quartet.core.advantages import GroupIndex, group_ids
from quartet.core.metrics import (
    DYNAMIC_SAMPLING_DROPPED_GROUPS,
    DYNAMIC_SAMPLING_DROPPED_SAMPLES,
    DYNAMIC_SAMPLING_KEPT_GROUPS,
    OVERLONG_FRACTION,
    OVERLONG_PENALTY_MEAN,
    Metrics,
)

__all__ = [
    "DynamicSamplingResult",
    "OverlongPenalty",
    "dynamic_sampling_filter",
    "last_valid_index",
    "overlong_penalty",
    "place_outcome_score",
]


def last_valid_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Position of the last valid token of each row, int64 [B]; -1 for rows without one. mask: [B, T]."""
    valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
    return torch.where(valid, positions, torch.full_like(positions, -1)).amax(dim=-1)


def place_outcome_score(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards [B, T]: scores[i] ([B]) on the last valid token of row i, 0 elsewhere.

    The dtype is the scores' (float32 for integer scores). Rows without a valid token are all 0.
    """
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    batch, length = response_mask.shape
    out = torch.zeros(batch, length, dtype=dtype, device=response_mask.device)
    last = last_valid_index(response_mask)
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = scores.to(dtype=dtype, device=out.device)[rows]
    return out


@dataclass(frozen=True)
class OverlongPenalty:
    """Penalty per response ([B], <= 0, add it to the scores) and its metrics."""

    penalty: torch.Tensor
    metrics: Metrics


def overlong_penalty(
    response_lengths: torch.Tensor,
    max_response_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> OverlongPenalty:
    """DAPO's soft overlong penalty: linear from 0 at L_max - L_cache to -penalty_factor at L_max.

    Args:
        response_lengths: [B] lengths (any numeric dtype).
        max_response_length: L_max.
        buffer_length: L_cache, 0 < L_cache <= L_max.
        penalty_factor: the penalty at (and beyond) L_max, as a positive magnitude.
    """
    if not 0 < buffer_length <= max_response_length:
        raise ValueError(f"need 0 < buffer_length <= max_response_length, got {buffer_length}")
    lengths = response_lengths.to(torch.float64)
    exceed = lengths - (max_response_length - buffer_length)
    penalty = -penalty_factor * torch.clamp(exceed / buffer_length, 0.0, 1.0)
    metrics = {
        OVERLONG_PENALTY_MEAN: float(penalty.mean()) if penalty.numel() else 0.0,
        OVERLONG_FRACTION: float((exceed > 0).double().mean()) if penalty.numel() else 0.0,
    }
    return OverlongPenalty(penalty, metrics)


@dataclass(frozen=True)
class DynamicSamplingResult:
    """Which samples to keep ([B] bool; select them with `batch.index(keep)`), and the counts."""

    keep: torch.Tensor
    kept_groups: int
    dropped_groups: int
    metrics: Metrics


def dynamic_sampling_filter(
    scores: torch.Tensor, index: GroupIndex, atol: float = 0.0, keep_singletons: bool = True
) -> DynamicSamplingResult:
    """Drop the prompt groups whose rewards are all equal (max - min <= atol).

    Args:
        scores: [B] one reward per response (sequence score or accuracy).
        index: [B] prompt ids (any order).
        atol: tolerance of "equal".
        keep_singletons: keep groups of one sample (verl does); False drops them too.
    """
    ids, n_groups = group_ids(index, scores.shape[0])
    ids = ids.to(scores.device)
    values = scores.to(torch.float64)
    hi = torch.full((n_groups,), float("-inf"), dtype=torch.float64, device=scores.device)
    lo = torch.full((n_groups,), float("inf"), dtype=torch.float64, device=scores.device)
    hi = hi.scatter_reduce(0, ids, values, reduce="amax")
    lo = lo.scatter_reduce(0, ids, values, reduce="amin")
    size = torch.zeros(n_groups, dtype=torch.long, device=scores.device).index_add_(
        0, ids, torch.ones_like(ids)
    )
    keep_group = (hi - lo) > atol
    if keep_singletons:
        keep_group |= size == 1
    keep = keep_group[ids]
    kept = int(keep_group.sum())
    metrics = {
        DYNAMIC_SAMPLING_KEPT_GROUPS: float(kept),
        DYNAMIC_SAMPLING_DROPPED_GROUPS: float(n_groups - kept),
        DYNAMIC_SAMPLING_DROPPED_SAMPLES: float((~keep).sum()),
    }
    return DynamicSamplingResult(keep, kept, n_groups - kept, metrics)
