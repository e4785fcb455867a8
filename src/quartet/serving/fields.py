"""Typed readers of JSON request fields: each returns the value or raises a 400 that names the field.

Booleans are not numbers here (JSON `true` is no temperature), numbers must be finite, and token ids are
integers >= 0. `build_sampling` checks the ranges of sampling fields before `SamplingParams` does, so that
its error names the field as the caller spelled it (`top_p` in an OpenAI body, `sampling.top_p` in ours).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from quartet.rollout.types import SamplingParams
from quartet.serving.errors import ApiError

__all__ = ["bad", "boolean", "build_sampling", "integer", "number", "show", "str_list", "token_ids"]


def bad(message: str, param: str | None) -> ApiError:
    """A 400 about `param`."""
    return ApiError.bad_request(message, param)


def show(value: Any) -> str:
    """`value` as JSON, cut to 40 characters, for error messages."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def number(body: Mapping[str, Any], name: str, default: float, param: str) -> float:
    """`body[name]` as a finite float (`default` when missing or null)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(f"'{param}' must be a finite number, got {show(value)}", param)
    return float(value)


def integer(body: Mapping[str, Any], name: str, default: int | None, param: str) -> int | None:
    """`body[name]` as an int, not a bool (`default` when missing or null)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{param}' must be an integer, got {show(value)}", param)
    return value


def boolean(body: Mapping[str, Any], name: str, default: bool, param: str) -> bool:
    """`body[name]` as a bool (`default` when missing or null)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{param}' must be true or false, got {show(value)}", param)
    return value


def str_list(body: Mapping[str, Any], name: str, param: str) -> tuple[str, ...]:
    """`body[name]` as non-empty strings: one string or a list of them (none when missing or null)."""
    value = body.get(name)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise bad(f"'{param}' must be a non-empty string or a list of them, got {show(value)}", param)
    return tuple(value)


def token_ids(value: Any, param: str, *, allow_empty: bool = False) -> tuple[int, ...]:
    """`value` as a tuple of token ids (integers >= 0)."""
    ok = isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    )
    if not ok or (not value and not allow_empty):
        empty = "" if allow_empty else "non-empty "
        raise bad(f"'{param}' must be a {empty}list of token ids (integers >= 0), got {show(value)}", param)
    return tuple(value)


_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "temperature": (lambda v: v >= 0, "must be >= 0 (0 means greedy)"),
    "top_p": (lambda v: 0 < v <= 1, "must lie in (0, 1]"),
    "top_k": (lambda v: v >= 0, "must be >= 0 (0 disables)"),
    "n": (lambda v: v >= 1, "must be >= 1"),
}


def build_sampling(param_prefix: str, **fields: Any) -> SamplingParams:
    """`SamplingParams(**fields)` after range checks that name the offending field."""
    for name, (ok, rule) in _RANGES.items():
        if name in fields and not ok(fields[name]):
            raise bad(f"'{param_prefix}{name}' {rule}, got {fields[name]}", f"{param_prefix}{name}")
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        raise bad(str(exc), None) from None
