"""GSM8K: strict (`####`) and flexible (last number) extraction, and the score."""

from __future__ import annotations

import pytest

from quartet.rewards.rules import select_scorer
from quartet.rewards.rules.gsm8k import compute_score, extract_solution

STRICT = [
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("#### $5", "5"),
    ("####-3", "-3"),
    ("first #### 1 then #### 2", "2"),
    ("#### 18.", "18"),
    ("#### 0.25", "0.25"),
    ("The answer is 72.", None),
    ("####", None),
]

FLEXIBLE = [
    ("The answer is 42.", "42"),
    ("3 apples and 1,000 pears", "1000"),
    ("costs $1,234.50 in total", "1234.50"),
    ("it drops to -7 degrees", "-7"),
    ("#### 9 and then 10", "10"),
    ("no digits here.", None),
]


@pytest.mark.parametrize(("text", "expected"), STRICT)
def test_strict_takes_the_number_after_the_last_marker(text: str, expected: str | None) -> None:
    assert extract_solution(text, "strict") == expected


@pytest.mark.parametrize(("text", "expected"), FLEXIBLE)
def test_flexible_takes_the_last_number(text: str, expected: str | None) -> None:
    assert extract_solution(text, "flexible") == expected


def test_unknown_method_is_an_error() -> None:
    with pytest.raises(ValueError, match="strict"):
        extract_solution("#### 1", "loose")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so #### 72", "72", 1.0),
        ("so #### 71", "72", 0.0),
        ("the answer is 72", "72", 0.0),  # strict: no marker, no answer
        ("#### 1,000", "1000", 1.0),
        ("#### 18.00", "18", 1.0),  # same decimal value
        ("#### 72", "She sold 48/2 = 24 clips in May.\n#### 72", 1.0),  # whole reference solution
        ("#### 72", 72, 1.0),  # integer ground truth
    ],
)
def test_strict_score(response: str, truth: object, expected: float) -> None:
    assert compute_score("openai/gsm8k", response, truth) == expected


def test_flexible_score_and_format_score() -> None:
    assert compute_score("gsm8k", "the answer is 72", "72", method="flexible") == 1.0
    assert compute_score("gsm8k", "#### 71", "72", format_score=0.1) == 0.1
    assert compute_score("gsm8k", "no answer", "72", format_score=0.1) == 0.0


def test_registry_routes_both_names_to_strict_gsm8k() -> None:
    for source in ("openai/gsm8k", "gsm8k"):
        scorer = select_scorer(source)
        assert scorer(source, "#### 5", "5", None) == 1.0
        assert scorer(source, "5", "5", None) == 0.0
