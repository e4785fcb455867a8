"""What every metric sink does, and the record helpers they share.

A record is a flat dict: `kind` ("step", "val", "data", ...), `step` (int, for step and val records),
`time` (added by the JSONL sink when absent) and metrics such as `"critic/score/mean": 0.75`. Values that
are not plain numbers (nested dicts, strings, bools) stay in the JSONL file and are skipped by the numeric
sinks (TensorBoard, W&B, MLflow).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["RESERVED_KEYS", "Sink", "flatten_config", "numeric_metrics", "record_step"]

RESERVED_KEYS = frozenset({"kind", "step", "time"})
"""Keys of a record that are not metrics."""


class Sink(Protocol):
    """One metric destination."""

    def log(self, record: Mapping[str, Any]) -> None:
        """Write one record (with `time` already set)."""

    def phase(self, name: str) -> None:
        """The running step entered phase `name` ("gen", "update_actor", ...); most sinks ignore it."""

    def close(self, failed: bool = False) -> None:
        """Flush and finish; `failed` marks the run as failed where the sink has such a state."""


def numeric_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's metrics that are real numbers (int or float, bool excluded), as floats."""
    return {
        key: float(value)
        for key, value in record.items()
        if key not in RESERVED_KEYS and isinstance(value, int | float) and not isinstance(value, bool)
    }


def record_step(record: Mapping[str, Any]) -> int | None:
    """The record's integer step, or None when it has none (a data report)."""
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; lists and other leaves are kept as they are."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = value
    return flat
