"""Environments: the seam between quartet's agent loops and tasks written elsewhere (docs/environments.md).

    from quartet.environments import Environment, StepResult, register_environment

- `base`: the interface (`Environment.reset(row)`, `step(turn) -> StepResult`, `tools()`, `close()`).
- `registry`: `@register_environment(name)`, looked up by rows and `rollout.multi_turn.environment`.
- `loop`: the generic agent loop `environment` that runs one (registered on import of this package).
- `scoring`: rows with data source `env/<name>` are scored by the episode's reward.
- `reasoning_gym`: reasoning-gym's procedural tasks as prompt rows scored by its own verifiers.
- `verifiers_env`: verifiers environments loaded (as `vf.load_environment` does) and their datasets as rows.
- `verifiers_episode`: the environment `verifiers`: an episode on verifiers' state, scored by its rubric.
"""

from __future__ import annotations

from quartet.environments import loop as loop
from quartet.environments import verifiers_episode as verifiers_episode
from quartet.environments.base import Environment, EnvRow, ModelTurn, StepResult, ToolCall
from quartet.environments.registry import register_environment, registered_environments

__all__ = [
    "EnvRow",
    "Environment",
    "ModelTurn",
    "StepResult",
    "ToolCall",
    "register_environment",
    "registered_environments",
]
