"""The error a request the engine refuses raises, and the checks of one field's value that raise it.

Every failure is an `InvalidRequestError` naming the field, a `ValueError`, so callers that caught
`ValueError` before keep working and a server can answer 400 with the field's name. The sampling parameters
(`quartet.rollout.types`) and the engine's checks at submission (`quartet.rollout.validation`) both raise it.
"""

from __future__ import annotations

import math

__all__ = ["InvalidRequestError", "is_int", "require_finite", "require_integer"]


class InvalidRequestError(ValueError):
    """A request the engine refuses before running it; `field` names the offending input."""

    def __init__(self, field: str, reason: str, request_id: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.request_id = request_id
        where = f"request {request_id}: " if request_id is not None else ""
        super().__init__(f"{where}{field}: {reason}")


def is_int(value: object) -> bool:
    """An int, not a bool (True is an int to Python, not to a request)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_finite(field: str, value: object) -> float:
    """`value` as a float; `InvalidRequestError` when it is not a number or not finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise InvalidRequestError(field, f"must be finite, got {value}")
    return float(value)


def require_integer(field: str, value: object, low: int, high: int) -> int:
    """`value` itself; `InvalidRequestError` when it is not an integer in [low, high]."""
    if not is_int(value):
        raise InvalidRequestError(field, f"must be an integer, got {value!r}")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise InvalidRequestError(field, f"must lie in [{low}, {high}], got {value}")
    return value
