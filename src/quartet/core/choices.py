"""Typed names of the algorithm pieces a config can choose.

The functions behind these names live in `quartet.core` (advantages, losses, KL); a new estimator is a new
function plus a new member here, never a free string looked up at run time.
"""

from enum import StrEnum

__all__ = ["AdvantageEstimator", "KLPenalty", "LossAggMode", "PolicyLoss"]


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


class LossAggMode(StrEnum):
    """How per-token losses are reduced to one scalar."""

    TOKEN_MEAN = "token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"


class KLPenalty(StrEnum):
    """Estimator of KL(pi || pi_ref) from per-token log-probs (Schulman's k1/k2/k3 and kin)."""

    K1 = "k1"
    ABS = "abs"
    K2 = "k2"
    K3 = "k3"
    LOW_VAR_KL = "low_var_kl"
