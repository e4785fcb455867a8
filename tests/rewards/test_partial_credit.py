"""The partial-credit reward option against hand-worked cases, and its pass-through for other sources."""

from __future__ import annotations

import pytest

from quartet.rewards.partial_credit import PARTIAL, digit_partial_credit, digit_share


@pytest.mark.parametrize(
    ("answer", "truth", "share"),
    [
        ("442027", "442027", 1.0),
        ("442028", "442027", 5 / 6),
        ("44202", "442027", 5 / 6),  # a digit missing: its position counts as wrong
        ("4420277", "442027", 6 / 7),
        ("542027", "442027", 5 / 6),
        ("-42", "42", 0.0),
        ("-42", "-41", 0.5),
        ("4.2", "42", 0.0),
        ("", "42", 0.0),
        ("The answer is 42", "42", 0.0),
    ],
)
def test_digit_share(answer: str, truth: str, share: float) -> None:
    assert digit_share(answer, truth) == pytest.approx(share)


def test_exact_answers_score_one_others_partial_and_other_sources_keep_their_rule() -> None:
    info = {"final_message": "442027"}
    assert digit_partial_credit("calculator", "", "442027", info) == 1.0
    assert digit_partial_credit("calculator", "", "442027", {"final_message": "442127"}) == pytest.approx(
        PARTIAL * 5 / 6
    )
    assert digit_partial_credit("word_problems", "", "91", {"final_message": "19"}) == 0.0
    assert digit_partial_credit("word_problems", "", "91", {"final_message": "<tool_call>"}) == 0.0
    # arithmetic keeps its exact rule: a near miss earns nothing
    assert digit_partial_credit("arithmetic", "57", "57") == 1.0
    assert digit_partial_credit("arithmetic", "58", "57") == 0.0
