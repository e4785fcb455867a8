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
from quartet.serving.limits import (
    MAX_SEED,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_TEMPERATURE,
    MAX_TOP_LOGPROBS,
    MIN_TEMPERATURE,
)

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


_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (
        lambda v: v == 0 or MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
        f"must be 0 (greedy) or lie in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]",
    ),
    "top_p": (lambda v: 1e-6 <= v <= 1, "must lie in (0, 1] (at least 1e-6)"),
    "top_k": (lambda v: 0 <= v < 2**31, "must lie in [0, 2**31) (0 disables)"),
    "max_new_tokens": (lambda v: 1 <= v < 2**31, "must lie in [1, 2**31)"),
    "n": (lambda v: 1 <= v < 2**31, "must be >= 1"),
    "seed": (lambda v: v is None or -MAX_SEED - 1 <= v <= MAX_SEED, "must lie in [-2**63, 2**63)"),
    "stop": (
        lambda v: len(v) <= MAX_STOP and all(len(s) <= MAX_STOP_CHARS for s in v),
        f"may hold at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters",
    ),
    "stop_token_ids": (lambda v: len(v) <= MAX_STOP, f"may hold at most {MAX_STOP} ids"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "must lie in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "must lie in [-2, 2]"),
    "repetition_penalty": (lambda v: 0.01 <= v <= 100, "must lie in [0.01, 100] (1 disables)"),
    "min_tokens": (lambda v: 0 <= v < 2**31, "must be >= 0"),
    "top_logprobs": (lambda v: 0 <= v <= MAX_TOP_LOGPROBS, f"must lie in [0, {MAX_TOP_LOGPROBS}]"),
}


def build_sampling(param_prefix: str, **fields: Any) -> SamplingParams:
    """`SamplingParams(**fields)` after range checks that name the offending field."""
    for name, (ok, rule) in _RANGES.items():
        if name in fields and not ok(fields[name]):
            raise bad(f"'{param_prefix}{name}' {rule}, got {show(fields[name])}", f"{param_prefix}{name}")
    if fields.get("min_tokens", 0) > fields.get("max_new_tokens", 2**31):
        raise bad(
            f"'{param_prefix}min_tokens' must not exceed the response limit", f"{param_prefix}min_tokens"
        )
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        raise bad(str(exc), None) from None
