"""The wall-clock spans a rollout replica spent generating: the driver's idle and overlap metrics."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BusyLog"]

KEPT_SPANS = 1000
"""Generation spans a replica keeps (the driver asks every step; colocated runs never ask: bounded)."""


@dataclasses.dataclass
class _Span:
    """One generation's wall-clock span; `end` is None while it runs."""

    start: float
    end: float | None = None


class BusyLog:
    """The last `KEPT_SPANS` generation spans, in `time.time()` seconds."""

    def __init__(self) -> None:
        self._spans: list[_Span] = []

    @contextmanager
    def span(self) -> Iterator[None]:
        """Record the enclosed block as one generation span."""
        span = _Span(time.time())
        self._spans = [*self._spans[-KEPT_SPANS:], span]
        try:
            yield
        finally:
            span.end = time.time()

    def since(self, since: float) -> list[tuple[float, float]]:
        """The (start, end) spans after `since`, clipped to it; the one in flight ends now."""
        now = time.time()
        spans = [(s.start, now if s.end is None else s.end) for s in list(self._spans)]
        return [(max(start, since), end) for start, end in spans if end > since]
