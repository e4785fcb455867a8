"""The reward of rows an environment ran: data source `env/<anything>` is scored by the episode's reward.

The environment loop (`quartet.environments.loop`) puts the episode's reward (the sum of its steps'
rewards) in `extra_info["env_reward"]` and, for a row whose environment failed, the failure in
`extra_info["env_error"]`. `compute_score` (verl's signature; the rule registry routes every `env/...`
data source here) returns the reward, 0.0 for an episode no step rewarded (the loop counts those in
`env/unrewarded`); a failed row raises, so the reward computer scores it 0, counts it in
`reward/error_count` and names it (environment, row, sample, turn, error) in the run's `bad_rows.jsonl`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENV_DATA_SOURCE_PREFIX", "compute_score"]

ENV_DATA_SOURCE_PREFIX = "env/"


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """The episode's reward of an `env/...` row (0.0 when it got none); a ValueError for a failed one."""
    info: Mapping[str, Any] = extra_info if isinstance(extra_info, Mapping) else {}
    if info.get("env_error"):
        raise ValueError(f"the environment failed this row: {info['env_error']}")
    if "env_reward" not in info:
        raise ValueError(
            f"data source {data_source!r} is scored by its environment, and no agent loop ran this row: "
            "set rollout.multi_turn.enable=true (and agent_name: environment, or "
            "rollout.multi_turn.default_agent)"
        )
    reward = info.get("env_reward")
    return 0.0 if reward is None else float(reward)
