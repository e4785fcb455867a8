"""The model shapes of a run's roles, read from the config alone (config.json files; tiny models from
`model.tiny`): what the memory plan sizes each training engine by."""

from __future__ import annotations

from dataclasses import dataclass

from quartet.config.plan import plan_step
from quartet.config.root import QuartetConfig
from quartet.planning.model_shape import ModelShape, policy_shape, shape_from_path

__all__ = ["RoleShapes", "resolve_shapes"]


@dataclass(frozen=True)
class RoleShapes:
    """Model shapes of the run: the policy (actor, rollout, reference), critic, reward model, teacher."""

    policy: ModelShape
    critic: ModelShape | None = None
    reward: ModelShape | None = None
    teacher: ModelShape | None = None


def resolve_shapes(cfg: QuartetConfig) -> RoleShapes:
    """Read the shapes the config points to (config.json files only; tiny models from `model.tiny`)."""
    policy = policy_shape(cfg.model)
    critic = None
    if plan_step(cfg).critic:
        critic = shape_from_path(cfg.critic.model_path) if cfg.critic.model_path else policy
    reward = shape_from_path(cfg.reward.model_path) if cfg.reward.model_path else None
    teacher = shape_from_path(cfg.teacher.model_path) if cfg.teacher.local else None
    return RoleShapes(policy, critic, reward, teacher)
