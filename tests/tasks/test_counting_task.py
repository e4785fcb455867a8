"""The counting task (long responses): its partial-credit score on hand-worked cases, its draws, and the
token length of its answers under the tiny tokenizer (the reason the task exists)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quartet.config.data import BuiltinTask
from quartet.rewards.rules.registry import known_data_sources
from quartet.tasks import TASKS, task_scorer
from quartet.tasks.counting import CountingProblem, CountingSpec, compute_score, expected_run, verify_answer


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("3 4 5 6", "3..6", 1.0),
        ("3, 4, 5, 6.", "3..6", 1.0),  # separators are free
        ("3 4", "3..6", 0.5),  # cut off halfway: 2 of 4
        ("3 4 9 6", "3..6", 0.5),  # a slip at the third integer: the prefix counts, nothing after it
        ("3 4 5 6 7 8 9 10", "3..6", 0.5),  # the whole run, then 4 more: 4 of 8 written
        ("4 5 6", "3..6", 0.0),  # a wrong start earns nothing
        ("", "3..6", 0.0),
        ("no numbers here", "1..1", 0.0),
        ("7", "7..7", 1.0),
        ("-2 -1 0 1", "-2..1", 1.0),
    ],
)
def test_partial_credit_by_hand(response: str, truth: str, score: float) -> None:
    assert compute_score(response, truth) == pytest.approx(score)
    assert verify_answer(response, truth) == (score == 1.0)


def test_bad_ground_truth_names_the_form() -> None:
    with pytest.raises(ValueError, match="start..end"):
        expected_run("3-6")


def test_the_rule_scorer_finds_the_task() -> None:
    assert "counting" in known_data_sources() and task_scorer("counting") is compute_score


def test_spec_draws_within_its_bounds_and_refuses_bad_counts() -> None:
    spec = CountingSpec(max_start=20, min_count=5, max_count=9)
    rng = random.Random(0)
    for _ in range(200):
        p = spec.draw(rng)
        assert 1 <= p.start <= 20 and 5 <= p.end - p.start + 1 <= 9
    with pytest.raises(ValueError, match="min_count"):
        CountingSpec(min_count=10, max_count=5)
    problem = CountingProblem(98, 101)
    assert problem.reply == "98 99 100 101" and problem.answer == "98..101"
    assert compute_score(problem.reply, problem.answer) == 1.0


def test_default_answers_are_thousands_of_tokens(chat_tokenizer: object, tmp_path: Path) -> None:
    """The default runs (250-500 integers) are 1,000-2,000+ response tokens with the one-token-per-digit
    tiny tokenizer: long enough for the long-context example's max_response_length of 2048 to matter."""
    entry = TASKS[BuiltinTask.COUNTING]
    shortest = CountingProblem(1, 250)  # the fewest digits a default run can have
    longest = CountingProblem(999, 999 + 499)
    encode = chat_tokenizer.encode  # type: ignore[attr-defined]
    assert len(encode(shortest.reply)) > 600
    assert len(encode(longest.reply)) > 2000
    assert entry.default_spec == CountingSpec()
