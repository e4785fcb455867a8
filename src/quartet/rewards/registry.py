"""User-registered rule scorers: `@register_reward("my/data_source")` in `algorithm.custom_module`.

    # my_algo.py
    from quartet.rewards.registry import register_reward

    @register_reward("my/countdown")
    def score(data_source, solution_str, ground_truth, extra_info=None) -> float: ...

With `reward.function` empty, rows whose `data_source` is a registered name are scored by that function
(verl's signature, float or dict, as for `reward.function`); the others by the built-in rules. A registered
name is looked up before the built-in tables, so it can also replace a built-in source's rule.

Scoring runs in worker processes (`ScorePool`): they import the same user modules. `import_custom_module`
lists every module it imported in the environment variable `QUARTET_CUSTOM_MODULES`, which the scoring
workers (child processes of the driver) inherit; the rule scorer imports them before its first item
(`import_inherited_modules`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TypeVar

from quartet.core.registry import CUSTOM_MODULES_ENV, import_custom_module
from quartet.rewards.scoring import ScoreFn

__all__ = ["import_inherited_modules", "register_reward", "registered_rewards"]

_REWARDS: dict[str, ScoreFn] = {}

F = TypeVar("F", bound=Callable[..., object])


def register_reward(data_source: str) -> Callable[[F], F]:
    """Decorator: score rows of `data_source` with `fn(data_source, solution_str, ground_truth, extra_info)`
    (verl's signature)."""
    if not data_source or not isinstance(data_source, str):
        raise ValueError(f"a data source must be a non-empty string, got {data_source!r}")
    if data_source in _REWARDS:
        raise ValueError(f"a reward for data source {data_source!r} is already registered")

    def decorate(fn: F) -> F:
        _REWARDS[data_source] = fn
        return fn

    return decorate


def registered_rewards() -> Mapping[str, ScoreFn]:
    """The scorers registered in this process, by data source (read-only view)."""
    return MappingProxyType(_REWARDS)


def import_inherited_modules() -> None:
    """Import the user modules the parent process imported (`QUARTET_CUSTOM_MODULES`), once each."""
    for spec in filter(None, os.environ.get(CUSTOM_MODULES_ENV, "").split(os.pathsep)):
        import_custom_module(spec)
