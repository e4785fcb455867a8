"""The GSM8K rule in verl's mode against verl's own answers and a character-by-character reference.

verl 0.9.1 (`verl/utils/reward_score/gsm8k.py`): read the last 300 characters; strict takes the last
"#### " followed by a run of [-]?[0-9.,]+ (commas removed); flexible takes the last run of that alphabet
that is not "." alone; the verdict is string equality with the ground truth. Two checks:
- the cases of gsm8k_verl_cases.py against `gsm8k_verl_recorded.json`, what verl's file itself answered
  (tools/record_verl_gsm8k.py ran it), and against the reference below;
- random responses against the reference, which scans characters instead of using a regex, so it is an
  independent computation of the same rule.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

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


def reference_score(response: str, truth: str, method: str = "strict", format_score: float = 0.0) -> float:
    answer = reference_extract(response, method)
    return 0.0 if answer is None else (1.0 if answer == truth else format_score)


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gsm8k_verl_cases import CASES  # noqa: E402  # this folder, on the path above

RECORDER = HERE.parent.parent / "tools" / "record_verl_gsm8k.py"
RECORD = json.loads((HERE / "gsm8k_verl_recorded.json").read_text())
DEPARTURES = {"truth_int"}
"""Cases where quartet answers otherwise than verl on purpose, each named in docs/from_verl.md."""


def test_record_is_verls_answers_on_these_cases() -> None:
    # the record must be of these cases: a changed or added case without a re-record fails here
    spec = importlib.util.spec_from_file_location("record_verl_gsm8k", RECORDER)
    assert spec is not None and spec.loader is not None
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)
    assert RECORD["verl_version"] == "0.9.1"
    assert len(CASES) >= 42
    assert len({case_id for case_id, _, _ in CASES}) == len(CASES)
    assert set(RECORD["cases"]) == {case_id for case_id, _, _ in CASES}
    for case_id, response, truth in CASES:
        assert RECORD["cases"][case_id]["hash"] == recorder.case_hash(response, truth), case_id


@pytest.mark.parametrize(("case_id", "response", "truth"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_verl_mode_equals_verl(case_id: str, response: str, truth: Any, method: str) -> None:
    verl = RECORD["cases"][case_id][method]
    fmt = RECORD["format_score"]
    ours = extract_solution_verl(response, method)  # type: ignore[arg-type]
    assert ours == verl["answer"] == reference_extract(response, method)
    got = compute_score_verl("openai/gsm8k", response, truth, method=method)  # type: ignore[arg-type]
    got_fmt = compute_score_verl("openai/gsm8k", response, truth, method=method, format_score=fmt)  # type: ignore[arg-type]
    if case_id in DEPARTURES:
        # a non-string ground truth: verl compares the answer string with it (never equal), quartet with
        # str(ground_truth), as its data loader hands every ground truth on as a string
        assert not isinstance(truth, str) and verl["score"] == 0.0
        assert got == reference_score(response, str(truth), method) == 1.0
        return
    assert got == verl["score"] == reference_score(response, truth, method)
    assert got_fmt == verl["score_with_format"] == reference_score(response, truth, method, fmt)


def test_departures_are_named_in_the_docs() -> None:
    doc = (HERE.parent.parent / "docs" / "from_verl.md").read_text()
    section = doc.split("## GSM8K in `reward.rule_mode=verl`", 1)[1].split("\n## ", 1)[0]
    for case_id in DEPARTURES:
        assert re.search(rf"`{case_id}`", section), case_id


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
