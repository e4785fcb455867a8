"""Calculator: `What is 482 * 917 + 33?` -> call the calculator tool -> read its result -> answer `442027`.

A multi-turn tool-use task. With 3-digit operands the product is beyond a tiny model's head, and trivial
with the tool: success measures whether the model learned the protocol (a well-formed Hermes tool call that
copies the expression, then the tool's result copied as the answer).

- RL rows (verl layout): the question as the user message, `agent_name: tool_agent`, the integer result as
  ground truth, `extra_info.expression`. Validation problems never occur in training.
- SFT traces (`messages` + `tools` columns): question, the canonical tool call, the tool's result (as the
  calculator tool prints it), the answer. With `CalculatorSpec.sloppy` > 0 that share of the traces comes
  from a weaker demonstrator who answers from its head without the tool (`head_estimate`: the operands
  rounded to tens, wrong on ~99% of problems): mixed-quality demonstrations, which SFT imitates as they are
  and which RL can rise above, because its reward tells the two kinds apart.
- `compute_score`: 1.0 when the final assistant turn (`extra_info["final_message"]`, which the agent loop
  adds; else the response's last line) is exactly the integer result. A final turn that is itself a tool
  call (the loop ran out of turns) scores 0.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.tasks.rows import RL_FILES, SFT_FILES, ProblemRows, write_splits
from quartet.tasks.splits import distinct_split

__all__ = [
    "CALCULATOR_TOOLS",
    "DATA_SOURCE",
    "ROWS",
    "CalculatorProblem",
    "CalculatorSpec",
    "compute_score",
    "final_text",
    "head_estimate",
    "held_out_split",
    "round_tens",
    "tool_call_text",
    "verify_answer",
    "write_rl_set",
    "write_sft_set",
]

DATA_SOURCE = "calculator"
_INTEGER = re.compile(r"^[+-]?\d+$")


def _calculator_schema() -> dict[str, Any]:
    from quartet.agents.tools.calculator import CalculatorTool

    return dict(CalculatorTool.schema)


CALCULATOR_TOOLS: list[dict[str, Any]] = [_calculator_schema()]
"""The tool schemas the traces are rendered with: the built-in calculator's (rollout.multi_turn.tools)."""


@dataclass(frozen=True)
class CalculatorSpec:
    """Problems `a * b + c`: a and b with exactly `digits` digits, c with at most `digits`; `sloppy`: the
    share of SFT traces from a demonstrator that answers from its head, without the tool."""

    digits: int = 3
    sloppy: float = 0.0

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"digits must be >= 1, got {self.digits}")
        if not 0.0 <= self.sloppy <= 1.0:
            raise ValueError(f"sloppy must lie in [0, 1], got {self.sloppy}")

    def draw(self, rng: random.Random) -> CalculatorProblem:
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        return CalculatorProblem(rng.randint(low, high), rng.randint(low, high), rng.randint(0, high))


@dataclass(frozen=True)
class CalculatorProblem:
    """One problem `a * b + c`."""

    a: int
    b: int
    c: int

    @property
    def expression(self) -> str:
        return f"{self.a} * {self.b} + {self.c}"

    @property
    def question(self) -> str:
        return f"What is {self.expression}?"

    @property
    def answer(self) -> str:
        return str(self.a * self.b + self.c)


def tool_call_text(expression: str) -> str:
    """The canonical Hermes call of the calculator on `expression` (what the SFT traces teach)."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def held_out_split(
    spec: CalculatorSpec, train_size: int, val_size: int, seed: int
) -> tuple[list[CalculatorProblem], list[CalculatorProblem]]:
    """(train, val): `val_size` distinct problems, and `train_size` problems that are none of them."""
    return distinct_split(spec.draw, lambda problem: problem, train_size, val_size, seed)


def final_text(solution_str: str, extra_info: dict[str, Any] | None) -> str:
    """The final assistant turn (`extra_info["final_message"]`, which the agent loop adds), else the
    response's last line."""
    if extra_info and isinstance(extra_info.get("final_message"), str):
        return str(extra_info["final_message"])
    lines = solution_str.strip().splitlines()
    return lines[-1] if lines else ""


def verify_answer(response: str, ground_truth: str) -> bool:
    """True when `response` (the final assistant turn) is exactly the integer `ground_truth`."""
    text = response.strip()
    return bool(_INTEGER.match(text)) and int(text) == int(ground_truth)


def compute_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """1.0 when the final assistant turn is exactly the result, else 0.0 (module docstring)."""
    return 1.0 if verify_answer(final_text(solution_str, extra_info), ground_truth) else 0.0


def head_estimate(problem: CalculatorProblem) -> str:
    """The weaker demonstrator's answer without the tool: `a` and `b` rounded to tens (half up), times, plus
    `c`. Right only when both are multiples of ten."""
    return str(round_tens(problem.a) * round_tens(problem.b) + problem.c)


def round_tens(x: int) -> int:
    """`x` rounded to tens, half up (the weaker demonstrators' head arithmetic)."""
    return (x + 5) // 10 * 10


def _sft_messages(problem: CalculatorProblem, from_head: bool = False) -> list[dict[str, str]]:
    from quartet.agents.tools.calculator import evaluate, format_number

    question = {"role": "user", "content": problem.question}
    if from_head:
        return [question, {"role": "assistant", "content": head_estimate(problem)}]
    result = format_number(evaluate(problem.expression))
    return [
        question,
        {"role": "assistant", "content": tool_call_text(problem.expression)},
        {"role": "tool", "name": "calculator", "tool_call_id": "call_0_0", "content": result},
        {"role": "assistant", "content": result},
    ]


ROWS: ProblemRows[CalculatorProblem] = ProblemRows(
    DATA_SOURCE,
    "tool_use",
    question=lambda p: p.question,
    answer=lambda p: p.answer,
    extra=lambda p: {"expression": p.expression},
    agent_name="tool_agent",
)
"""The task's row layout (verl's, `agent_name` = tool_agent)."""


def sft_rows(
    problems: Iterable[CalculatorProblem], sloppy: float = 0.0, seed: int = 0
) -> list[dict[str, Any]]:
    """Rows of the SFT set: `messages`, `tools` (JSON text of the schemas), `ground_truth`, `data_source`.

    A share `sloppy` of them (drawn with `seed`) answers from the head without the tool (module docstring).
    """
    tools = json.dumps(CALCULATOR_TOOLS)
    return ROWS.sft_rows(problems, _sft_messages, sloppy=sloppy, seed=seed, tools=tools)


def rl_rows(problems: Iterable[CalculatorProblem], split: str) -> list[dict[str, Any]]:
    """Rows of the RL prompt set (verl's layout, `agent_name` = tool_agent)."""
    return ROWS.rl_rows(problems, split)


def write_rl_set(
    folder: str | Path, spec: CalculatorSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """`folder/rl_train.parquet` and `folder/rl_val.parquet`."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(folder, RL_FILES, rl_rows(train, "train"), rl_rows(val, "val"))


def write_sft_set(
    folder: str | Path, spec: CalculatorSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """`folder/sft_train.parquet` and `folder/sft_val.parquet` (the same held-out split as the RL set)."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(folder, SFT_FILES, sft_rows(train, spec.sloppy, seed), sft_rows(val))
