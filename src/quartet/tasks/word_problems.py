"""Word problems solved by writing and running code: `python` tool use (a ReTool / SimpleTIR-style task).

    "Mia has 47 boxes with 36 pencils in each and gives away 58 pencils. How many pencils are left?"
    -> the model calls python on `print(47 * 36 - 58)` -> reads `1634` -> answers `1634`.

Each problem is one of a few story templates over 2-digit numbers, each a two-step computation (a product
then a sum or difference, or three terms). The model has to turn the story into a program, so the skill is
reading, not copying an expression (the calculator task's question already holds the expression); the
numbers are beyond a tiny model's head, so the program's output is what gets the answer right.

- RL rows (verl layout): the question as the user message, `agent_name: tool_agent`, the integer result as
  ground truth, `extra_info.program` (the canonical program). Validation problems never occur in training.
- SFT traces (`messages` + `tools`): the question, the canonical call, the tool's message for that program
  as the python tool writes it (`exit status 0`, then its stdout), the answer. With
  `WordProblemSpec.sloppy` > 0 that share of the traces comes from a weaker demonstrator who answers from
  its head without running code (`head_estimate`: the numbers rounded to tens): mixed-quality
  demonstrations, as for the calculator.
- `compute_score`: 1.0 when the final assistant turn (`extra_info["final_message"]`) is exactly the result.

The traces carry the python tool's schema as this host's tool describes itself (`python_tool_schemas`:
its description names the sandbox's mode), so the prompts of SFT and of RL render alike.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from quartet.tasks.calculator import compute_score, round_tens, verify_answer
from quartet.tasks.rows import RL_FILES, SFT_FILES, ProblemRows, write_splits
from quartet.tasks.splits import distinct_split

__all__ = [
    "DATA_SOURCE",
    "ROWS",
    "TEMPLATES",
    "WordProblem",
    "WordProblemSpec",
    "compute_score",
    "held_out_split",
    "python_call_text",
    "python_tool_schemas",
    "verify_answer",
    "write_rl_set",
    "write_sft_set",
]

DATA_SOURCE = "word_problems"
_NAMES = ("Mia", "Leo", "Ava", "Sam", "Zoe", "Max", "Ida", "Tom")


@dataclass(frozen=True)
class _Template:
    text: str
    """The story, with {name}, {a}, {b}, {c}."""
    program: Callable[[int, int, int], str]
    """The canonical program's expression over a, b, c."""


TEMPLATES: tuple[_Template, ...] = (
    _Template(
        "{name} has {a} boxes with {b} pencils in each and gives away {c} pencils. How many pencils are "
        "left?",
        lambda a, b, c: f"{a} * {b} - {c}",
    ),
    _Template(
        "{name} buys {a} packs of {b} stickers and gets {c} more stickers as a gift. How many stickers "
        "does {name} have?",
        lambda a, b, c: f"{a} * {b} + {c}",
    ),
    _Template(
        "A hall has {a} rows of {b} seats, and {c} seats are empty. How many people are seated?",
        lambda a, b, c: f"{a} * {b} - {c}",
    ),
    _Template(
        "{name} had {a} coins, spent {b} coins, then found {c} coins. How many coins does {name} have now?",
        lambda a, b, c: f"{a} - {b} + {c}",
    ),
    _Template(
        "A farm has {a} cows and {b} hens, and {c} of the cows are sold. How many legs do the animals "
        "left on the farm have?",
        lambda a, b, c: f"({a} - {c}) * 4 + {b} * 2",
    ),
    _Template(
        "{name} reads {a} pages a day for {b} days, then {c} pages on the last day. How many pages is that?",
        lambda a, b, c: f"{a} * {b} + {c}",
    ),
)
"""The story templates; a problem picks one and three 2-digit numbers that keep every result positive."""


@dataclass(frozen=True)
class WordProblemSpec:
    """Problems from `TEMPLATES` with operands of `digits` digits; `sloppy`: the share of SFT traces from a
    demonstrator that answers from its head, without running code."""

    digits: int = 2
    sloppy: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 4:
            raise ValueError(f"digits must lie in [1, 4], got {self.digits}")
        if not 0.0 <= self.sloppy <= 1.0:
            raise ValueError(f"sloppy must lie in [0, 1], got {self.sloppy}")

    def draw(self, rng: random.Random) -> WordProblem:
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        while True:
            template = rng.randrange(len(TEMPLATES))
            a, b, c = (rng.randint(low, high) for _ in range(3))
            problem = WordProblem(template, rng.choice(_NAMES), a, b, c)
            if problem.value > 0 and _steps_positive(problem):
                return problem


def _steps_positive(p: WordProblem) -> bool:
    """No negative count on the way (coins spent beyond those had, cows sold beyond those there)."""
    if p.template == 3:
        return p.b <= p.a
    if p.template == 4:
        return p.c <= p.a
    return True


@dataclass(frozen=True)
class WordProblem:
    """One problem: a template index, a name and the numbers a, b, c."""

    template: int
    name: str
    a: int
    b: int
    c: int

    @property
    def question(self) -> str:
        return TEMPLATES[self.template].text.format(name=self.name, a=self.a, b=self.b, c=self.c)

    @property
    def program(self) -> str:
        return f"print({TEMPLATES[self.template].program(self.a, self.b, self.c)})"

    @property
    def value(self) -> int:
        expression = TEMPLATES[self.template].program(self.a, self.b, self.c)
        return int(_evaluate(expression))

    @property
    def answer(self) -> str:
        return str(self.value)

    @property
    def head_estimate(self) -> str:
        """The weaker demonstrator's answer without code: the same steps on the numbers rounded to tens."""
        rounded = (round_tens(self.a), round_tens(self.b), round_tens(self.c))
        return str(_evaluate(TEMPLATES[self.template].program(*rounded)))


def _evaluate(expression: str) -> int:
    """The value of a template expression (integer literals, + - *, parentheses), without eval."""
    from quartet.agents.tools.calculator import evaluate

    return int(evaluate(expression))


def python_call_text(program: str) -> str:
    """The canonical Hermes call of the python tool on `program` (what the SFT traces teach)."""
    call = {"name": "python", "arguments": {"code": program}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


@cache
def python_tool_schemas() -> tuple[str, ...]:
    """The python tool's schema as this host's built-in tool describes itself (JSON text, one element)."""
    from quartet.agents.tools.python_runner import PythonTool

    return (json.dumps(PythonTool(allow_unisolated=True).schema),)


def held_out_split(
    spec: WordProblemSpec, train_size: int, val_size: int, seed: int
) -> tuple[list[WordProblem], list[WordProblem]]:
    """(train, val): `val_size` distinct problems, and `train_size` problems with none of their numbers."""
    return distinct_split(spec.draw, lambda p: (p.template, p.a, p.b, p.c), train_size, val_size, seed)


def tool_message(program_output: str) -> str:
    """The python tool's message for a program that printed `program_output` and exited with status 0."""
    return f"exit status 0\n[stdout]\n{program_output}"


def _sft_messages(problem: WordProblem, from_head: bool = False) -> list[dict[str, str]]:
    question = {"role": "user", "content": problem.question}
    if from_head:
        return [question, {"role": "assistant", "content": problem.head_estimate}]
    return [
        question,
        {"role": "assistant", "content": python_call_text(problem.program)},
        {
            "role": "tool",
            "name": "python",
            "tool_call_id": "call_0_0",
            "content": tool_message(f"{problem.answer}\n"),
        },
        {"role": "assistant", "content": problem.answer},
    ]


ROWS: ProblemRows[WordProblem] = ProblemRows(
    DATA_SOURCE,
    "tool_use",
    question=lambda p: p.question,
    answer=lambda p: p.answer,
    extra=lambda p: {"program": p.program},
    agent_name="tool_agent",
)
"""The task's row layout (verl's, `agent_name` = tool_agent)."""


def sft_rows(problems: Iterable[WordProblem], sloppy: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """Rows of the SFT set: `messages`, `tools` (JSON text of the schemas), `ground_truth`, `data_source`.

    A share `sloppy` of them (drawn with `seed`) answers from the head without code (module docstring).
    """
    tools = "[" + ", ".join(python_tool_schemas()) + "]"
    return ROWS.sft_rows(problems, _sft_messages, sloppy=sloppy, seed=seed, tools=tools)


def rl_rows(problems: Iterable[WordProblem], split: str) -> list[dict[str, Any]]:
    """Rows of the RL prompt set (verl's layout, `agent_name` = tool_agent)."""
    return ROWS.rl_rows(problems, split)


def write_rl_set(
    folder: str | Path, spec: WordProblemSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """`folder/rl_train.parquet` and `folder/rl_val.parquet`."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(folder, RL_FILES, rl_rows(train, "train"), rl_rows(val, "val"))


def write_sft_set(
    folder: str | Path, spec: WordProblemSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """`folder/sft_train.parquet` and `folder/sft_val.parquet` (the same held-out split as the RL set)."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(folder, SFT_FILES, sft_rows(train, spec.sloppy, seed), sft_rows(val))
