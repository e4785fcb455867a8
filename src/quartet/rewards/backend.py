"""What scores items: one call's result, the backend protocol, and the in-process backend.

`ScorePool` (in `pool`) is the backend of training runs; `InlineScorer` runs the same function in the
calling process without time limits, for tests and debugging (breakpoints work in it).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from quartet.rewards.custom import load_function, resolve_spec
from quartet.rewards.scoring import REWARD_ERROR_COUNT, REWARD_TIMEOUT_COUNT, AnyItem, ScoreFn, read_score

__all__ = ["DEFAULT_FUNCTION", "InlineScorer", "ItemStatus", "LogOnce", "PoolResult", "ScoringBackend"]

logger = logging.getLogger(__name__)


DEFAULT_FUNCTION = "quartet.rewards.rules.registry:default_compute_score"
"""The function workers run when `reward.function` is empty: the rule of each row's data source."""


class ItemStatus(StrEnum):
    """How one item's score call ended."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"


@dataclass
class PoolResult:
    """Scores of one call, in the order of the items, with what went wrong."""

    scores: list[float]
    """Score per item; 0.0 for errors and timeouts."""
    extras: list[dict[str, float]]
    """Numeric extra metrics per item (empty for float returns, errors and timeouts)."""
    statuses: list[ItemStatus]
    """How each item's call ended."""
    elapsed_s: float = 0.0
    """Wall time of the call."""
    restarts: int = 0
    """Workers replaced during the call (after a timeout or a crash)."""
    reasons: dict[int, str] = field(default_factory=dict)
    """Why each failed item failed, by item position (one line: the exception, the timeout, the crash)."""

    @property
    def error_count(self) -> int:
        return sum(s is ItemStatus.ERROR for s in self.statuses)

    @property
    def timeout_count(self) -> int:
        return sum(s is ItemStatus.TIMEOUT for s in self.statuses)


class ScoringBackend(Protocol):
    """What scores items: a `ScorePool` or an `InlineScorer`."""

    def score(self, items: Sequence[AnyItem]) -> PoolResult: ...

    def close(self) -> None: ...


class LogOnce:
    """Logs the first message of each kind only; later ones show in the counts of the metrics."""

    _COUNTED_IN = {
        "errors": REWARD_ERROR_COUNT,
        "crashes": REWARD_ERROR_COUNT,
        "timeouts": REWARD_TIMEOUT_COUNT,
    }

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.seen: set[str] = set()

    def __call__(self, kind: str, message: str, *args: Any) -> None:
        if kind in self.seen:
            return
        self.seen.add(kind)
        if kind in self._COUNTED_IN:
            message += f"\n(logged once per pool; all {kind} are counted in {self._COUNTED_IN[kind]})"
        self.log.warning(message, *args)


class InlineScorer:
    """Scores in the calling process, one item after another, with no time limit (tests, debugging)."""

    def __init__(self, function: str | ScoreFn = "") -> None:
        """function: a spec as for `ScorePool`, or the callable itself (called as is, not pickled)."""
        if callable(function):
            self.spec = repr(function)
            self._fn = function
        else:
            self.spec = resolve_spec(function) if function else DEFAULT_FUNCTION
            self._fn = load_function(self.spec)
        self._log = LogOnce(logger)

    def score(self, items: Sequence[AnyItem]) -> PoolResult:
        """Score every item; an exception scores 0.0 and is counted as an error."""
        start = time.perf_counter()
        result = PoolResult([0.0] * len(items), [{} for _ in items], [ItemStatus.ERROR] * len(items))
        for i, item in enumerate(items):
            try:
                value = read_score(self._fn(*item))
            except Exception as err:
                result.reasons[i] = f"{type(err).__name__}: {err}"
                self._log(
                    "errors",
                    "reward function raised on item %d (%r):\n%s",
                    i,
                    item[0],
                    traceback.format_exc(),
                )
                continue
            result.scores[i], result.extras[i], result.statuses[i] = value.score, value.extras, ItemStatus.OK
        result.elapsed_s = time.perf_counter() - start
        return result

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> InlineScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
