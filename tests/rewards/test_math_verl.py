"""verl's MATH rule (`math_verl`): hand-checked verdicts from the rule as verl documents it."""

from __future__ import annotations

import pytest

from quartet.rewards.rules import select_scorer
from quartet.rewards.rules.math_answers import compute_score as lenient
from quartet.rewards.rules.math_verl import compute_score, last_boxed, normalize


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        (r"so \boxed{\dfrac12}", r"\frac{1}{2}", 1.0),  # dfrac -> frac, \frac12 -> \frac{1}{2}
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),  # the one decimal verl rewrites
        (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),  # integer a/b -> \frac{a}{b}
        (r"\boxed{2/4}", r"\frac{1}{2}", 0.0),  # no arithmetic
        (r"\boxed{0.50}", r"\frac{1}{2}", 0.0),  # only "0.5" exactly
        (r"\boxed{x = 5}", "5", 1.0),  # a short `x =` prefix goes
        (r"\boxed{10\text{ cm}}", "10", 1.0),  # a `\text{ ` unit is cut off
        (r"\boxed{10 cm}", "10", 0.0),  # a bare unit word is not
        (r"\boxed{90^\circ}", "90", 1.0),
        (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),
        (r"\boxed{\sqrt2}", r"\sqrt{2}", 1.0),
        (r"\boxed{5} then \boxed{6}", "6", 1.0),  # the last box
        (r"\boxed{5} then \boxed{6", "5", 0.0),  # the last box never closes: no answer
        (r"\fbox{7}", "7", 0.0),  # found, but verl cannot unwrap an \fbox: 0
        (r"the answer is $\boxed 7$.", "7", 1.0),  # `\boxed ` with a space: up to the next `$`
        ("no box: 7", "7", 0.0),
        (r"\boxed{.5}", "0.5", 1.0),  # a leading "." gets its 0 (then both become \frac{1}{2})
    ],
)
def test_verdicts(response: str, truth: str, expected: float) -> None:
    assert compute_score("lighteval/MATH", response, truth) == expected


def test_failing_normalisation_falls_back_to_raw_equality() -> None:
    two_units = r"1\text{ m}\text{ s}"
    with pytest.raises(ValueError):
        normalize(two_units)
    assert compute_score("lighteval/MATH", rf"\boxed{{{two_units}}}", two_units) == 1.0
    assert compute_score("lighteval/MATH", rf"\boxed{{{two_units}}}", "1") == 0.0


def test_extraction_and_mode_routing() -> None:
    assert last_boxed(r"a \boxed{\frac{1}{2}} b") == r"\frac{1}{2}"
    assert last_boxed("nothing") is None
    response, truth = r"\boxed{2/4}", r"\frac{1}{2}"
    assert lenient("lighteval/MATH", response, truth) == 1.0  # the lenient rule compares rationals
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert select_scorer(source)(source, response, truth, None) == 0.0
        assert select_scorer(source, "lenient")(source, response, truth, None) == 1.0
    assert select_scorer("math") is select_scorer("math", "lenient")  # verl scores `math` with its DAPO rule
