"""Typed names of the algorithm pieces a config can choose.

The functions behind these names live in `quartet.core` (advantages, losses, KL); a new built-in estimator
is a new function plus a new member here. A user's estimator or policy loss is registered by name from
their own module instead (`quartet.core.registry`), and the config checks that name before any worker
starts.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["AdvantageEstimator", "KLControl", "KLPenalty", "LossAggMode", "PolicyLoss", "TISMode"]


class AdvantageEstimator(StrEnum):
    """How advantages are computed from rewards (and values, for GAE)."""

    GAE = "gae"
    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"

    @property
    def needs_critic(self) -> bool:
        """Only GAE bootstraps from a learned value function."""
        return self is AdvantageEstimator.GAE

    @property
    def needs_group(self) -> bool:
        """Estimators whose baseline comes from the other samples of the same prompt."""
        return self in _GROUP_ESTIMATORS


_GROUP_ESTIMATORS = frozenset(
    {
        AdvantageEstimator.GRPO,
        AdvantageEstimator.DR_GRPO,
        AdvantageEstimator.RLOO,
        AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE,
        AdvantageEstimator.OPO,
    }
)


class PolicyLoss(StrEnum):
    """The surrogate objective of the actor update."""

    PPO = "ppo"  # clipped ratio, asymmetric clip and optional dual clip
    GSPO = "gspo"  # sequence-level importance ratio
    REINFORCE = "reinforce"  # plain -A * log pi


class TISMode(StrEnum):
    """How the importance ratio between the trainer's and the sampling engine's log-probs weighs tokens."""

    TRUNCATE = "truncate"  # min(ratio, cap): truncated importance sampling
    MASK = "mask"  # 1 inside [low, cap], 0 outside: masked importance sampling


class LossAggMode(StrEnum):
    """How per-token losses are reduced to one scalar."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"
    TOKEN_SUM = "token-sum"  # plain sum over valid tokens, no denominator (verl's name)


class KLPenalty(StrEnum):
    """Estimator of KL(pi || pi_ref) from per-token log-probs (Schulman's k1/k2/k3 and kin).

    The values are verl's names, so a verl config's `kl_penalty` / `kl_loss_type` string loads unchanged.
    """

    K1 = "k1"  # log(pi/pi_ref): unbiased, high variance, can be negative
    KL = "kl"  # verl's default name for k1 (same function)
    ABS = "abs"  # |log(pi/pi_ref)|
    K2 = "k2"  # 0.5 * log(pi/pi_ref)^2: biased, low variance, non-negative
    MSE = "mse"  # verl's other name for k2 (same function)
    K3 = "k3"  # pi_ref/pi - 1 - log(pi_ref/pi) with verl's clamps (log-ratio to +-20, value to +-10)
    LOW_VAR_KL = "low_var_kl"  # verl's other name for k3 (same function, same clamps)
    FULL = "full"  # exact KL over the vocabulary: a name verl accepts but does not implement (refused)
    K1_PLUS = "k1+"  # straight-through: value of k1, gradient of k2
    KL_PLUS = "kl+"  # = k1+
    ABS_PLUS = "abs+"  # value of abs, gradient of k2
    K2_PLUS = "k2+"  # value and gradient of k2 (= k2)
    MSE_PLUS = "mse+"  # = k2+
    K3_PLUS = "k3+"  # value of the clamped k3, gradient of k2
    LOW_VAR_KL_PLUS = "low_var_kl+"  # = k3+

    @property
    def straight_through(self) -> bool:
        """Forward value of one estimator with the gradient of k2 (verl's "+" suffix)."""
        return self.value.endswith("+")

    @property
    def base(self) -> KLPenalty:
        """The estimator whose forward value this one has: `k3+` -> `k3`, `kl` -> `kl`."""
        return KLPenalty(self.value.removesuffix("+"))


class KLControl(StrEnum):
    """How the in-reward KL coefficient evolves (same values as `quartet.config.algorithm.KLControl`)."""

    FIXED = "fixed"
    ADAPTIVE = "adaptive"  # Ziegler et al. 2019: move the coefficient toward a target KL
