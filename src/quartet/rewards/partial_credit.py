"""Partial credit for integer answers: a reward that gives a gradient where the exact verdict gives none.

    reward.function=quartet.rewards.partial_credit:digit_partial_credit

For the tool tasks whose answer is an integer copied from a tool's output (`calculator`, `word_problems`):
an exact answer scores 1.0, as with the task's own rule; an integer answer that is not exact scores
`PARTIAL` (0.5) x the share of digit positions it gets right, compared from the left over the longer of the
two (so a missing or an extra digit costs a position, and a sign mismatch scores 0); anything else scores 0.
A policy that never copies a result exactly gets rewards that still rank its answers by how close their
digits come, so GRPO's groups are no longer all-equal. Every other data source is scored by its usual rule
(quartet's default scorer), so the function can stand as `reward.function` in a mixed run.

This is a reward option, chosen in the config and reported as such; the held-out accuracy the demo prints
is always the exact rule's.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["PARTIAL", "digit_partial_credit", "digit_share"]

PARTIAL = 0.5
"""The most a non-exact integer answer can earn."""

SOURCES = ("calculator", "word_problems")
_INTEGER = re.compile(r"^[+-]?\d+$")


def digit_share(answer: str, truth: str) -> float:
    """The share of digit positions of `answer` equal to `truth`'s, from the left, over the longer one;
    0.0 when the signs differ or either is not an integer."""
    answer, truth = answer.strip(), truth.strip()
    if not _INTEGER.match(answer) or not _INTEGER.match(truth):
        return 0.0
    if answer.startswith("-") != truth.startswith("-"):
        return 0.0
    a, t = answer.lstrip("+-"), truth.lstrip("+-")
    return sum(x == y for x, y in zip(a, t, strict=False)) / max(len(a), len(t))


def digit_partial_credit(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 exact, PARTIAL x `digit_share` for another integer, 0 otherwise (module docstring)."""
    from quartet.rewards.rules.registry import default_compute_score
    from quartet.tasks.calculator import final_text

    exact = float(default_compute_score(data_source, solution_str, ground_truth, extra_info))
    if data_source not in SOURCES or exact >= 1.0:
        return exact
    return PARTIAL * digit_share(final_text(solution_str, extra_info), str(ground_truth))
