"""The arithmetic task's exact verifier, free of quartet's imports, for the TRL side of the benchmarks.

Same rule as `quartet.tasks.arithmetic.verify_answer` (tests/benchmarks check the two agree): the
answer is the text after the last `=` (or the whole stripped text), a final `.` removed; it must be an
integer equal to the ground truth.
"""

from __future__ import annotations

import re

__all__ = ["exact_answer"]

_INTEGER = re.compile(r"^[+-]?\d+$")


def exact_answer(text: str, ground_truth: str) -> float:
    """1.0 when the response's answer is exactly the integer `ground_truth`, else 0.0."""
    answer = text.strip()
    if "=" in answer:
        answer = answer.rsplit("=", 1)[1].strip()
    answer = answer.removesuffix(".").strip()
    return 1.0 if _INTEGER.match(answer) and int(answer) == int(ground_truth) else 0.0
