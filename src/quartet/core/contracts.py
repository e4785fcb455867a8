"""What a user's estimator or policy loss receives and returns: the types of the registry's contracts.

The built-in estimators (`quartet.core.advantages`) and losses (`quartet.core.policy_loss`) and the ones a
user module registers (`quartet.core.registry`) share these types. They sit below all three, so the
registry can name the contracts it looks up while the estimators and losses look their names up in it.
`quartet.core.advantages` and `quartet.core.policy_loss` export them too, where users import them from.

torch, numpy and the metric types are named for the type checker only: the config imports the registry on
the driver, and importing the config must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence

    import numpy as np
    import torch

    from quartet.core.metrics import Metrics, TensorMetrics

__all__ = [
    "AdvantageInputs",
    "AdvantageOutput",
    "AdvantageParams",
    "ClipParams",
    "GroupIndex",
    "TokenLosses",
]

GroupIndex: TypeAlias = "Sequence[Hashable] | np.ndarray | torch.Tensor"
"""One prompt id (`uid`) per response: a list, a numpy array (object or numeric) or a 1-d tensor."""


@dataclass(frozen=True)
class AdvantageOutput:
    """Advantages and returns, both [B, T] and 0 on masked tokens, and the estimator's metrics."""

    advantages: torch.Tensor
    returns: torch.Tensor
    metrics: Metrics = field(default_factory=dict)


@dataclass(frozen=True)
class AdvantageInputs:
    """What the estimators read from a batch; each estimator checks that its own inputs are present."""

    token_level_rewards: torch.Tensor
    """[B, T] rewards (outcome score on the last valid token, minus any in-reward KL penalty)."""
    response_mask: torch.Tensor
    """[B, T] bool or 0/1: 1 on tokens written by the model."""
    values: torch.Tensor | None = None
    """[B, T] critic values V(s_t) (GAE)."""
    index: GroupIndex | None = None
    """[B] prompt ids grouping the responses (GRPO, Dr.GRPO, RLOO, OPO, REINFORCE++-baseline)."""
    reward_baselines: torch.Tensor | None = None
    """[B] reward of the greedy response to the same prompt (ReMax)."""


@dataclass(frozen=True)
class AdvantageParams:
    """Hyper-parameters; defaults match `quartet.config.algorithm.AlgorithmConfig`."""

    gamma: float = 1.0
    """Discount (GAE, REINFORCE++), per valid token."""
    lam: float = 1.0
    """GAE lambda."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group std; False gives Dr.GRPO."""
    whiten: bool = False
    """GAE: whiten the advantages over the valid tokens of the batch."""
    epsilon: float = 1e-6
    """GRPO: added to the group std."""


@dataclass(frozen=True)
class ClipParams:
    """Ratio clipping; defaults match `quartet.config.roles.ActorConfig`."""

    clip_ratio_low: float = 0.2
    """r >= 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """r <= 1 + clip_ratio_high (DAPO clip-higher: 0.28)."""
    dual_clip_c: float = 0.0
    """Dual-clip constant c > 1 for A < 0; 0 disables (PPO only)."""

    def __post_init__(self) -> None:
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0:
            raise ValueError(f"clip ratios must be >= 0, got {self.clip_ratio_low}, {self.clip_ratio_high}")
        if not (self.dual_clip_c == 0.0 or self.dual_clip_c > 1.0):
            raise ValueError(f"dual_clip_c must be 0 (off) or > 1, got {self.dual_clip_c}")


@dataclass(frozen=True)
class TokenLosses:
    """Per-token losses [B, T] (graph attached; masked positions hold garbage-free values) and metrics."""

    losses: torch.Tensor
    metrics: TensorMetrics = field(default_factory=dict)
