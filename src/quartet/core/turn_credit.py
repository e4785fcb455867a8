"""Turn-level credit for multi-turn trajectories: rewards the environment gives after single model turns.

An agent trajectory's response alternates model turns (`response_mask` 1) and environment turns (0). The
environment may reward a model turn on the spot: a tool call that ran (`ToolResult.reward`), a simulated
user's verdict on one reply (`InteractionReply.turn_reward`). The rollout places the reward of model turn k
on that turn's last token in the [B, T] column `turn_rewards` (0 elsewhere), as outcome scores are placed
on the last valid token. Model turn k of row i is the k-th run of consecutive mask-1 tokens (`turn_index`):
between two model turns there is always an environment turn, so the mask alone tells the turns apart.

Per turn, the discounted return of the turn rewards from that turn on (gamma = `algorithm.turn_gamma`):

    r_{i,k} = sum of turn_rewards over the tokens of turn k of row i
    G_{i,k} = r_{i,k} + gamma G_{i,k+1}               (G past the last turn = 0)

For the group estimators (GRPO and kin), the turn term is group-relative like the outcome one (as in
MT-GRPO, Zeng et al. 2025, generalised to any number of turns): over every turn (i, k) of the rows of one
prompt group g, mean and unbiased std of the G's, and

    A_turn[i, k] = (G_{i,k} - mean_g G) / (std_g G + eps)     (without norm_by_std: G_{i,k} - mean_g G)

0 for a group with fewer than two turns in all. Every token of turn k gets A_turn[i, k]; the trainer adds
`algorithm.turn_reward_coef` x A_turn to the outcome advantage, so a turn that earned more than its group's
turns is pushed up even when every conversation of the group ended with the same outcome (where the outcome
advantage is 0). For the estimators that take token-level rewards (GAE, REINFORCE++, ReMax), the turn rewards
are added, times the coefficient, to the token-level rewards instead: their own returns carry them back.
"""

from __future__ import annotations

import numpy as np
import torch

from quartet.core.advantages import GroupIndex, group_ids

__all__ = ["turn_index", "turn_level_advantages", "turn_returns"]


def turn_index(response_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] int64: the model turn (0, 1, ...) of each mask-1 token, -1 on environment tokens and padding."""
    mask = response_mask.bool()
    previous = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    starts = (mask & ~previous).to(torch.int64)
    index = torch.cumsum(starts, dim=-1) - 1
    return torch.where(mask, index, torch.full_like(index, -1))


def turn_returns(
    turn_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(returns [B, K], valid [B, K]): G_{i,k} for each model turn k of row i (K: the most turns of a row);
    valid marks the turns a row has. Rewards on environment tokens are ignored."""
    index = turn_index(response_mask)
    rows = index.shape[0]
    turns = int(index.max().item()) + 1 if index.numel() else 0
    if turns <= 0:
        empty = torch.zeros(rows, 0, dtype=torch.float64)
        return empty, empty.bool()
    per_turn = torch.zeros(rows, turns, dtype=torch.float64)
    on_turn = index >= 0
    row_of = torch.arange(rows).unsqueeze(1).expand_as(index)
    per_turn.index_put_(
        (row_of[on_turn], index[on_turn]), turn_rewards.to(torch.float64)[on_turn], accumulate=True
    )
    valid = torch.zeros(rows, turns, dtype=torch.bool)
    valid[row_of[on_turn], index[on_turn]] = True
    returns = torch.zeros_like(per_turn)
    running = torch.zeros(rows, dtype=torch.float64)
    for k in range(turns - 1, -1, -1):
        running = torch.where(valid[:, k], per_turn[:, k] + gamma * running, running)
        returns[:, k] = torch.where(valid[:, k], running, torch.zeros_like(running))
    return returns, valid


def turn_level_advantages(
    turn_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    gamma: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """[B, T] float32: A_turn[i, turn of t] on each model token t (module docstring), 0 elsewhere."""
    returns, valid = turn_returns(turn_rewards, response_mask, gamma)
    rows = returns.shape[0]
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    if returns.shape[1] == 0:
        return out
    ids, n_groups = group_ids(index, rows)
    ids_np = ids.cpu().numpy()
    g = returns.numpy()
    v = valid.numpy()
    normalised = np.zeros_like(g)
    for group in range(n_groups):
        members = ids_np == group
        values = g[members][v[members]]
        if values.size < 2:
            continue  # no baseline for a lone turn: its advantage stays 0
        centred = g[members] - values.mean()
        if norm_by_std:
            centred = centred / (values.std(ddof=1) + epsilon)
        normalised[members] = np.where(v[members], centred, 0.0)
    per_turn = torch.from_numpy(normalised)
    turn = turn_index(response_mask)
    gathered = torch.gather(per_turn, 1, turn.clamp(min=0))
    return torch.where(turn >= 0, gathered, torch.zeros_like(gathered)).to(torch.float32)
