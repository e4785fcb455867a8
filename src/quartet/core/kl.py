"""KL(pi || pi_ref) from per-token log-probs: estimators, the KL loss term, the in-reward penalty and its
coefficient controllers.

Estimators (Schulman, "Approximating KL Divergence", 2020). Tokens are sampled from pi, and with
x = log pi(a) - log pi_ref(a) (so that E_pi[x] = KL(pi || pi_ref)) and rho = pi_ref / pi = exp(-x):

    k1   = x  ("kl")            unbiased, high variance, can be negative
    abs  = |x|
    k2   = x^2 / 2  ("mse")         biased (exact to second order), low variance, >= 0
    k3   = rho - 1 - log rho  ("low_var_kl")   unbiased, low variance, >= 0, computed as verl does:
           x clamped to [-20, 20] before exp and the value clamped to [-10, 10]. At x = -25 the raw k3 is
           e^25 - 26 = 7.2e10 with a gradient as large; clamped it is 10 with gradient 0. The clamp makes
           k3 biased where |x| is large, which is where one stale or outlier token would otherwise
           dominate the loss.
    full: the exact KL summed over the vocabulary. verl accepts the name but raises NotImplementedError;
           it needs full-vocabulary log-probs, which the batch does not carry, so it is refused here too
           (by the config, with the reason).
    name+ (straight-through; k1+ = kl+, abs+, k2+ = mse+, k3+ = low_var_kl+): forward value of `name`,
           gradient of k2:   k = k2 - sg[k2] + sg[k_name]   (so k2+ is k2)

Why straight-through: used as a loss on samples of pi, the gradient of k1 has expectation 0 and that of
k3, (1 - rho) grad log pi, has the expectation of the gradient of the reverse KL(pi_ref || pi); the gradient
of k2, x grad log pi, has the expectation of grad KL(pi || pi_ref). So the "+" variants optimise the KL
they report, with the value of the estimator (verl's "+" suffix, Schulman 2020).

Two uses:
- KL as a loss term (GRPO style): L_kl = coef * aggregate(k(x)) added to the actor loss; gradient through
  logp (`kl_loss_term`).
- KL as a reward penalty (PPO/RLHF style, Ziegler et al. 2019): r_t <- score_t - beta * k(x_t) on valid
  tokens with logp the old (behaviour) log-probs, no gradient (`apply_kl_penalty`); beta from a fixed or
  adaptive controller. The adaptive controller (Ziegler et al. 2019, sec. 2.2):
        e = clip(KL_current / KL_target - 1, -0.2, 0.2);   beta <- beta * (1 + e * n_steps / horizon)
  with n_steps the number of samples since the last update (the batch size), as in verl and TRL.
  Floor (departure from verl): beta is kept >= `min_coef` (`algorithm.kl_ctrl.min_coef`, 1e-6 by default)
  after each update. verl's rule is multiplicative, so a beta that reaches 0 stays 0 forever whatever the KL
  (0 * factor = 0), and it reaches 0, or below, when the factor 1 + e * n_steps / horizon is <= 0
  (n_steps >= 5 * horizon with the KL under target), where verl's beta changes sign and the penalty pays the
  policy for moving away from the reference. From the floor the same rule moves beta up by the factor
  1 + e * n_steps / horizon per update while the KL is above target. Away from the floor the rule is verl's
  exactly. `min_coef=0` gives verl's rule with beta clamped at 0 (which then never recovers).

Departure from verl: the batch KL given to the controller is the mean over sequences with at least one
valid token of the per-sequence token-mean KL (verl averages over all rows, empty ones included).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from quartet.core.choices import KLControl, KLPenalty, LossAggMode
from quartet.core.loss_agg import aggregate_loss
from quartet.core.metrics import (
    KL_COEF,
    KL_LOSS,
    REWARD_KL_PENALTY,
    REWARD_KL_PENALTY_COEF,
    Metrics,
    TensorMetrics,
    masked_mean,
)

__all__ = [
    "KL_ESTIMATORS",
    "DEFAULT_MIN_COEF",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "KLLossOutput",
    "KLPenaltyOutput",
    "apply_kl_penalty",
    "kl_estimate",
    "kl_loss_term",
    "make_kl_controller",
]


def _k1(x: torch.Tensor) -> torch.Tensor:
    return x


def _abs(x: torch.Tensor) -> torch.Tensor:
    return x.abs()


def _k2(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x.square()


K3_LOG_RATIO_CLAMP = 20.0  # verl's bound on x before exp in k3
K3_VALUE_CLAMP = 10.0  # verl's bound on the value of k3


def _k3(x: torch.Tensor) -> torch.Tensor:
    # rho - 1 - log rho with rho = exp(-x); expm1 keeps small x accurate. verl's two clamps (see above).
    x = torch.clamp(x, -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return torch.clamp(torch.expm1(-x) + x, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


def _full(x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError(
        "kl 'full' needs the log-probs of the whole vocabulary, which quartet does not carry (verl raises "
        "NotImplementedError for it too); use 'low_var_kl' (k3) or 'k3+'"
    )


def _straight_through(
    value: Callable[[torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor], torch.Tensor]:
    def estimator(x: torch.Tensor) -> torch.Tensor:
        k2 = _k2(x)
        return k2 - k2.detach() + value(x).detach()

    return estimator


_BASE: dict[KLPenalty, Callable[[torch.Tensor], torch.Tensor]] = {
    KLPenalty.K1: _k1,
    KLPenalty.KL: _k1,
    KLPenalty.ABS: _abs,
    KLPenalty.K2: _k2,
    KLPenalty.MSE: _k2,
    KLPenalty.K3: _k3,
    KLPenalty.LOW_VAR_KL: _k3,
    KLPenalty.FULL: _full,
}

KL_ESTIMATORS: Mapping[KLPenalty, Callable[[torch.Tensor], torch.Tensor]] = MappingProxyType(
    {
        kind: (_straight_through(_BASE[kind.base]) if kind.straight_through else _BASE[kind])
        for kind in KLPenalty
        if kind.base in _BASE
    }
)
"""Each `KLPenalty` member's estimator as a function of x = logp - logp_ref (read-only)."""


def kl_estimate(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: KLPenalty) -> torch.Tensor:
    """Per-token KL estimate k(logp - logp_ref), same shape as the inputs ([B, T]); not masked.

    Gradients flow through both arguments (the reference log-probs are normally constants).
    """
    return KL_ESTIMATORS[KLPenalty(kind)](logprob - ref_logprob)


@dataclass(frozen=True)
class KLLossOutput:
    """coef * aggregated KL (0-d, graph attached) and detached metrics."""

    loss: torch.Tensor
    metrics: TensorMetrics


def kl_loss_term(
    logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    kind: KLPenalty = KLPenalty.LOW_VAR_KL,
    coef: float = 0.001,
    *,
    agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN,
    global_token_count: float | int | torch.Tensor | None = None,
    global_seq_count: float | int | torch.Tensor | None = None,
    norm_constant: float | None = None,
) -> KLLossOutput:
    """The actor's KL loss term coef * aggregate(k(logp - logp_ref)) (GRPO's in-loss KL).

    logprob, ref_logprob, response_mask: [B, T]. `actor/kl_loss` is the aggregated KL before the
    coefficient, `actor/kl_coef` the coefficient. Aggregation arguments: see `loss_agg.aggregate_loss`.
    """
    kl = kl_estimate(logprob, ref_logprob.detach(), kind)
    value = aggregate_loss(
        kl,
        response_mask,
        agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        norm_constant=norm_constant,
    )
    metrics = {KL_LOSS: value.detach(), KL_COEF: torch.tensor(float(coef), device=value.device)}
    return KLLossOutput(coef * value, metrics)


@dataclass(frozen=True)
class KLPenaltyOutput:
    """Rewards after the penalty [B, T], the batch KL for the controller, and driver metrics."""

    token_level_rewards: torch.Tensor
    current_kl: float
    metrics: Metrics


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_logprob: torch.Tensor,
    ref_logprob: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    kind: KLPenalty = KLPenalty.K1,
) -> KLPenaltyOutput:
    """Subtract coef * k(logp_old - logp_ref) from the scores on valid tokens (no gradient).

    Args:
        token_level_scores: [B, T] rewards before the penalty (masked positions are returned unchanged).
        old_logprob: [B, T] log-probs of the behaviour policy.
        ref_logprob: [B, T] log-probs of the reference policy.
        response_mask: [B, T] bool or 0/1.
        coef: beta, usually `controller.value`.
        kind: estimator (verl's default for the reward penalty is k1).

    Returns:
        token_level_rewards, and current_kl (mean over non-empty sequences of their token-mean KL) to pass to
        `controller.update(current_kl, n_steps=batch_size)`.
    """
    with torch.no_grad():
        valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
        kl = kl_estimate(old_logprob, ref_logprob, kind)
        kl = torch.where(valid, kl, torch.zeros_like(kl))
        rewards = token_level_scores - coef * kl.to(token_level_scores.dtype)
        per_seq = masked_mean(kl, valid, dim=-1)
        current = float(masked_mean(per_seq, valid.any(dim=-1)))
    metrics = {REWARD_KL_PENALTY: current, REWARD_KL_PENALTY_COEF: float(coef)}
    return KLPenaltyOutput(rewards, current, metrics)


class KLController:
    """A KL coefficient (`value`) that may change with the observed KL; saveable in checkpoints."""

    kind: KLControl = KLControl.FIXED

    def __init__(self, coef: float) -> None:
        if coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {coef}")
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Observe the batch KL of `n_steps` samples; the fixed controller ignores it."""

    def state_dict(self) -> dict[str, float | str]:
        """The coefficient (and the controller kind, checked on load)."""
        return {"kind": str(self.kind), "value": self.value}

    def load_state_dict(self, state: Mapping[str, float | str]) -> None:
        """Restore `value` from `state_dict()`; a state of another controller kind is an error."""
        if str(state["kind"]) != str(self.kind):
            raise ValueError(f"cannot load a '{state['kind']}' KL controller state into a '{self.kind}' one")
        self.value = float(state["value"])


class FixedKLController(KLController):
    """A constant coefficient."""


DEFAULT_MIN_COEF = 1e-6
"""The adaptive coefficient's default floor (`algorithm.kl_ctrl.min_coef`): 1/1000 of the default coef."""


class AdaptiveKLController(KLController):
    """Ziegler et al. 2019: beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon, >= min_coef.

    Departure from verl (see the module docstring): the floor `min_coef`, so that a coefficient driven down
    (or started at 0) rises again when the KL exceeds the target; verl's coefficient, once 0, stays 0, and
    with a factor below 0 it changes sign. Above the floor each update is verl's.
    """

    kind = KLControl.ADAPTIVE

    def __init__(
        self, coef: float, target_kl: float, horizon: int, min_coef: float = DEFAULT_MIN_COEF
    ) -> None:
        super().__init__(coef)
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl and horizon must be > 0, got {target_kl} and {horizon}")
        if min_coef < 0:
            raise ValueError(f"min_coef must be >= 0, got {min_coef}")
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)
        self.min_coef = float(min_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient toward the target: up when the KL is above it, down when below; never
        under `min_coef` (from there the KL above target multiplies it up again)."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value = max(self.min_coef, self.value * (1.0 + error * n_steps / self.horizon))


def make_kl_controller(
    kind: KLControl | str,
    coef: float,
    target_kl: float = 0.1,
    horizon: int = 10000,
    min_coef: float = DEFAULT_MIN_COEF,
) -> KLController:
    """The controller for `AlgorithmConfig.kl_ctrl` (kind, coef, target_kl, horizon, min_coef)."""
    if KLControl(kind) is KLControl.ADAPTIVE:
        return AdaptiveKLController(coef, target_kl, horizon, min_coef)
    return FixedKLController(coef)
