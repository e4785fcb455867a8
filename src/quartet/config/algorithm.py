"""Advantage estimation and KL handling of the RL step."""

from __future__ import annotations

from dataclasses import dataclass, field

from quartet.config.errors import require
from quartet.core.choices import AdvantageEstimator, KLControl, KLPenalty

__all__ = ["AlgorithmConfig", "KLControl", "KLControlConfig"]


@dataclass(frozen=True)
class KLControlConfig:
    """Coefficient of the KL penalty subtracted from token rewards."""

    kind: KLControl = KLControl.FIXED
    """Fixed or adaptive coefficient."""

    coef: float = 0.001
    """Initial (or fixed) coefficient."""

    target_kl: float = 0.1
    """Target KL of the adaptive controller."""

    horizon: int = 10000
    """Horizon (in samples) of the adaptive controller."""

    def __post_init__(self) -> None:
        require(self.coef >= 0, "coef", "must be >= 0")
        require(self.target_kl > 0, "target_kl", "must be > 0")
        require(self.horizon > 0, "horizon", "must be > 0")


@dataclass(frozen=True)
class AlgorithmConfig:
    """Which estimator turns rewards into advantages, and the KL-in-reward penalty."""

    adv_estimator: AdvantageEstimator = AdvantageEstimator.GRPO
    """Advantage estimator; `gae` trains a critic, the others are critic-free."""

    gamma: float = 1.0
    """Discount factor (GAE, REINFORCE++)."""

    lam: float = 1.0
    """GAE lambda."""

    norm_adv_by_std: bool = True
    """GRPO: divide by the group's reward std (off gives Dr.GRPO's unnormalised advantage)."""

    whiten_advantages: bool = True
    """GAE: whiten advantages over the valid tokens of the batch (verl always does)."""

    use_kl_in_reward: bool = False
    """Subtract kl_ctrl.coef x KL(pi || pi_ref) from token rewards (PPO/RLHF style); needs the reference."""

    kl_penalty: KLPenalty = KLPenalty.K1
    """Estimator of the in-reward KL."""

    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Coefficient controller of the in-reward KL."""

    filter_groups: bool = False
    """DAPO dynamic sampling: drop prompt groups whose rewards are all equal (zero advantage) and generate
    on fresh prompts until `data.train_batch_size` informative groups remain; counted."""

    max_num_gen_batches: int = 4
    """Dynamic sampling: generation batches per step at most; short of groups after them, the batch is
    filled with dropped ones (`dynamic_sampling/padded_groups`)."""

    def __post_init__(self) -> None:
        require(0.0 <= self.gamma <= 1.0, "gamma", f"must lie in [0, 1], got {self.gamma}")
        require(0.0 <= self.lam <= 1.0, "lam", f"must lie in [0, 1], got {self.lam}")
        require(self.max_num_gen_batches >= 1, "max_num_gen_batches", "must be >= 1")
        require(
            self.kl_penalty != KLPenalty.FULL,
            "kl_penalty",
            "'full' needs full-vocabulary log-probs, which quartet does not carry (verl 0.9.1 raises "
            "NotImplementedError for it too)",
            "use 'kl' (k1, verl's default for the in-reward penalty) or 'low_var_kl'",
        )
