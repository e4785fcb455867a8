"""Cross-field rules of a tiny gpt-oss or DeepSeek-V3 model (`model.tiny.arch`; docs/moe.md).

What only the whole config tells: the built-in rollout engine does not decode either (`rollout.engine`),
and a DeepSeek-V3 router has no load-balancing loss to weigh (`actor.moe_aux_loss_coef`,
`critic.moe_aux_loss_coef`). A model folder is checked when it loads (the rollout engine's runner, the
training engine's router), as its type is known only then.
"""

from __future__ import annotations

from quartet.config.errors import ConfigError
from quartet.config.moe_shapes import SIGMOID_ROUTED, rollout_gap
from quartet.config.rollout import RolloutEngineKind
from quartet.config.root import QuartetConfig

__all__ = ["shape_rules"]


def shape_rules(cfg: QuartetConfig) -> list[ConfigError]:
    """What keeps a tiny gpt-oss or DeepSeek-V3 run from starting as configured; empty otherwise."""
    if not cfg.model.is_tiny:
        return []
    arch = cfg.model.tiny.arch.value
    out: list[ConfigError] = []
    gap = rollout_gap(arch)
    if gap and cfg.rollout.engine is RolloutEngineKind.TORCH:
        out.append(
            ConfigError(
                "rollout.engine",
                f"is torch, and the built-in engine does not compute {gap} of model.tiny.arch={arch}",
                "set rollout.engine=vllm, or train another model.tiny.arch (docs/moe.md)",
            )
        )
    if arch in SIGMOID_ROUTED:
        roles = [("actor", cfg.actor.moe_aux_loss_coef)]
        if cfg.algorithm.needs_critic:
            roles.append(("critic", cfg.critic.moe_aux_loss_coef))
        for role, coef in roles:
            if coef:
                out.append(
                    ConfigError(
                        f"{role}.moe_aux_loss_coef",
                        f"is {coef}, but model.tiny.arch={arch} routes by sigmoid scores with a correction "
                        "bias: its training defines no load-balancing loss (docs/moe.md)",
                        f"set {role}.moe_aux_loss_coef to 0 or null",
                    )
                )
    return out
