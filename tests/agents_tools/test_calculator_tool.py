"""The calculator against Python's own arithmetic, and its refusals."""

from __future__ import annotations

import asyncio
import math
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.agents.tools.calculator import (
    CalcLimits,
    CalculatorError,
    CalculatorTool,
    evaluate,
    format_number,
)

Pair = tuple[str, str]  # (expression for the calculator, the same with every integer as Fraction(n))

WIDE = CalcLimits(max_chars=10_000, max_digits=4000, max_exponent=10_000)


def _leaf(n: int) -> Pair:
    return (f"({n})" if n < 0 else str(n), f"Fraction({n})")


def _binary(t: tuple[Pair, str, Pair]) -> Pair:
    (a, fa), op, (b, fb) = t
    # Fraction // Fraction is a Python int, and int ** -1 a float; the calculator stays exact
    python = f"Fraction({fa} // {fb})" if op == "//" else f"({fa} {op} {fb})"
    return f"({a} {op} {b})", python


def _power(t: tuple[Pair, int]) -> Pair:
    (a, fa), e = t
    return f"({a}) ** ({e})", f"({fa}) ** ({e})"


def _extend(children: st.SearchStrategy[Pair]) -> st.SearchStrategy[Pair]:
    ops = st.sampled_from(["+", "-", "*", "/", "//", "%"])
    return (
        st.tuples(children, ops, children).map(_binary)
        | st.tuples(children, st.integers(-3, 4)).map(_power)
        | children.map(lambda c: (f"-{c[0]}", f"-{c[1]}"))
    )


rational_expressions = st.recursive(st.integers(-60, 60).map(_leaf), _extend, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(rational_expressions)
def test_matches_python_fraction_arithmetic(pair: Pair) -> None:
    ours, python = pair
    try:
        expected = eval(python, {"Fraction": Fraction})  # Python's own rational arithmetic
    except ZeroDivisionError:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(ours, WIDE)
        return
    value = evaluate(ours, WIDE)
    assert value == expected
    assert isinstance(value, int) == (expected.denominator == 1), "whole results come back as ints"


def _int_extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    ops = st.sampled_from(["+", "-", "*", "//", "%"])
    return (
        st.tuples(children, ops, children).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
        | st.tuples(children, st.integers(0, 5)).map(lambda t: f"({t[0]}) ** {t[1]}")
        | children.map(lambda c: f"-{c}")
    )


int_expressions = st.recursive(
    st.integers(-(10**6), 10**6).map(lambda n: f"({n})" if n < 0 else str(n)), _int_extend, max_leaves=10
)


@settings(max_examples=300, deadline=None)
@given(int_expressions)
def test_integer_expressions_match_python_ints_exactly(expression: str) -> None:
    try:
        expected = eval(expression)  # plain Python ints: no Fraction anywhere
    except ZeroDivisionError:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(expression, WIDE)
        return
    if len(str(abs(expected))) > WIDE.max_digits:
        with pytest.raises(CalculatorError, match="digits"):
            evaluate(expression, WIDE)
        return
    value = evaluate(expression, WIDE)
    assert type(value) is int and value == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1/3 + 1/3 + 1/3", 1),
        ("7/3", Fraction(7, 3)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("1e3 + 2.5", Fraction(2005, 2)),
        ("2 ** -2", Fraction(1, 4)),
        ("-2 ** 2", -4),
        ("(-2) ** 3", -8),
        ("7 // -2", -4),
        ("-7 % 3", 2),
        ("1_000 * 3", 3000),
    ],
)
def test_exact_results(expression: str, expected: int | Fraction) -> None:
    value = evaluate(expression)
    assert value == expected and type(value) is type(expected)


def test_non_integer_powers_are_floats() -> None:
    assert evaluate("2 ** 0.5") == math.sqrt(2)
    assert evaluate("(2 ** 0.5) ** 2") == math.sqrt(2) ** 2
    assert format_number(Fraction(7, 3)) == "7/3 (≈ 2.33333333333)"
    assert format_number(10**20) == "100000000000000000000"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("x + 1", "names are not allowed"),
        ("abs(-3)", "function calls are not allowed"),
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("(1)[0]", "indexing is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 < 2", "comparisons are not allowed"),
        ("'a' * 3", "str values are not allowed"),
        ("2j", "imaginary numbers are not allowed"),
        ("2 ^ 3", "write powers with \\*\\*"),
        ("1 << 3", "LShift is not supported"),
        ("9 ** 9 ** 9", "exponent 387420489 is too large"),
        ("2 ** 100000", "exponent 100000 is too large"),
        ("7 ** 500", "about 423 digits"),
        ("10 ** 60 * 10 ** 60", "121 digits"),
        ("1e999999999", "too large or too precise"),
        ("1" * 120, "120 digits"),
        ("1 / 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** (1/3)", "not a real number"),
        ("(2 ** 0.5) ** 100000", "float overflow"),
        ("1 +", "not a valid expression"),
        ("", "empty expression"),
        ("1+" * 150 + "1", "expression too long: 301 characters"),
    ],
)
def test_refusals_say_why(expression: str, message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(CalculatorError, match=message):
        evaluate(expression)
    # computing any of the huge values first would take minutes to hours: a generous bound still tells
    assert time.perf_counter() - start < 30, "a refusal must not compute the huge value first"


def test_tool_answers_with_value_or_error() -> None:
    tool = CalculatorTool(max_digits=50)
    assert tool.name == "calculator"
    ok = asyncio.run(tool.execute("t", {"expression": "17 * 23"}))
    assert (ok.text, ok.error) == ("391", None)
    refused = asyncio.run(tool.execute("t", {"expression": "10 ** 49 * 100"}))
    assert refused.error is not None and "limit of 50" in refused.error
    assert refused.text == f"Error: {refused.error}"
    with pytest.raises(ValueError, match="max_digits"):
        CalculatorTool(max_digits=10_000)
