"""Counting: `Count from 137 to 420, separated by spaces.` -> `137 138 ... 420`. A task of LONG responses.

Why it exists: sequence parallelism and the long-context example need rows of thousands of response tokens
that a verifier can grade. Every correct answer here is the whole run of integers, so its length is set by
the spec: with the tiny tokenizer (one token per digit) a run of 300 three-digit numbers is ~1,200 tokens.

The score gives partial credit, so a response cut off at `data.max_response_length` or one that slips
halfway still earns something: the number of leading integers that match the expected run, divided by the
longer of the expected run and the integers written (writing past the end costs credit too). Only the
exact run scores 1. Separators are free: any non-digit text between the integers is ignored.

The ground truth is written compactly as `start..end` (inclusive), not the run itself, so the parquet
files stay small; the scorer expands it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.tasks.rows import CHAT_FILES, RL_FILES, ProblemRows, write_splits
from quartet.tasks.splits import distinct_split

__all__ = [
    "DATA_SOURCE",
    "ROWS",
    "CountingProblem",
    "CountingSpec",
    "compute_score",
    "expected_run",
    "prefix_credit",
    "rl_rows",
    "sft_rows",
    "verify_answer",
    "write_rl_set",
    "write_sft_set",
]

DATA_SOURCE = "counting"
_INTEGER = re.compile(r"-?\d+")
_TRUTH = re.compile(r"^\s*(-?\d+)\.\.(-?\d+)\s*$")


@dataclass(frozen=True)
class CountingSpec:
    """Which runs the task draws: where they start and how many integers they hold."""

    max_start: int = 999
    """Runs start at an integer drawn from [1, max_start]."""

    min_count: int = 250
    """Fewest integers in a run."""

    max_count: int = 500
    """Most integers in a run (inclusive)."""

    def __post_init__(self) -> None:
        if self.max_start < 1:
            raise ValueError(f"max_start must be >= 1, got {self.max_start}")
        if not 1 <= self.min_count <= self.max_count:
            raise ValueError(
                f"counts must satisfy 1 <= min_count <= max_count, got {self.min_count}, {self.max_count}"
            )

    def draw(self, rng: random.Random) -> CountingProblem:
        """One problem: a start and a length drawn uniformly."""
        start = rng.randint(1, self.max_start)
        return CountingProblem(start, start + rng.randint(self.min_count, self.max_count) - 1)


@dataclass(frozen=True)
class CountingProblem:
    """Count from `start` to `end`, both included."""

    start: int
    end: int

    @property
    def question(self) -> str:
        """The user's message."""
        return f"Count from {self.start} to {self.end}, separated by spaces."

    @property
    def answer(self) -> str:
        """The ground truth, compact: `start..end`."""
        return f"{self.start}..{self.end}"

    @property
    def reply(self) -> str:
        """The correct response: the whole run."""
        return " ".join(str(n) for n in range(self.start, self.end + 1))


def expected_run(ground_truth: str) -> list[int]:
    """The integers a `start..end` ground truth asks for; ValueError naming the form otherwise."""
    match = _TRUTH.match(ground_truth)
    if match is None:
        raise ValueError(f"a counting ground truth is 'start..end' (e.g. '3..9'), got {ground_truth!r}")
    start, end = int(match.group(1)), int(match.group(2))
    return list(range(start, end + 1))


def prefix_credit(written: list[int], expected: list[int]) -> float:
    """Leading integers equal to the expected run, over the longer of the two lists (0 for two empty)."""
    matched = 0
    for got, want in zip(written, expected, strict=False):
        if got != want:
            break
        matched += 1
    longest = max(len(written), len(expected))
    return matched / longest if longest else 0.0


def verify_answer(response: str, ground_truth: str) -> bool:
    """True when the response's integers are exactly the run `ground_truth` names."""
    return [int(n) for n in _INTEGER.findall(response)] == expected_run(ground_truth)


def compute_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """Partial credit in [0, 1] (`prefix_credit`); 1.0 only for the exact run (verl's reward form)."""
    return prefix_credit([int(n) for n in _INTEGER.findall(solution_str)], expected_run(ground_truth))


ROWS: ProblemRows[CountingProblem] = ProblemRows(
    DATA_SOURCE,
    "counting",
    question=lambda p: p.question,
    answer=lambda p: p.answer,
    extra=lambda p: {"start": p.start, "end": p.end},
)
"""The task's row layout: the question alone as the prompt."""


def _split(
    spec: CountingSpec, train_size: int, val_size: int, seed: int
) -> tuple[list[CountingProblem], list[CountingProblem]]:
    """Held-out split: validation runs (distinct start and end) never occur in training."""
    return distinct_split(spec.draw, lambda p: (p.start, p.end), train_size, val_size, seed)


def rl_rows(problems: Iterable[CountingProblem], split: str) -> list[dict[str, Any]]:
    """Rows of the RL prompt set in verl's layout."""
    return ROWS.rl_rows(problems, split)


def sft_rows(problems: Iterable[CountingProblem]) -> list[dict[str, Any]]:
    """Rows of the chat set: the question and the whole run as the answer."""
    return ROWS.sft_rows(
        problems,
        lambda p, _weak: [{"role": "user", "content": p.question}, {"role": "assistant", "content": p.reply}],
    )


def write_rl_set(
    folder: str | Path, spec: CountingSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `rl_train.parquet` and `rl_val.parquet` (verl layout; no validation run is in training)."""
    train, val = _split(spec, train_size, val_size, seed)
    return write_splits(folder, RL_FILES, rl_rows(train, "train"), rl_rows(val, "val"))


def write_sft_set(
    folder: str | Path, spec: CountingSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `train.parquet` and `val.parquet` of the chat set into `folder`; their paths."""
    train, val = _split(spec, train_size, val_size, seed)
    return write_splits(folder, CHAT_FILES, sft_rows(train), sft_rows(val))
