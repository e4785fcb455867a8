"""Advantage estimation and KL handling of the RL step."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from quartet.config.errors import ConfigError, require
from quartet.core.choices import AdvantageEstimator, KLControl, KLPenalty, PolicyLoss
from quartet.core.registry import (
    CustomModuleError,
    estimator_names,
    import_custom_module,
    registered_estimators,
    resolve_module_spec,
)

__all__ = ["AlgorithmConfig", "KLControl", "KLControlConfig", "builtin_choice", "unknown_name_fix"]


def unknown_name_fix(name: str, builtin: list[str], registered: list[str], decorator: str) -> str:
    """The fix of an unknown estimator / policy loss name: the closest name, every name, how to add one."""
    close = difflib.get_close_matches(name, builtin + registered, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return (
        f"{hint}use a built-in name {builtin} or a registered one {registered or '(none registered)'}, or "
        f"register it with @{decorator} in the module named by algorithm.custom_module"
    )


def builtin_choice(value: str, choices: type[AdvantageEstimator] | type[PolicyLoss]) -> str:
    """The enum member for a built-in name (matched as the config loader matches enums), else the name."""
    for member in choices:
        if value.lower() in (member.value.lower(), member.name.lower()):
            return member
    return value


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

    min_coef: float = 1e-6
    """Floor of the adaptive coefficient (quartet.core.kl.DEFAULT_MIN_COEF): from it, a KL above target
    multiplies the coefficient up again, where verl's stays 0 forever once it reaches 0. 0: no floor
    (verl's rule, clamped at 0). An adaptive coef of 0 starts at 0 and is lifted to the floor by the first
    update (docs/from_verl.md)."""

    def __post_init__(self) -> None:
        require(self.coef >= 0, "coef", "must be >= 0")
        require(self.target_kl > 0, "target_kl", "must be > 0")
        require(self.horizon > 0, "horizon", "must be > 0")
        require(self.min_coef >= 0, "min_coef", "must be >= 0 (0: no floor, verl's rule)")
        require(
            self.kind != KLControl.ADAPTIVE or self.coef == 0 or self.coef >= self.min_coef,
            "min_coef",
            f"{self.min_coef} is above coef {self.coef}: the first update would lift the coefficient to it",
            "lower min_coef (0: no floor) or raise coef",
        )


@dataclass(frozen=True)
class AlgorithmConfig:
    """Which estimator turns rewards into advantages, and the KL-in-reward penalty."""

    adv_estimator: str = AdvantageEstimator.GRPO
    """Advantage estimator: a built-in name (`gae` trains a critic, the others are critic-free) or a name
    registered with `@register_estimator` in `custom_module` (critic-free)."""

    custom_module: str = ""
    """User module imported first (driver and every worker that computes losses), whose
    `@register_estimator` / `@register_policy_loss` / `@register_reward` functions the config may name:
    a path to a .py file (relative paths are made absolute against the current directory) or a dotted
    module name. Empty: none. See docs/custom_algorithms.md."""

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

    turn_reward_coef: float = 0.0
    """Multi-turn: weight of the rewards the environment gives single model turns (a tool call's reward,
    a simulated user's `turn_reward`). Group estimators add this x the group-relative return of each turn
    to that turn's tokens' advantage; GAE / REINFORCE++ / ReMax add this x the turn rewards to the
    token-level rewards. 0: turn rewards are not used (see quartet.core.turn_credit)."""

    turn_gamma: float = 1.0
    """Discount of later turns' rewards in a turn's return (turn_reward_coef)."""

    distill_coef: float = 0.0
    """On-policy distillation (docs/distillation.md): weight of the teacher's per-token reverse-KL
    advantage, -(log pi_student - log pi_teacher) of each sampled token, added to the task advantages.
    Needs `teacher.model_path`. 0: no distillation signal."""

    distill_task_coef: float = 1.0
    """Weight of the task reward's advantages beside the distillation term: 0 distils alone (the published
    recipe), 1 adds the teacher's signal to RL on the task."""

    distill_gamma: float = 0.0
    """Discount of later tokens' reverse KL in a token's distillation advantage (0: each token its own,
    as published; 1: the reverse KL of the rest of the response)."""

    gkd_coef: float = 0.0
    """GKD (docs/distillation.md): weight of the generalised Jensen-Shannon divergence between the teacher's
    and the student's next-token distributions over the teacher's top `gkd_top_k` tokens, a loss term beside
    the policy loss. Needs a local teacher (`teacher.model_path`). 0: off."""

    gkd_beta: float = 0.5
    """GKD's interpolation: 0 the forward KL(teacher || student), 1 the reverse KL(student || teacher), 0.5
    the symmetric Jensen-Shannon divergence (TRL's `GKDConfig.beta`)."""

    gkd_top_k: int = 16
    """Tokens per position in GKD's support: the teacher's most likely ones (the tail is dropped)."""

    filter_groups: bool = False
    """DAPO dynamic sampling: drop prompt groups whose rewards are all equal (zero advantage) and generate
    on fresh prompts until `data.train_batch_size` informative groups remain; counted."""

    max_num_gen_batches: int = 4
    """Dynamic sampling: generation batches per step at most; short of groups after them, the batch is
    filled with dropped ones (`dynamic_sampling/padded_groups`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "custom_module", resolve_module_spec(self.custom_module))
        try:
            import_custom_module(self.custom_module)
        except CustomModuleError as exc:
            fix = "fix the module, or set custom_module to ''"
            raise ConfigError("custom_module", str(exc), fix) from exc
        object.__setattr__(self, "adv_estimator", builtin_choice(self.adv_estimator, AdvantageEstimator))
        builtin, registered = estimator_names()
        require(
            isinstance(self.adv_estimator, AdvantageEstimator) or self.adv_estimator in registered,
            "adv_estimator",
            f"'{self.adv_estimator}' is neither a built-in nor a registered estimator",
            unknown_name_fix(self.adv_estimator, builtin, registered, "register_estimator"),
        )
        require(0.0 <= self.gamma <= 1.0, "gamma", f"must lie in [0, 1], got {self.gamma}")
        require(0.0 <= self.lam <= 1.0, "lam", f"must lie in [0, 1], got {self.lam}")
        require(self.max_num_gen_batches >= 1, "max_num_gen_batches", "must be >= 1")
        coef = self.turn_reward_coef
        require(coef >= 0.0, "turn_reward_coef", f"must be >= 0, got {coef}")
        require(0.0 <= self.turn_gamma <= 1.0, "turn_gamma", f"must lie in [0, 1], got {self.turn_gamma}")
        require(self.distill_coef >= 0.0, "distill_coef", f"must be >= 0, got {self.distill_coef}")
        require(
            self.distill_task_coef >= 0.0, "distill_task_coef", f"must be >= 0, got {self.distill_task_coef}"
        )
        require(
            0.0 <= self.distill_gamma <= 1.0, "distill_gamma", f"must lie in [0, 1], got {self.distill_gamma}"
        )
        require(self.gkd_coef >= 0.0, "gkd_coef", f"must be >= 0, got {self.gkd_coef}")
        require(0.0 <= self.gkd_beta <= 1.0, "gkd_beta", f"must lie in [0, 1], got {self.gkd_beta}")
        require(self.gkd_top_k >= 1, "gkd_top_k", f"must be >= 1, got {self.gkd_top_k}")
        require(
            self.kl_penalty != KLPenalty.FULL,
            "kl_penalty",
            "'full' needs full-vocabulary log-probs, which quartet does not carry (verl 0.9.1 raises "
            "NotImplementedError for it too)",
            "use 'kl' (k1, verl's default for the in-reward penalty) or 'low_var_kl'",
        )

    @property
    def needs_critic(self) -> bool:
        """Only GAE bootstraps from a learned value function (registered estimators are critic-free)."""
        return isinstance(self.adv_estimator, AdvantageEstimator) and self.adv_estimator.needs_critic

    @property
    def needs_group(self) -> bool:
        """The estimator compares the samples of one prompt (built-in, or registered with needs_group)."""
        if isinstance(self.adv_estimator, AdvantageEstimator):
            return self.adv_estimator.needs_group
        custom = registered_estimators().get(self.adv_estimator)
        return custom is not None and custom.needs_group
