"""The reward of rows an environment ran: data source `env/<anything>` is scored by the episode's reward.

The environment loop (`quartet.environments.loop`) puts the episode's reward (the sum of its steps'
rewards) in `extra_info["env_reward"]` and, for a row whose environment failed, the failure in
`extra_info["env_error"]`. `compute_score` (verl's signature; the rule registry routes every `env/...`
data source here) returns the reward; a failed row, or an episode whose environment never gave a reward,
raises, so the reward computer scores it 0, counts it in `reward/error_count` and names it (environment,
row, sample, turn, error) in the run's `bad_rows.jsonl`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENV_DATA_SOURCE_PREFIX", "compute_score"]

ENV_DATA_SOURCE_PREFIX = "env/"


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The episode's reward of an `env/...` row; a ValueError for a failed or unrewarded episode."""
    info: Mapping[str, Any] = extra_info if isinstance(extra_info, Mapping) else {}
    if info.get("env_error"):
        raise ValueError(f"the environment failed this row: {info['env_error']}")
    reward = info.get("env_reward")
    if reward is None:
        raise ValueError(
            f"data source {data_source!r} is scored by its environment's reward, and this episode got none: "
            "return StepResult(reward=...) from step, or give the rows another data_source with a scorer"
        )
    return float(reward)
