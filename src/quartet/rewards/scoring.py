"""What a score function is, and how its return value is read.

Every scorer, built-in or custom, has verl's reward-function signature so functions move between the two
frameworks unchanged:

    compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict

A dict must hold "score"; its other keys whose values are numbers (bool, int, float) are extra metrics,
reported as batch means under `reward/extra/<key>`; non-numeric values (verl's math_dapo returns the
predicted string under "pred") are ignored and named once in the log. A score that is not a finite number
is an error: a NaN reward would silently poison every advantage of its prompt group.

This module imports only the standard library: it runs inside the scoring worker processes, which must
start fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "REWARD_ERROR_COUNT",
    "REWARD_EXTRA_PREFIX",
    "REWARD_SCORE_TIME",
    "REWARD_TIMEOUT_COUNT",
    "REWARD_WORKER_RESTARTS",
    "AnyItem",
    "FuncItem",
    "ScoreFn",
    "ScoreItem",
    "ScoreValue",
    "read_score",
]

# Metric names of a scoring call (new names; verl logs none of these).
REWARD_ERROR_COUNT = "reward/error_count"
"""Responses whose score call raised, returned no valid score, or whose worker died: scored 0."""
REWARD_TIMEOUT_COUNT = "reward/timeout_count"
"""Responses whose score call passed `reward.timeout_s`: scored 0, the worker replaced."""
REWARD_WORKER_RESTARTS = "reward/worker_restarts"
"""Scoring workers replaced during the call (after timeouts or crashes)."""
REWARD_SCORE_TIME = "reward/score_time_s"
"""Wall time of scoring the batch (decoding, rule calls, shaping)."""
REWARD_EXTRA_PREFIX = "reward/extra/"
"""Prefix of the batch means of the extra numeric keys that score functions return in a dict."""

ScoreFn = Callable[[Any, str, Any, Any], Any]
"""A score function, called positionally as fn(data_source, solution_str, ground_truth, extra_info)."""


class ScoreItem(NamedTuple):
    """The four arguments of one score call."""

    data_source: str | None
    """None only with a custom function and a data set without a `data_source` column."""
    solution_str: str
    ground_truth: Any
    extra_info: Any = None


class FuncItem(NamedTuple):
    """The arguments of one call of `callables.RewardFuncs` (reward functions passed as callables)."""

    prompt: Any
    """The row's prompt as in the data set (chat messages)."""
    completion: str
    columns: dict[str, Any]
    """The sample's other batch columns (ground_truth, extra_info, index, completion_ids, ...)."""
    data_source: str | None = None


AnyItem = ScoreItem | FuncItem
"""What a scoring backend is given per call: verl's four arguments, or a `FuncItem`."""


@dataclass(frozen=True)
class ScoreValue:
    """A score function's return value, read: the score, numeric extras, and the keys left out."""

    score: float
    extras: dict[str, float]
    ignored: tuple[str, ...] = ()


def _number(value: Any) -> float | None:
    """`value` as a float when it is a plain number (numpy scalars included), else None."""
    if isinstance(value, bool | int | float):
        return float(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalars
        item = value.item()
        return float(item) if isinstance(item, bool | int | float) else None
    return None


def read_score(value: Any) -> ScoreValue:
    """Read a score function's return value; raise TypeError/ValueError when it is not a valid score."""
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"a dict returned by a score function must hold 'score'; it has {sorted(value)}")
        score = _number(value["score"])
        extras: dict[str, float] = {}
        ignored: list[str] = []
        for key, item in value.items():
            if key == "score":
                continue
            number = _number(item)
            if number is None:
                ignored.append(str(key))
            else:
                extras[str(key)] = number
        raw = value["score"]
    else:
        score = _number(value)
        extras = {}
        ignored = []
        raw = value
    if score is None:
        raise TypeError(
            f"a score must be a number (or a dict with a numeric 'score'), not {type(raw).__name__}"
        )
    if not math.isfinite(score):
        raise ValueError(f"score is {score}; a score must be finite")
    return ScoreValue(score, extras, tuple(ignored))
