"""Rewards: rule scorers chosen by data source, custom score functions, a timed process pool, token rewards.

`RewardComputer` (in `compute`) turns a batch of responses into `token_level_scores`; it imports torch and
is loaded on first use, so the scoring worker processes, which import this package, start without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quartet.rewards.backend import DEFAULT_FUNCTION, InlineScorer, ItemStatus, PoolResult, ScoringBackend
from quartet.rewards.custom import RewardFunctionError, load_function, resolve_spec
from quartet.rewards.pool import RewardWorkerError, ScorePool
from quartet.rewards.rules import UnknownDataSourceError, default_compute_score, select_scorer
from quartet.rewards.scoring import ScoreFn, ScoreItem, ScoreValue, read_score

if TYPE_CHECKING:
    from quartet.rewards.compute import RewardComputer

__all__ = [
    "DEFAULT_FUNCTION",
    "InlineScorer",
    "ItemStatus",
    "PoolResult",
    "RewardComputer",
    "RewardFunctionError",
    "RewardWorkerError",
    "ScoreFn",
    "ScoreItem",
    "ScorePool",
    "ScoreValue",
    "ScoringBackend",
    "UnknownDataSourceError",
    "default_compute_score",
    "load_function",
    "read_score",
    "resolve_spec",
    "select_scorer",
]


def __getattr__(name: str) -> Any:
    if name == "RewardComputer":
        from quartet.rewards.compute import RewardComputer

        return RewardComputer
    raise AttributeError(f"module 'quartet.rewards' has no attribute {name!r}")
