"""A custom advantage estimator registered from a user module (no change to quartet).

Median baseline: each response's advantage is its outcome score minus the MEDIAN score of the responses
to the same prompt (the lower middle one for an even group), on every valid token. The median ignores one
lucky outlier in a group, where GRPO's mean moves with it. The config names this file and the estimator:

    algorithm:
      custom_module: examples/custom_algorithm/my_algo.py
      adv_estimator: median_baseline
"""

from __future__ import annotations

import torch

from quartet.core.advantages import AdvantageInputs, AdvantageOutput, AdvantageParams, group_ids
from quartet.core.registry import register_estimator


@register_estimator("median_baseline", needs_group=True)
def median_baseline(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
    """A[i, t] = R_i - lower_median(R_j : j in the group of i) on valid tokens, 0 elsewhere."""
    assert inputs.index is not None, "median_baseline groups responses by prompt (uid)"
    valid = inputs.response_mask != 0
    scores = torch.where(valid, inputs.token_level_rewards, 0.0).sum(dim=-1)  # outcome score per response
    ids, n_groups = group_ids(inputs.index, len(scores))
    per_row = torch.zeros_like(scores)
    for g in range(n_groups):
        rows = ids == g
        per_row[rows] = scores[rows] - scores[rows].median()  # torch.median: the lower middle value
    advantages = torch.where(valid, per_row[:, None], 0.0)  # broadcast to the response's valid tokens
    return AdvantageOutput(advantages, advantages.clone(), {})
