"""Countdown: combine the given numbers with + - * / to reach a target (TinyZero's RL task, made local).

Problems. Draw 3-4 numbers in 1..20 (configurable), then combine random pairs with a random operation that
keeps every intermediate result a positive integer (subtraction only when positive, division only when
exact), until one value is left: that value is the target, reachable by construction, and the combination
is kept as the problem's known solution. Targets outside 1..`max_target` are redrawn. The numbers are shown
in the order drawn, which says nothing of the solution's order.

Rule (TinyZero's `verl/utils/reward_score/countdown.py`): each given number is used EXACTLY once, compared
as multisets (`sorted(numbers in the expression) == sorted(given numbers)`); the value must equal the
target. We take TinyZero's rule rather than "at most once" so that one ground truth has one meaning across
quartet, verl and TinyZero data. Differences from TinyZero's scorer, all on the safe or exact side:
- the expression is parsed with `ast` and only integer literals, binary + - * / and parentheses are
  accepted (TinyZero checks characters with a regex and calls `eval`): names, calls, attributes, `**`,
  unary signs, floats, and anything longer than 256 characters score 0; nothing is ever evaluated by Python;
- the numbers are checked BEFORE evaluating, so only the given (small) numbers are ever multiplied;
- arithmetic is exact (`fractions.Fraction`): `(7/2)*4` reaches 14, and no float tolerance is involved;
- the score is 1.0 or 0.0 (TinyZero gives 0.1 for a well-formed wrong answer; reward shaping is left to
  the trainer's config, not hidden in a scorer).

Answer format. The expression is read from the last `<answer>...</answer>` when the response has one
(TinyZero's format), else from the response's last non-empty line; text from the first `=` on is dropped,
so `(3+5)*7 = 56` reads as `(3+5)*7`.

The ground truth is a JSON string `{"target": 56, "numbers": [3, 5, 7]}` (a mapping with those keys is also
accepted, which is how TinyZero's parquet stores it).
"""

from __future__ import annotations

import ast
import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from quartet.tasks.rows import CHAT_FILES, RL_FILES, ProblemRows, write_splits

__all__ = [
    "DATA_SOURCE",
    "CountdownProblem",
    "CountdownSpec",
    "ExpressionError",
    "compute_score",
    "evaluate_expression",
    "extract_expression",
    "generate_problem",
    "held_out_split",
    "rl_rows",
    "sft_rows",
    "verify_answer",
    "write_rl_set",
    "write_sft_set",
]

DATA_SOURCE = "countdown"
OPERATIONS = ("+", "-", "*", "/")
_MAX_EXPRESSION_CHARS = 256
_ALLOWED_CHARS = re.compile(r"^[0-9+\-*/()\s]+$")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BINOPS: dict[type[ast.operator], str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_ATOM = 3


class ExpressionError(ValueError):
    """An answer that is not an expression of integers, + - * / and parentheses (or divides by zero)."""


@dataclass(frozen=True)
class CountdownSpec:
    """Which problems the task draws, and how answers are written."""

    min_numbers: int = 3
    """Fewest numbers in a problem."""

    max_numbers: int = 4
    """Most numbers in a problem."""

    min_value: int = 1
    """Smallest number drawn."""

    max_value: int = 20
    """Largest number drawn."""

    max_target: int = 100
    """Largest target; targets are in 1..max_target (larger ones are redrawn)."""

    operations: tuple[str, ...] = OPERATIONS
    """Operations the generator combines with (answers may use any of + - * /)."""

    answer_tags: bool = False
    """Ask for (and, in the SFT set, write) the expression inside `<answer></answer>`, as TinyZero does."""

    worked_solution: bool = True
    """SFT answers show each step (`3+5=8`) on its own line before the final expression."""

    def __post_init__(self) -> None:
        if not 2 <= self.min_numbers <= self.max_numbers:
            raise ValueError(
                f"need 2 <= min_numbers <= max_numbers, got {self.min_numbers}, {self.max_numbers}"
            )
        if not 1 <= self.min_value <= self.max_value:
            raise ValueError(f"need 1 <= min_value <= max_value, got {self.min_value}, {self.max_value}")
        if self.max_target < 1:
            raise ValueError(f"max_target must be >= 1, got {self.max_target}")
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if not self.operations or unknown:
            raise ValueError(f"operations must be a non-empty subset of {OPERATIONS}, got {self.operations}")


@dataclass(frozen=True)
class CountdownProblem:
    """Numbers, a target, and one solution the generator built."""

    numbers: tuple[int, ...]
    target: int
    solution: str
    """An expression using each number once that equals `target`."""
    steps: tuple[str, ...] = ()
    """The solution one operation at a time, e.g. `3+5=8`."""

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        """What makes two problems the same one (the numbers' order and the solution do not)."""
        return tuple(sorted(self.numbers)), self.target

    @property
    def ground_truth(self) -> str:
        """The JSON ground truth `compute_score` reads."""
        return json.dumps({"target": self.target, "numbers": list(self.numbers)})

    def question(self, answer_tags: bool = False) -> str:
        """The user's message."""
        shown = ", ".join(str(n) for n in self.numbers)
        text = f"Using the numbers {shown} once each, with + - * / and ( ), make {self.target}."
        return text + (" Give the expression in <answer></answer>." if answer_tags else "")


# ---- generating ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    value: int
    text: str
    precedence: int


def _combine(a: _Node, op: str, b: _Node) -> _Node:
    """`a op b` with only the parentheses the value needs (left-to-right evaluation of equal precedence)."""
    p = _PRECEDENCE[op]
    left = f"({a.text})" if a.precedence < p else a.text
    right = f"({b.text})" if b.precedence < p or (b.precedence == p and op in "-/") else b.text
    if op == "+":
        value = a.value + b.value
    elif op == "-":
        value = a.value - b.value
    elif op == "*":
        value = a.value * b.value
    else:
        value = a.value // b.value  # exact: the generator only divides when it is
    return _Node(value, f"{left}{op}{right}", p)


def _draw(spec: CountdownSpec, rng: random.Random) -> CountdownProblem | None:
    """One attempt: numbers, then random pairs combined until one value is left; None if it is unusable."""
    numbers = [
        rng.randint(spec.min_value, spec.max_value)
        for _ in range(rng.randint(spec.min_numbers, spec.max_numbers))
    ]
    pool = [_Node(n, str(n), _ATOM) for n in numbers]
    steps = []
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        # Larger value first: subtraction stays positive and division can be exact.
        a, b = sorted((pool[i], pool[j]), key=lambda node: node.value, reverse=True)
        ops = [
            op
            for op in spec.operations
            if (op != "-" or a.value > b.value) and (op != "/" or a.value % b.value == 0)
        ]
        if not ops:
            return None
        op = rng.choice(ops)
        node = _combine(a, op, b)
        steps.append(f"{a.value}{op}{b.value}={node.value}")
        pool = [n for k, n in enumerate(pool) if k not in (i, j)] + [node]
    if not 1 <= pool[0].value <= spec.max_target:
        return None
    return CountdownProblem(tuple(numbers), pool[0].value, pool[0].text, tuple(steps))


def generate_problem(spec: CountdownSpec, rng: random.Random) -> CountdownProblem:
    """One solvable problem of `spec`, drawn with `rng` (an out-of-range target is redrawn)."""
    for _ in range(10_000):
        problem = _draw(spec, rng)
        if problem is not None:
            return problem
    raise ValueError(
        f"could not draw a countdown problem with a target in 1..{spec.max_target}; widen {spec}"
    )


def held_out_split(
    spec: CountdownSpec, train_size: int, val_size: int, seed: int
) -> tuple[list[CountdownProblem], list[CountdownProblem]]:
    """(train, val): `val_size` distinct problems, and `train_size` problems none of which is a validation
    problem (same numbers and target in any order); seeded."""
    rng = random.Random(seed)
    val: dict[tuple[tuple[int, ...], int], CountdownProblem] = {}
    budget = 100 * (train_size + val_size) + 1000
    while len(val) < val_size and budget:
        problem = generate_problem(spec, rng)
        val.setdefault(problem.key, problem)
        budget -= 1
    train: list[CountdownProblem] = []
    while len(train) < train_size and budget:
        problem = generate_problem(spec, rng)
        if problem.key not in val:
            train.append(problem)
        budget -= 1
    if not budget:
        raise ValueError(
            f"could not draw {val_size} distinct validation problems and {train_size} others from {spec}; "
            "lower the sizes or widen the task (more numbers, larger values or targets)"
        )
    return train, list(val.values())


# ---- verifying -------------------------------------------------------------------------------------------


def extract_expression(response: str) -> str:
    """The expression part of a response (see the module docstring); "" when there is none."""
    tagged: list[str] = _ANSWER_TAG.findall(response)
    if tagged:
        text = tagged[-1]
    else:
        lines = [line for line in response.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return text.split("=", 1)[0].strip().removesuffix(".").strip()


def _parse(expression: str) -> ast.expr:
    if not expression or len(expression) > _MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expected 1..{_MAX_EXPRESSION_CHARS} characters, got {len(expression)}")
    if not _ALLOWED_CHARS.match(expression):
        raise ExpressionError("only digits, + - * /, parentheses and spaces are allowed")
    try:
        return ast.parse(expression, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ExpressionError(f"not an expression: {type(err).__name__}") from err


def _literals(node: ast.expr) -> list[int]:
    """The integer literals of an allowed expression tree; ExpressionError on any other node."""
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _literals(node.left) + _literals(node.right)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    raise ExpressionError(f"'{type(node).__name__}' is not allowed (numbers, + - * / and parentheses only)")


def _value(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp)  # _literals has checked the tree
    a = _value(node.left)
    b = _value(node.right)
    op = _BINOPS[type(node.op)]
    if op == "/":
        if b == 0:
            raise ExpressionError("division by zero")
        return a / b
    return a + b if op == "+" else a - b if op == "-" else a * b


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]]:
    """(exact value, integer literals used) of a safe expression; `ExpressionError` otherwise."""
    tree = _parse(expression)
    numbers = _literals(tree)
    return _value(tree), numbers


def _parse_truth(ground_truth: str | Mapping[str, Any]) -> tuple[int, list[int]]:
    try:
        truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
        target, numbers = truth["target"], [int(n) for n in truth["numbers"]]
        return int(target), numbers
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            'countdown ground truth must be JSON {"target": int, "numbers": [int, ...]}, '
            f"got {ground_truth!r}"
        ) from err


def verify_answer(response: str, ground_truth: str | Mapping[str, Any]) -> bool:
    """True when the response's expression uses each given number exactly once and equals the target."""
    target, numbers = _parse_truth(ground_truth)
    try:
        tree = _parse(extract_expression(response))
        if Counter(_literals(tree)) != Counter(numbers):  # before evaluating: only given numbers get used
            return False
        return _value(tree) == target
    except ExpressionError:
        return False


def compute_score(
    solution_str: str, ground_truth: str | Mapping[str, Any], extra_info: dict[str, Any] | None = None
) -> float:
    """1.0 for a correct expression, else 0.0 (verl's reward-function form; `extra_info` is unused)."""
    return 1.0 if verify_answer(solution_str, ground_truth) else 0.0


# ---- data sets -------------------------------------------------------------------------------------------


def _answer(problem: CountdownProblem, spec: CountdownSpec) -> str:
    final = f"<answer>{problem.solution}</answer>" if spec.answer_tags else problem.solution
    return "\n".join([*problem.steps, final]) if spec.worked_solution else final


def _rows(spec: CountdownSpec) -> ProblemRows[CountdownProblem]:
    """The task's row layout under `spec` (whose `answer_tags` words the question); the known solution is
    kept in `extra_info`."""
    return ProblemRows(
        DATA_SOURCE,
        "math",
        question=lambda p: p.question(spec.answer_tags),
        answer=lambda p: p.ground_truth,
        extra=lambda p: {"solution": p.solution},
    )


def rl_rows(problems: Iterable[CountdownProblem], spec: CountdownSpec, split: str) -> list[dict[str, Any]]:
    """Rows of the RL prompt set in verl's layout (the known solution is kept in `extra_info`)."""
    return _rows(spec).rl_rows(problems, split)


def sft_rows(problems: Iterable[CountdownProblem], spec: CountdownSpec) -> list[dict[str, Any]]:
    """Rows of the chat set: `messages` (question, worked solution), `ground_truth`, `data_source`."""

    def messages(p: CountdownProblem, _weak: bool) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": p.question(spec.answer_tags)},
            {"role": "assistant", "content": _answer(p, spec)},
        ]

    return _rows(spec).sft_rows(problems, messages)


def write_rl_set(
    folder: str | Path, spec: CountdownSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `rl_train.parquet` and `rl_val.parquet` (verl layout; no validation problem is in training)."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(folder, RL_FILES, rl_rows(train, spec, "train"), rl_rows(val, spec, "val"))


def write_sft_set(
    folder: str | Path, spec: CountdownSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """Write `train.parquet` and `val.parquet` of the chat set of worked solutions into `folder`."""
    train, val = held_out_split(spec, train_size, val_size, seed)
    return write_splits(folder, CHAT_FILES, sft_rows(train, spec), sft_rows(val, spec))
