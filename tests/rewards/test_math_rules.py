"""Math answers: boxed extraction, the normalisation table, and the data-source registry."""

from __future__ import annotations

import pytest

from quartet.rewards.rules import (
    UnknownDataSourceError,
    default_compute_score,
    known_data_sources,
    select_scorer,
)
from quartet.rewards.rules.math_answers import (
    answers_equal,
    compute_score,
    extract_answer_line,
    extract_boxed,
    normalize_answer,
)

BOXED = [
    (r"so \boxed{5}.", "5"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"first \boxed{1}, finally \boxed{2}", "2"),
    (r"\fbox{7}", "7"),
    (r"\boxed{1} then \fbox{3}", "3"),
    (r"$\boxed 5$", "5"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (r"\boxed { 12 }", "12"),
    (r"\boxed{2} and then \boxed{\frac{3}{4}", None),  # the last box never closes: truncated
    ("no box", None),
]

EQUIVALENT = [
    ("0.5", r"\frac{1}{2}"),
    ("1/2", r"\frac{1}{2}"),
    (r"\frac12", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", "0.5"),
    (r"\tfrac34", "0.75"),
    (r"\frac 1 2", ".5"),
    (r"-\frac{1}{2}", "-0.5"),
    (r"\frac{-1}{2}", "-1/2"),
    ("x = 5", "5"),
    (r"\theta=30", "30"),
    (r"5\text{ cm}", "5"),
    (r"12\mbox{ square units}", "12"),
    ("12 square units", "12"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    (r"50\%", "50"),
    (r"\$18.90", "18.9"),
    ("1,000", "1000"),
    ("1{,}000", "1000"),
    (r"\left(1,2\right)", "(1,2)"),
    ("(1, 2)", "(1,2)"),
    (r"(\frac12, 0.5)", "(0.5,1/2)"),
    (r"\sqrt2", r"\sqrt{2}"),
    (r"\frac{\sqrt3}{2}", r"\frac{\sqrt{3}}{2}"),
    (r"\text{(C)}", "(C)"),
    ("5.", "5"),
    (" 2 ", "2"),
    ("2.50", "2.5"),
    (r"\!\!3", "3"),
    (r"\infty", r"\infty"),
]

NOT_EQUIVALENT = [
    ("0.33", r"\frac{1}{3}"),
    ("(1,2]", "(1,2)"),
    ("(1,2)", "(2,1)"),
    ("2m", "2"),  # a single letter may be a variable, not a unit
    (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2"),  # no symbolic algebra (documented)
    ("x+1", "x-1"),
    ("5", "-5"),
    ("1,2", "12"),
    ("", ""),
    ("3", ""),
]


@pytest.mark.parametrize(("text", "expected"), BOXED)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(("a", "b"), EQUIVALENT)
def test_equivalent_answers(a: str, b: str) -> None:
    assert answers_equal(a, b), (normalize_answer(a), normalize_answer(b))
    assert answers_equal(b, a)


@pytest.mark.parametrize(("a", "b"), NOT_EQUIVALENT)
def test_different_answers(a: str, b: str) -> None:
    assert not answers_equal(a, b), (normalize_answer(a), normalize_answer(b))


def test_normalisation_keeps_commands_that_only_start_like_left_right() -> None:
    assert normalize_answer(r"A \rightarrow B") == r"A\rightarrowB"
    assert normalize_answer(r"\left[ 0, 1 \right)") == "[0,1)"


def test_compute_score() -> None:
    assert compute_score("math", r"Thus the answer is $\boxed{\dfrac{1}{2}}$.", "0.5") == 1.0
    assert compute_score("math", r"\boxed{3}", "4") == 0.0
    assert compute_score("math", "the answer is 4", "4") == 0.0  # no box, no answer
    assert compute_score("math", r"\boxed{4}", ["four", "4"]) == 1.0  # any of several references
    assert compute_score("math", r"\boxed{4}", r"... so the total is $\boxed{4}$.") == 1.0  # a solution
    assert compute_score("math", "Answer: 4", "4") == 0.0
    assert compute_score("math_dapo", "Answer: 4", "4", answer_line=True) == 1.0


def test_answer_line() -> None:
    assert extract_answer_line("work\nAnswer: $42$.") == "42"
    assert extract_answer_line("**Answer:** 7") == "7"
    assert extract_answer_line("answer: 1\nAnswer: 2") == "2"
    assert extract_answer_line("nothing") is None


@pytest.mark.parametrize(
    "source",
    ["lighteval/MATH", "math", "DigitalLearningGmbH/MATH-lighteval", "math_dapo", "aime2024", "aime_25"],
)
def test_registry_routes_math_sources(source: str) -> None:
    assert select_scorer(source)(source, r"\boxed{\frac12}", "0.5", None) == 1.0


def test_dapo_and_aime_also_read_the_answer_line_but_math_does_not() -> None:
    assert default_compute_score("math_dapo", "Answer: 12", "12") == 1.0
    assert default_compute_score("aime2025", "Answer: 12", "12") == 1.0
    assert default_compute_score("lighteval/MATH", "Answer: 12", "12") == 0.0


def test_builtin_task_is_scored_by_its_verifier() -> None:
    assert default_compute_score("arithmetic", "3+4=7", "7") == 1.0
    assert default_compute_score("arithmetic", "8", "7") == 0.0


def test_countdown_task_is_found_through_the_task_registry() -> None:
    tasks = pytest.importorskip("quartet.tasks")
    if not hasattr(tasks, "task_scorer") or tasks.task_scorer("countdown") is None:
        pytest.skip("the countdown task is not registered")
    truth = '{"target": 10, "numbers": [2, 3, 4]}'
    assert default_compute_score("countdown", "<answer>2*3+4</answer>", truth) == 1.0
    assert default_compute_score("countdown", "<answer>2+3+4</answer>", truth) == 0.0
    assert "countdown" in known_data_sources()


def test_unknown_data_source_names_itself_the_known_ones_and_the_fix() -> None:
    with pytest.raises(UnknownDataSourceError) as info:
        select_scorer("my/dataset")
    message = str(info.value)
    assert "'my/dataset'" in message
    assert "reward.function" in message
    for known in ("openai/gsm8k", "lighteval/MATH", "aime*", "arithmetic"):
        assert known in message
    assert set(known_data_sources()) >= {"gsm8k", "math", "math_dapo"}
