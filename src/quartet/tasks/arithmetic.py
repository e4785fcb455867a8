"""Arithmetic: `What is 3+4?` -> `7`. A seeded generator, an exact verifier, and a chat set for SFT.

Problems are `a <op> b` with operands of `digits` digits (0 .. 10**digits - 1) and op in `+ - *`. The
problem space is small for one digit (100 problems per operation), so the validation split is drawn first
as distinct problems and the training split never contains them: validation accuracy measures answers to
problems the model has not seen, not recall.

The verifier is exact: the response's answer (the whole stripped text, or the number after the last `=`
of a worked answer like `3+4=7`) must equal the true result as an integer.

Two data sets are written: the SFT chat set (`messages` column, `write_sft_set`) and the RL prompt set in
verl's layout (`write_rl_set`: the question as the user message, the result as `reward_model.ground_truth`),
graded by `compute_score`, verl's reward-function signature.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.tasks.rows import CHAT_FILES, RL_FILES, ProblemRows, write_splits

__all__ = [
    "DATA_SOURCE",
    "OPERATIONS",
    "ROWS",
    "ArithmeticProblem",
    "ArithmeticSpec",
    "chat_messages",
    "compute_score",
    "extract_answer",
    "held_out_split",
    "rl_rows",
    "sample_problems",
    "sft_rows",
    "verify_answer",
    "write_rl_set",
    "write_sft_set",
]

DATA_SOURCE = "arithmetic"
OPERATIONS = ("+", "-", "*")
_INTEGER = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True)
class ArithmeticSpec:
    """Which problems the task draws: operand digits, operations, and the answer style."""

    digits: int = 1
    """Digits of each operand."""

    operations: tuple[str, ...] = ("+",)
    """Operations drawn from (uniformly)."""

    worked_answer: bool = False
    """Answer `3+4=7` instead of `7`."""

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"digits must be >= 1, got {self.digits}")
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if not self.operations or unknown:
            raise ValueError(f"operations must be a non-empty subset of {OPERATIONS}, got {self.operations}")

    @property
    def base(self) -> int:
        """Operands lie in [0, base)."""
        return int(10**self.digits)

    @property
    def space_size(self) -> int:
        """Number of distinct problems."""
        return self.base * self.base * len(self.operations)

    def problem(self, index: int) -> ArithmeticProblem:
        """The problem numbered `index` in [0, space_size)."""
        op_index, rest = divmod(index, self.base * self.base)
        a, b = divmod(rest, self.base)
        return ArithmeticProblem(a, self.operations[op_index], b)


@dataclass(frozen=True)
class ArithmeticProblem:
    """One problem `a <op> b`."""

    a: int
    op: str
    b: int

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def question(self) -> str:
        """The user's message."""
        return f"What is {self.expression}?"

    @property
    def value(self) -> int:
        if self.op == "+":
            return self.a + self.b
        if self.op == "-":
            return self.a - self.b
        return self.a * self.b

    @property
    def answer(self) -> str:
        """The ground truth, as the verifier compares it."""
        return str(self.value)


def sample_problems(
    spec: ArithmeticSpec, n: int, seed: int, exclude: Iterable[ArithmeticProblem] = ()
) -> list[ArithmeticProblem]:
    """`n` problems drawn uniformly (with replacement) from the space minus `exclude`; seeded."""
    banned = set(exclude)
    if len(banned) >= spec.space_size:
        raise ValueError("every problem is excluded; widen the task (more digits or operations)")
    rng = random.Random(seed)
    out: list[ArithmeticProblem] = []
    while len(out) < n:
        problem = spec.problem(rng.randrange(spec.space_size))
        if problem not in banned:
            out.append(problem)
    return out


def held_out_split(
    spec: ArithmeticSpec, train_size: int, val_size: int, seed: int
) -> tuple[list[ArithmeticProblem], list[ArithmeticProblem]]:
    """(train, val): `val_size` DISTINCT problems, and `train_size` problems drawn from the rest."""
    if val_size * 2 > spec.space_size:
        raise ValueError(
            f"{val_size} held-out problems is more than half of the {spec.space_size} problems of "
            f"{spec.digits}-digit {'/'.join(spec.operations)}; lower the validation size or widen the task"
        )
    rng = random.Random(seed)
    val = [spec.problem(i) for i in rng.sample(range(spec.space_size), val_size)]
    train = sample_problems(spec, train_size, seed + 1, exclude=val)
    return train, val


def extract_answer(response: str) -> str:
    """The answer part of a response: the text after the last `=` if any, stripped (and a final `.`)."""
    text = response.strip()
    if "=" in text:
        text = text.rsplit("=", 1)[1].strip()
    return text.removesuffix(".").strip()


def verify_answer(response: str, ground_truth: str) -> bool:
    """True when the response's answer is exactly the integer `ground_truth`."""
    answer = extract_answer(response)
    return bool(_INTEGER.match(answer)) and int(answer) == int(ground_truth)


def compute_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """1.0 when the response's answer is exactly `ground_truth`, else 0.0 (verl's reward-function form)."""
    return 1.0 if verify_answer(solution_str, ground_truth) else 0.0


def chat_messages(problem: ArithmeticProblem, worked_answer: bool = False) -> list[dict[str, str]]:
    """A two-message conversation: the question and the assistant's answer."""
    reply = f"{problem.expression}={problem.answer}" if worked_answer else problem.answer
    return [{"role": "user", "content": problem.question}, {"role": "assistant", "content": reply}]


ROWS: ProblemRows[ArithmeticProblem] = ProblemRows(
    DATA_SOURCE,
    "arithmetic",
    question=lambda p: p.question,
    answer=lambda p: p.answer,
    extra=lambda p: {"expression": p.expression},
)
"""The task's row layout: the question alone as the prompt (the SFT set's prompt too)."""


def sft_rows(problems: Iterable[ArithmeticProblem], worked_answer: bool = False) -> list[dict[str, Any]]:
    """Rows of the chat set: `messages`, `ground_truth`, `data_source`."""
    return ROWS.sft_rows(problems, lambda p, _weak: chat_messages(p, worked_answer))


def rl_rows(problems: Iterable[ArithmeticProblem], split: str) -> list[dict[str, Any]]:
    """Rows of the RL prompt set in verl's layout (the question alone: the SFT set's prompt)."""
    return ROWS.rl_rows(problems, split)


def write_rl_set(
    folder: str | Path, spec: ArithmeticSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `rl_train.parquet` and `rl_val.parquet` (verl layout; no validation problem is in training)."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(folder, RL_FILES, rl_rows(train, "train"), rl_rows(val, "val"))


def write_sft_set(
    folder: str | Path, spec: ArithmeticSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `train.parquet` and `val.parquet` of the chat set into `folder`; their paths."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(
        folder, CHAT_FILES, sft_rows(train, spec.worked_answer), sft_rows(val, spec.worked_answer)
    )
