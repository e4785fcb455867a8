"""A reward for the inspector's test runs that varies with the response (a random tiny model never answers
right, so the task's own 0/1 rule would score every sample 0): the sum of its code points mod 5, in
quarters (0, 0.25, .., 1)."""

from __future__ import annotations

from typing import Any


def varied(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    return (sum(map(ord, solution_str)) % 5) / 4
