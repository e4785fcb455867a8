"""The `data.reasoning_gym` section: a weighted mixture of reasoning-gym tasks as the run's prompts.

The config layer cannot import reasoning-gym (the environments layer is above it), so task names are
checked where the rows are made (`quartet.environments.reasoning_gym_files`), before any worker starts;
here only the shapes of the values are checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from quartet.config.errors import ConfigError, require

__all__ = ["ReasoningGymConfig", "ReasoningGymTaskConfig"]


@dataclass(frozen=True)
class ReasoningGymTaskConfig:
    """One reasoning-gym dataset of the mixture."""

    name: str = ""
    """reasoning-gym dataset name, e.g. `chain_sum` (`reasoning_gym.factory.DATASETS` lists them)."""

    config: Any = None
    """The dataset's config keywords (its difficulty knobs), a mapping, e.g. {min_terms: 2, max_terms: 2};
    null: reasoning-gym's defaults."""

    size: int = 0
    """Distinct problems of the task's dataset (rows past it wrap around); 0: max(data.builtin_train_size,
    2 * data.builtin_val_size), room for a validation set with no training problem in it."""

    seed: int | None = None
    """Seed of the task's training problems (validation uses seed + 10_000_019); null: `data.seed`."""

    weight: float = 1.0
    """Share of the mixture, relative to the other tasks' weights."""

    def __post_init__(self) -> None:
        require(bool(self.name), "name", "must name a reasoning-gym task", "e.g. {name: chain_sum}")
        require(self.size >= 0, "size", f"must be >= 0, got {self.size}", "0: sized for the run")
        require(self.weight > 0, "weight", f"must be > 0, got {self.weight}")
        require(
            self.config is None or isinstance(self.config, dict),
            "config",
            f"must be a mapping of the task's settings, got {type(self.config).__name__}",
            "e.g. config: {min_terms: 2, max_terms: 2}",
        )
        try:
            json.dumps(self.config)
        except (TypeError, ValueError) as err:
            raise ConfigError(
                "config", f"is not JSON-serialisable ({err})", "use numbers, text, lists"
            ) from None


@dataclass(frozen=True)
class ReasoningGymConfig:
    """reasoning-gym tasks as the run's prompts (used when `data.train_files` is empty and `tasks` is not)."""

    tasks: tuple[ReasoningGymTaskConfig, ...] = ()
    """The mixture: a list of {name, config, size, seed, weight}. Empty: the built-in task
    (`data.builtin_task`). `data.builtin_train_size` / `builtin_val_size` rows are drawn from it."""

    system_prompt: str = "default"
    """The system message before each question: `default` (reasoning-gym's: asks for
    `<answer>...</answer>`), another of reasoning-gym's `SYSTEM_PROMPTS` styles, `none` for no system
    message, or any other text, used as written."""

    def __post_init__(self) -> None:
        names = [t.name for t in self.tasks]
        dup = sorted({n for n in names if names.count(n) > 1})
        require(
            not dup,
            "tasks",
            f"names {dup} more than once",
            "give each task once (one entry per (name, config); use weight for its share)",
        )
