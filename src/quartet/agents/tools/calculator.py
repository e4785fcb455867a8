"""A safe arithmetic calculator tool: Python's `ast` walked by hand, never `eval`.

Accepted: numbers (integers, decimals such as `2.5` or `1e3`), `+ - * / // % **`, unary `-` and `+`,
parentheses. Nothing else is evaluated: a name, call, attribute, subscript, comparison, string or any other
node is refused with a message saying what is allowed. (The `ast` module parses; no code is compiled or run.)

Exact arithmetic. Every literal becomes an exact rational (`2.5` is 5/2, `0.1` is 1/10), integers stay
Python ints, and `/` gives an exact `fractions.Fraction` (an int when it divides evenly), so
`1/3 + 1/3 + 1/3` is `1`. `//` and `%` follow Python's floor semantics on rationals. `**` with an integer
exponent is exact (`2 ** -2` is 1/4); a non-integer exponent (`2 ** 0.5`) gives a float, and a negative
base with one is refused (no complex numbers). Results print as `7`, `7/3 (≈ 2.33333333333)`, or a float.

Limits against abuse, each refused with a clear message: expression length (`max_chars`), size of any
number in the computation (`max_digits` for an integer, numerator or denominator; checked after each
operation, and before a power by estimating its size, so `9 ** 9 ** 9` is refused without being computed),
and the integer exponent's size (`max_exponent`).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from quartet.agents.tools.base import Tool, ToolResult

__all__ = ["CalculatorError", "CalculatorTool", "CalcLimits", "evaluate", "format_number"]

Number = int | Fraction | float

_ALLOWED = "only numbers, + - * / // % **, unary minus and parentheses are allowed"
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_REFUSED_NODES: dict[type[ast.AST], str] = {
    ast.Name: "names are not allowed",
    ast.Call: "function calls are not allowed",
    ast.Attribute: "attribute access is not allowed",
    ast.Subscript: "indexing is not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.BoolOp: "and/or are not allowed",
}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is meant for the model."""


@dataclass(frozen=True)
class CalcLimits:
    """How big an expression and its numbers may get."""

    max_chars: int = 200
    """Longest expression accepted, in characters."""
    max_digits: int = 100
    """Most decimal digits of any integer, numerator or denominator in the computation (at most 4000)."""
    max_exponent: int = 10_000
    """Largest |exponent| of an exact power (bases 0, 1 and -1 excepted)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_digits <= 4000:  # Python refuses to print ints past 4300 digits
            raise ValueError(f"max_digits must be in [1, 4000], got {self.max_digits}")
        if self.max_chars < 1 or self.max_exponent < 1:
            raise ValueError("max_chars and max_exponent must be positive")


def _digits(value: int) -> int:
    return len(str(abs(value)))


def _checked(value: Number, limits: CalcLimits) -> Number:
    """`value` normalized (a whole Fraction becomes an int) once within the limits."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result too large (float overflow)")
        return value
    if isinstance(value, Fraction) and value.denominator == 1:
        value = value.numerator
    parts = (value,) if isinstance(value, int) else (value.numerator, value.denominator)
    digits = max(_digits(p) for p in parts)
    if digits > limits.max_digits:
        raise CalculatorError(f"a number has {digits} digits, more than the limit of {limits.max_digits}")
    return value


def _literal(node: ast.Constant, source: str, limits: CalcLimits) -> Number:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "imaginary numbers are" if isinstance(value, complex) else f"{type(value).__name__} values are"
        raise CalculatorError(f"{kind} not allowed; {_ALLOWED}")
    if isinstance(value, int):
        return _checked(value, limits)
    text = (ast.get_source_segment(source, node) or repr(value)).replace("_", "")
    try:  # Decimal keeps a huge exponent symbolic, so `1e999999999` is refused before being expanded
        exact = Decimal(text)
    except InvalidOperation:
        raise CalculatorError(f"cannot read the number {text!r}") from None
    sign, digits, exponent = exact.as_tuple()
    assert isinstance(exponent, int)  # a literal is finite
    size = len(digits) + exponent if exponent >= 0 else max(len(digits), 1 - exponent)
    if size > limits.max_digits:
        raise CalculatorError(
            f"the number {text!r} is too large or too precise (limit {limits.max_digits} digits)"
        )
    return _checked(Fraction(exact), limits)


def _power(base: Number, exponent: Number, limits: CalcLimits) -> Number:
    if isinstance(exponent, int) and not isinstance(base, float):
        if base in (0, 1, -1):
            return _checked(Fraction(base) ** exponent, limits)  # 0 ** -1 raises ZeroDivisionError
        if abs(exponent) > limits.max_exponent:
            raise CalculatorError(f"exponent {exponent} is too large (limit {limits.max_exponent})")
        size = max(abs(base.numerator), base.denominator)
        estimate = abs(exponent) * math.log10(size)
        if estimate > limits.max_digits + 1:
            raise CalculatorError(
                f"the power would have about {estimate:.0f} digits (limit {limits.max_digits})"
            )
        return _checked(Fraction(base) ** exponent, limits)
    if base < 0 and not isinstance(exponent, int):
        raise CalculatorError("a negative number to a non-integer power is not a real number")
    try:  # a float base, or a non-integer exponent: float arithmetic
        return _checked(float(base) ** (exponent if isinstance(exponent, int) else float(exponent)), limits)
    except OverflowError:
        raise CalculatorError("result too large (float overflow)") from None


def _eval(node: ast.AST, source: str, limits: CalcLimits) -> Number:
    if isinstance(node, ast.Constant):
        return _literal(node, source, limits)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, source, limits)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.BitXor):
            raise CalculatorError("'^' is not supported; write powers with **")
        if not isinstance(node.op, ast.Pow) and type(node.op) not in _BINARY:
            raise CalculatorError(f"operator {type(node.op).__name__} is not supported; {_ALLOWED}")
        left = _eval(node.left, source, limits)
        right = _eval(node.right, source, limits)
        if isinstance(node.op, ast.Pow):
            return _power(left, right, limits)
        if isinstance(node.op, ast.Div) and not isinstance(left, float):
            left = Fraction(left)  # exact division; with a float operand Python's float division
        try:
            return _checked(_BINARY[type(node.op)](left, right), limits)
        except OverflowError:
            raise CalculatorError("result too large (float overflow)") from None
    for kind, problem in _REFUSED_NODES.items():
        if isinstance(node, kind):
            shown = ast.get_source_segment(source, node) or ""
            raise CalculatorError(f"{problem} ({shown[:40]!r}); {_ALLOWED}")
    raise CalculatorError(f"{type(node).__name__} is not allowed; {_ALLOWED}")


def evaluate(expression: str, limits: CalcLimits | None = None) -> Number:
    """The exact value of an arithmetic expression (module docstring); `CalculatorError` when refused."""
    limits = limits or CalcLimits()
    text = expression.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > limits.max_chars:
        raise CalculatorError(f"expression too long: {len(text)} characters (limit {limits.max_chars})")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not a valid expression: {exc.msg}") from None
    except (MemoryError, RecursionError, ValueError):
        raise CalculatorError("expression too deeply nested or not parseable") from None
    try:
        return _eval(tree.body, text, limits)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except RecursionError:
        raise CalculatorError("expression too deeply nested") from None


def format_number(value: Number) -> str:
    """`7`, `7/3 (≈ 2.33333333333)` or a float's repr."""
    if isinstance(value, Fraction):
        try:
            return f"{value} (≈ {float(value):.12g})"
        except OverflowError:
            return str(value)
    return repr(value) if isinstance(value, float) else str(value)


class CalculatorTool(Tool):
    """`calculator(expression)`: exact arithmetic on numbers (see the module docstring)."""

    schema = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": (
                "Evaluate an arithmetic expression exactly. Supports numbers, + - * / // % ** and "
                "parentheses; / gives an exact fraction."
            ),
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (17 * 23) / 4"}},
                "required": ["expression"],
            },
        },
    }

    def __init__(
        self,
        *,
        max_chars: int = 200,
        max_digits: int = 100,
        max_exponent: int = 10_000,
        call_reward: float = 0.0,
        schema: dict[str, Any] | None = None,
    ) -> None:
        """`call_reward`: the turn reward of a call that evaluates (turn-level credit,
        algorithm.turn_reward_coef); a failed call earns 0."""
        super().__init__(schema=schema)
        self.limits = CalcLimits(max_chars=max_chars, max_digits=max_digits, max_exponent=max_exponent)
        self.call_reward = float(call_reward)

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        expression = str(arguments.get("expression", ""))
        try:
            value = evaluate(expression, self.limits)
        except CalculatorError as exc:
            return ToolResult(text=f"Error: {exc}", error=str(exc))
        return ToolResult(text=format_number(value), reward=self.call_reward or None)
