"""Advantage estimators: token-level rewards (and values) in, token-level advantages and returns out.

Shapes: B responses, T response tokens. `token_level_rewards` r[i, t] and `response_mask` m[i, t] are
[B, T]; m is 1 on tokens the model wrote and 0 on observation/tool tokens and padding. Every estimator
returns advantages and returns of shape [B, T] that are exactly 0 where m = 0, and never NaN (an all-masked
row gives a row of zeros). Rewards on masked positions are ignored: put outcome scores on the last valid
token (`reward_shaping.place_outcome_score`).

Outcome score of a response: R_i = sum_t m[i, t] r[i, t]. Group estimators take one prompt id per
response (`index`, any hashable values, any order: a group's samples need not be adjacent); G(i) is the
group of i and K = |G(i)|.

GAE (Schulman et al. 2015). Over the valid tokens t_1 < ... < t_n of a row (masked tokens are skipped, so a
tool-output span between two model turns neither receives advantage nor breaks the recursion):

    delta_k = r[t_k] + gamma V[t_{k+1}] - V[t_k]        (V[t_{n+1}] = 0)
    A[t_k]  = delta_k + gamma lam A[t_{k+1}]            (A[t_{n+1}] = 0)
    returns = A + V ;  optional whitening of A over all valid tokens of the batch.

    Same recursion as verl's `compute_gae_advantage_return` on valid tokens; verl additionally leaves the
    carried value on masked positions and always whitens. Here masked positions are 0 (advantages and
    returns), and whitening is a switch (`whiten`).

GRPO (Shao et al. 2024, DeepSeekMath):  A_i = (R_i - mean_G R) / (std_G R + eps), eps = 1e-6, std
    unbiased (torch.std), as in verl. Dr.GRPO (Liu et al. 2025): A_i = R_i - mean_G R (no std division).
RLOO (Ahmadian et al. 2024):  A_i = R_i - (1/(K-1)) sum_{j in G, j != i} R_j = K/(K-1) (R_i - mean_G R).
OPO (Hao et al. 2025):  A_i = R_i - b_G,  b_G = sum_j L_j R_j / sum_j L_j,  L_j = valid tokens of j.
REINFORCE++ (Hu 2025):  G[t_k] = r[t_k] + gamma G[t_{k+1}] over valid tokens (skipping holes as in GAE),
    A = whiten(G) over all valid tokens of the batch; returns = G.
REINFORCE++ with baseline (Hu 2025):  A = whiten(R_i - mean_G R) broadcast to the valid tokens.
ReMax (Li et al. 2023):  A[t] = sum_{t' >= t} m r[t'] - b_i with b_i the reward of the greedy response to
    the same prompt (`reward_baselines`); returns = the reward-to-go.

Groups of size 1 (a departure from verl, which gives them R_i / (1 + eps) in GRPO and R_i in RLOO): the
baseline of a group-relative estimator is undefined for a lone sample, so its advantage is exactly 0 in
every group estimator (GRPO, Dr.GRPO, RLOO, OPO, REINFORCE++-baseline; in the last one such rows are also
left out of the whitening statistics) and the number of such groups is reported as
`critic/advantages/singleton_groups`. Outcome estimators return their advantages as returns (like verl):
there is no critic to fit.

Whitening (verl's `masked_whiten`): (x - mean) / sqrt(var + 1e-8), mean and unbiased var over valid tokens;
with fewer than two valid tokens the variance is taken as 0.

Adding an estimator: write the function, add a member to `AdvantageEstimator` and an entry in
`ESTIMATORS`; a test checks that every member has an entry. Outside quartet, `@register_estimator` in a
user module (`quartet.core.registry`) adds one under a new name; `compute_advantages` finds it by name.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from quartet.core.choices import AdvantageEstimator
from quartet.core.contracts import AdvantageInputs, AdvantageOutput, AdvantageParams, GroupIndex
from quartet.core.metrics import ADV_SINGLETON_GROUPS, Metrics, masked_mean, masked_var
from quartet.core.registry import get_estimator

__all__ = [
    "ESTIMATORS",
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageParams",
    "GroupIndex",
    "compute_advantages",
    "compute_dr_grpo",
    "compute_gae",
    "compute_grpo",
    "compute_opo",
    "compute_reinforce_plus_plus",
    "compute_reinforce_plus_plus_baseline",
    "compute_remax",
    "compute_rloo",
    "group_ids",
    "masked_whiten",
]

WHITEN_EPS = 1e-8


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def _outcome_scores(rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """R_i = sum of rewards over the valid tokens of row i: [B]."""
    return torch.where(valid, rewards, _zero(rewards)).sum(dim=-1)


def _broadcast(per_row: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """A [B] value on every valid token of its row, 0 elsewhere: [B, T]."""
    return torch.where(valid, per_row.unsqueeze(-1), _zero(per_row))


def group_ids(index: GroupIndex, size: int | None = None) -> tuple[torch.Tensor, int]:
    """Dense group numbers 0..G-1 (int64 [B]) and the number of groups G, from any prompt ids."""
    if isinstance(index, torch.Tensor):
        uniques, inverse = torch.unique(index.flatten(), return_inverse=True)
        ids, count = inverse.to(torch.long), int(uniques.numel())
    else:
        numbers: dict[Hashable, int] = {}
        ids = torch.tensor([numbers.setdefault(k, len(numbers)) for k in index], dtype=torch.long)
        count = len(numbers)
    if size is not None and ids.numel() != size:
        raise ValueError(f"index has {ids.numel()} prompt ids for {size} responses")
    return ids, count


@dataclass(frozen=True)
class _Groups:
    """Per-sample statistics of each sample's group: size, mean and unbiased std of the scores."""

    size: torch.Tensor  # [B] int64
    mean: torch.Tensor  # [B]
    std: torch.Tensor  # [B], 0 for groups of one

    @property
    def singleton(self) -> torch.Tensor:
        return self.size == 1

    def singleton_metrics(self, ids: torch.Tensor) -> Metrics:
        lone = torch.unique(ids[self.singleton.to(ids.device)])
        return {ADV_SINGLETON_GROUPS: float(lone.numel())}


def _group_stats(scores: torch.Tensor, ids: torch.Tensor, n_groups: int) -> _Groups:
    ids = ids.to(scores.device)
    size = torch.zeros(n_groups, dtype=torch.long, device=scores.device).index_add_(
        0, ids, torch.ones_like(ids)
    )
    sums = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, scores)
    mean = sums / size.clamp(min=1).to(scores.dtype)
    dev = scores - mean[ids]  # two-pass variance: no cancellation for large rewards
    ssq = torch.zeros_like(sums).index_add_(0, ids, dev * dev)
    std = (ssq / (size - 1).clamp(min=1).to(scores.dtype)).sqrt()
    return _Groups(size=size[ids], mean=mean[ids], std=std[ids])


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = WHITEN_EPS) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over valid entries (unbiased var), 0 where masked. x, mask: [B, T]."""
    valid = _valid(mask)
    mean = masked_mean(x, valid)
    var = masked_var(x, valid)
    return torch.where(valid, (x - mean) * torch.rsqrt(var + eps), _zero(x))


def compute_gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
) -> AdvantageOutput:
    """Generalised advantage estimation over the valid tokens of each row (holes are skipped).

    Args:
        token_level_rewards: [B, T] rewards.
        values: [B, T] critic values V(s_t) of the same positions.
        response_mask: [B, T]; masked positions are skipped by the recursion and get 0.
        gamma, lam: discount and GAE lambda, applied per valid token.
        whiten: whiten the advantages over all valid tokens of the batch (returns use the raw ones).

    Returns:
        advantages, returns = raw advantages + values ([B, T], 0 where masked).
    """
    valid = _valid(response_mask)
    batch, length = token_level_rewards.shape
    next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    advantages = torch.zeros_like(values)
    # One vectorised step per position, right to left; `where` carries value and advantage of the next
    # valid token across masked spans (and keeps NaN in padding out of the carry).
    for t in reversed(range(length)):
        here = valid[:, t]
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(here, adv, _zero(adv))
        next_value = torch.where(here, values[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    returns = torch.where(valid, advantages + values, _zero(values))
    if whiten:
        advantages = masked_whiten(advantages, valid)
    return AdvantageOutput(advantages=advantages, returns=returns)


def compute_grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> AdvantageOutput:
    """GRPO outcome advantage (R - mean_G) / (std_G + eps), or Dr.GRPO's R - mean_G without `norm_adv_by_std`.

    Args:
        token_level_rewards: [B, T]; R_i is the sum over valid tokens.
        response_mask: [B, T].
        index: [B] prompt ids (any order).
        epsilon: added to the unbiased group std.
        norm_adv_by_std: divide by the group std (GRPO) or not (Dr.GRPO).

    Returns:
        advantages = returns: A_i on every valid token of row i ([B, T]); groups of one sample get 0.
    """
    valid = _valid(response_mask)
    scores = _outcome_scores(token_level_rewards, valid)
    ids, n_groups = group_ids(index, scores.shape[0])
    groups = _group_stats(scores, ids, n_groups)
    centred = scores - groups.mean
    adv = centred / (groups.std + epsilon) if norm_adv_by_std else centred
    adv = torch.where(groups.singleton, _zero(adv), adv)
    advantages = _broadcast(adv, valid)
    return AdvantageOutput(advantages, advantages, groups.singleton_metrics(ids))


def compute_dr_grpo(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> AdvantageOutput:
    """Dr.GRPO outcome advantage R_i - mean_G R (no std division). Shapes as in `compute_grpo`."""
    return compute_grpo(token_level_rewards, response_mask, index, norm_adv_by_std=False)


def compute_rloo(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> AdvantageOutput:
    """RLOO: R_i minus the mean of the OTHER samples of its group. [B, T] in, [B, T] out (= returns)."""
    valid = _valid(response_mask)
    scores = _outcome_scores(token_level_rewards, valid)
    ids, n_groups = group_ids(index, scores.shape[0])
    groups = _group_stats(scores, ids, n_groups)
    k = groups.size.to(scores.dtype)
    adv = (scores - groups.mean) * k / (k - 1.0).clamp(min=1.0)
    adv = torch.where(groups.singleton, _zero(adv), adv)
    advantages = _broadcast(adv, valid)
    return AdvantageOutput(advantages, advantages, groups.singleton_metrics(ids))


def compute_opo(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> AdvantageOutput:
    """OPO: R_i minus the length-weighted group baseline sum_j L_j R_j / sum_j L_j (L_j: valid tokens)."""
    valid = _valid(response_mask)
    scores = _outcome_scores(token_level_rewards, valid)
    ids, n_groups = group_ids(index, scores.shape[0])
    ids = ids.to(scores.device)
    lengths = valid.sum(dim=-1).to(scores.dtype)
    weight = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, lengths)
    weighted = torch.zeros_like(weight).index_add_(0, ids, lengths * scores)
    # A group whose responses are all empty has no baseline; its rows are all-masked and end up 0 anyway.
    baseline = torch.where(weight > 0, weighted / weight.clamp(min=1.0), _zero(weight))[ids]
    groups = _group_stats(scores, ids, n_groups)
    adv = torch.where(groups.singleton, _zero(scores), scores - baseline)
    advantages = _broadcast(adv, valid)
    return AdvantageOutput(advantages, advantages, groups.singleton_metrics(ids))


def _discounted_returns(rewards: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """G[t_k] = r[t_k] + gamma G[t_{k+1}] over the valid tokens of each row; 0 on masked ones. [B, T]."""
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        here = valid[:, t]
        running = torch.where(here, rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(here, running, _zero(running))
    return returns


def compute_reinforce_plus_plus(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> AdvantageOutput:
    """REINFORCE++: discounted reward-to-go over valid tokens, whitened over the batch's valid tokens.

    token_level_rewards, response_mask: [B, T]. Returns the whitened advantages and the raw returns.
    """
    valid = _valid(response_mask)
    returns = _discounted_returns(token_level_rewards, valid, gamma)
    return AdvantageOutput(masked_whiten(returns, valid), returns)


def compute_reinforce_plus_plus_baseline(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex
) -> AdvantageOutput:
    """REINFORCE++ with a group baseline: whiten(R_i - mean_G R) over the valid tokens of the batch.

    token_level_rewards, response_mask: [B, T]; index: [B] prompt ids. Rows of one-sample groups are 0 and
    left out of the whitening statistics. advantages = returns.
    """
    valid = _valid(response_mask)
    scores = _outcome_scores(token_level_rewards, valid)
    ids, n_groups = group_ids(index, scores.shape[0])
    groups = _group_stats(scores, ids, n_groups)
    counted = valid & ~groups.singleton.unsqueeze(-1)
    advantages = masked_whiten(_broadcast(scores - groups.mean, counted), counted)
    return AdvantageOutput(advantages, advantages, groups.singleton_metrics(ids))


def compute_remax(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, reward_baselines: torch.Tensor
) -> AdvantageOutput:
    """ReMax: reward-to-go (undiscounted, valid tokens only) minus the greedy response's reward.

    token_level_rewards, response_mask: [B, T]; reward_baselines: [B]. Returns the reward-to-go as returns.
    """
    valid = _valid(response_mask)
    kept = torch.where(valid, token_level_rewards, _zero(token_level_rewards))
    to_go = kept.flip(-1).cumsum(-1).flip(-1)
    returns = torch.where(valid, to_go, _zero(to_go))
    advantages = torch.where(valid, to_go - reward_baselines.to(to_go.dtype).unsqueeze(-1), _zero(to_go))
    return AdvantageOutput(advantages, returns)


def _need(value: torch.Tensor | GroupIndex | None, name: str, estimator: AdvantageEstimator) -> None:
    if value is None:
        raise ValueError(f"advantage estimator '{estimator}' needs `{name}` in AdvantageInputs")


def _gae(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    _need(x.values, "values", AdvantageEstimator.GAE)
    assert x.values is not None
    return compute_gae(x.token_level_rewards, x.values, x.response_mask, p.gamma, p.lam, p.whiten)


def _grouped(x: AdvantageInputs, estimator: AdvantageEstimator) -> GroupIndex:
    _need(x.index, "index", estimator)
    assert x.index is not None
    return x.index


def _grpo(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    index = _grouped(x, AdvantageEstimator.GRPO)
    return compute_grpo(x.token_level_rewards, x.response_mask, index, p.epsilon, p.norm_adv_by_std)


def _dr_grpo(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    return compute_dr_grpo(x.token_level_rewards, x.response_mask, _grouped(x, AdvantageEstimator.DR_GRPO))


def _rloo(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    return compute_rloo(x.token_level_rewards, x.response_mask, _grouped(x, AdvantageEstimator.RLOO))


def _opo(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    return compute_opo(x.token_level_rewards, x.response_mask, _grouped(x, AdvantageEstimator.OPO))


def _rpp(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    return compute_reinforce_plus_plus(x.token_level_rewards, x.response_mask, p.gamma)


def _rpp_baseline(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    index = _grouped(x, AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
    return compute_reinforce_plus_plus_baseline(x.token_level_rewards, x.response_mask, index)


def _remax(x: AdvantageInputs, p: AdvantageParams) -> AdvantageOutput:
    _need(x.reward_baselines, "reward_baselines", AdvantageEstimator.REMAX)
    assert x.reward_baselines is not None
    return compute_remax(x.token_level_rewards, x.response_mask, x.reward_baselines)


EstimatorFn = Callable[[AdvantageInputs, AdvantageParams], AdvantageOutput]

ESTIMATORS: Mapping[AdvantageEstimator, EstimatorFn] = MappingProxyType(
    {
        AdvantageEstimator.GAE: _gae,
        AdvantageEstimator.GRPO: _grpo,
        AdvantageEstimator.DR_GRPO: _dr_grpo,
        AdvantageEstimator.RLOO: _rloo,
        AdvantageEstimator.REINFORCE_PLUS_PLUS: _rpp,
        AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE: _rpp_baseline,
        AdvantageEstimator.REMAX: _remax,
        AdvantageEstimator.OPO: _opo,
    }
)
"""The function behind each `AdvantageEstimator` member (read-only)."""


def compute_advantages(
    estimator: AdvantageEstimator | str, inputs: AdvantageInputs, params: AdvantageParams | None = None
) -> AdvantageOutput:
    """Advantages and returns by the chosen estimator, under `torch.no_grad` (they are targets, not outputs).

    `estimator` is a built-in name or one registered with `@register_estimator` (KeyError naming both
    kinds otherwise). Raises ValueError when the estimator's inputs are missing (values for GAE, index for
    the group estimators, reward_baselines for ReMax) or shapes disagree.
    """
    builtin = estimator in {e.value for e in AdvantageEstimator}
    fn = ESTIMATORS[AdvantageEstimator(estimator)] if builtin else get_estimator(str(estimator)).fn
    rewards, mask = inputs.token_level_rewards, inputs.response_mask
    if rewards.dim() != 2 or mask.shape != rewards.shape:
        raise ValueError(
            f"token_level_rewards {tuple(rewards.shape)} and response_mask {tuple(mask.shape)} "
            "must both be [B, T]"
        )
    if inputs.values is not None and inputs.values.shape != rewards.shape:
        raise ValueError(f"values {tuple(inputs.values.shape)} must match rewards {tuple(rewards.shape)}")
    with torch.no_grad():
        out = fn(inputs, params or AdvantageParams())
    if out.advantages.shape != rewards.shape or out.returns.shape != rewards.shape:
        raise ValueError(
            f"estimator {str(estimator)!r} returned advantages {tuple(out.advantages.shape)} and returns "
            f"{tuple(out.returns.shape)}; both must be {tuple(rewards.shape)} like token_level_rewards"
        )
    return out
