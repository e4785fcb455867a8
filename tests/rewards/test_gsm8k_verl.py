"""The GSM8K rule in verl's mode against a character-by-character reference of verl's documented rule.

verl 0.9.1 (`verl/utils/reward_score/gsm8k.py`, as documented): read the last 300 characters; strict takes
the last "#### " followed by a run of [-]?[0-9.,]+ (commas removed); flexible takes the last run of that
alphabet that is not "." alone; the verdict is string equality with the ground truth. The reference below
scans characters instead of using a regex, so it is an independent computation of the same rule.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.config import load_config
from quartet.config.reward import RuleMode
from quartet.rewards.rules import select_scorer
from quartet.rewards.rules.gsm8k import compute_score, compute_score_verl, extract_solution_verl
from quartet.rewards.rules.registry import RULE_FUNCTIONS, default_compute_score, lenient_compute_score

ALPHABET = set("0123456789.,")


def _runs(text: str) -> list[str]:
    """Maximal runs of an optional '-' then [0-9.,]+, left to right, non-overlapping (as re.findall)."""
    out, i = [], 0
    while i < len(text):
        start = i
        if text[i] == "-" and i + 1 < len(text) and text[i + 1] in ALPHABET:
            i += 1
        if text[i] in ALPHABET:
            while i < len(text) and text[i] in ALPHABET:
                i += 1
            out.append(text[start:i])
        else:
            i = start + 1
    return out


def reference_extract(response: str, method: str) -> str | None:
    tail = response[-300:] if len(response) > 300 else response
    if method == "strict":
        found = None
        for k in range(len(tail) - 4):
            if tail[k : k + 5] == "#### ":
                runs = _runs(tail[k + 5 :])
                rest = tail[k + 5 :]
                if runs and rest.startswith(runs[0]):  # the run must start right after the space
                    found = runs[0].replace(",", "")
        return found
    runs = _runs(tail)
    if not runs:
        return None
    good = [r for r in runs if r not in ("", ".")]
    return good[-1] if good else runs[0]


def reference_score(response: str, truth: str, method: str = "strict") -> float:
    answer = reference_extract(response, method)
    return 0.0 if answer is None else (1.0 if answer == truth else 0.0)


@pytest.mark.parametrize(
    ("response", "truth", "verl", "lenient"),
    [
        ("so #### 42", "42", 1.0, 1.0),
        ("so ####42", "42", 0.0, 1.0),  # verl's regex needs exactly one space
        ("so ####  42", "42", 0.0, 1.0),
        ("so ####\n42", "42", 0.0, 1.0),
        ("#### 1,000", "1000", 1.0, 1.0),
        ("#### 18.0", "18", 0.0, 1.0),  # verl compares strings
        ("#### 42" + " filler" * 60, "42", 0.0, 1.0),  # the marker is before the last 300 characters
        ("#### 7 then #### 42", "42", 1.0, 1.0),  # the last marker
        ("#### $42", "42", 0.0, 1.0),
    ],
)
def test_issue_cases_verl_vs_lenient(response: str, truth: str, verl: float, lenient: float) -> None:
    assert compute_score_verl("openai/gsm8k", response, truth) == verl == reference_score(response, truth)
    assert compute_score("openai/gsm8k", response, truth) == lenient
    assert default_compute_score("openai/gsm8k", response, truth) == verl
    assert lenient_compute_score("openai/gsm8k", response, truth) == lenient


_PIECES = st.sampled_from(
    ["#### ", "####", "#", " ", "\n", "-", ".", ",", "$", "1", "42", "7", "x", "abc", "0"]
)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(_PIECES, max_size=40),
    pad=st.integers(0, 320),
    at_end=st.booleans(),
    method=st.sampled_from(["strict", "flexible"]),
)
def test_extraction_matches_reference(pieces: list[str], pad: int, at_end: bool, method: str) -> None:
    body = "".join(pieces)
    response = body + "y" * pad if not at_end else "y" * pad + body
    assert extract_solution_verl(response, method) == reference_extract(response, method)  # type: ignore[arg-type]
    for truth in ("42", "7", "1000"):
        expected = reference_score(response, truth, method)
        assert compute_score_verl("openai/gsm8k", response, truth, method=method) == expected  # type: ignore[arg-type]


def test_flexible_keeps_commas_and_skips_lone_dots() -> None:
    assert extract_solution_verl("total 1,000 .", "flexible") == "1,000"
    assert extract_solution_verl("no digits . at all .", "flexible") == "."
    assert extract_solution_verl("nothing", "flexible") is None


def test_mode_selects_the_rule_and_config_default_is_verl() -> None:
    assert select_scorer("openai/gsm8k") is compute_score_verl
    assert select_scorer("openai/gsm8k", "lenient") is compute_score
    with pytest.raises(ValueError, match="rule mode"):
        select_scorer("openai/gsm8k", "loose")
    cfg = load_config()
    assert cfg.reward.rule_mode is RuleMode.VERL
    assert RULE_FUNCTIONS[str(cfg.reward.rule_mode)].endswith(":default_compute_score")
    lenient = load_config(overrides=["reward.rule_mode=lenient"])
    assert RULE_FUNCTIONS[str(lenient.reward.rule_mode)].endswith(":lenient_compute_score")
    assert {str(m) for m in RuleMode} == set(RULE_FUNCTIONS)
