"""GSM8K: the final number of a response against the reference answer, as verl scores it or leniently.

verl's rule (`compute_score_verl`, the default, `reward.rule_mode=verl`), from verl 0.9.1's documented
`gsm8k` scorer: only the LAST 300 characters of the response are read. strict: the answer is the last
`#### ` (four `#`, exactly one space) followed by a run of digits, `.` and `,` with an optional leading `-`;
`####42`, `####  42` and `####\n42` give no answer. Commas are removed. flexible: the last run of that
alphabet (commas kept) that is not `.` alone. The verdict is `score` when the answer string EQUALS
str(ground_truth), `format_score` when it does not, 0 without an answer (so `18.0` against `18` is wrong,
as in verl). Use it to compare rewards with a verl run on the same data.

The lenient rule (`compute_score`, `reward.rule_mode=lenient`) reads the whole response and accepts more:

Extraction, in two modes (as in the GSM8K paper's format and verl's `gsm8k` scorer):
- strict (default): the number after the LAST `####` marker; a response without one has no answer.
- flexible: the last number anywhere in the response (for models not trained on the `####` format).
Thousands commas and `$` signs are removed and a trailing `.` is dropped before comparing.

Comparison. Two answers match when their strings are equal or their decimal values are (so `18`,
`18.0` and `18.00` match; verl compares strings only). The ground truth may be the bare number or the
whole reference solution ending in `#### <number>`.

Score. 1.0 for a match, else 0.0, with or without an extracted answer. verl's scorer has a
`format_score` for "well-formatted but wrong"; we keep it (`format_score=`) but default it to 0.0: any
positive value pays the model for writing `####` with a wrong number, and with group-relative
advantages that rewards format over correctness once most responses are formatted. Set it only to teach
the format to a model that never writes it.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

__all__ = [
    "compute_score",
    "compute_score_verl",
    "extract_solution",
    "extract_solution_verl",
    "normalize_number",
]

Method = Literal["strict", "flexible"]

_STRICT = re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)")
_ANY_NUMBER = re.compile(r"-?[\d,]*\.?\d+")

VERL_CLIP_CHARS = 300  # verl reads only the response's tail (its regexes are slow on long strings)
_VERL_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_VERL_ANY = re.compile(r"(-?[0-9.,]+)")


def normalize_number(text: str) -> str:
    """A number as written, without thousands commas, `$`, spaces and a trailing `.`."""
    return text.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_solution(solution_str: str, method: Method = "strict") -> str | None:
    """The response's final answer, normalised; None when there is none (see the module docstring)."""
    if method == "strict":
        found = _STRICT.findall(solution_str)
    elif method == "flexible":
        found = [m for m in _ANY_NUMBER.findall(solution_str) if any(c.isdigit() for c in m)]
    else:
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    if not found:
        return None
    answer = normalize_number(found[-1])
    return answer or None


def _reference(ground_truth: Any) -> str:
    """The reference number: the bare answer, or the one after `####` in a whole reference solution."""
    text = str(ground_truth)
    marked = _STRICT.findall(text)
    return normalize_number(marked[-1] if marked else text)


def _same_number(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    method: Method = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """`score` when the extracted answer equals the reference, `format_score` when it does not, 0 without one.

    Args:
        data_source: unused (verl signature).
        solution_str: the decoded response.
        ground_truth: the reference number, or a reference solution ending in `#### <number>`.
        extra_info: unused (verl signature).
        method: "strict" (after the last `####`) or "flexible" (last number in the text).
        format_score: given for an extracted but wrong answer; 0.0 by default (see the module docstring).
        score: given for a correct answer.
    """
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if _same_number(answer, _reference(ground_truth)) else format_score


def extract_solution_verl(solution_str: str, method: Method = "strict") -> str | None:
    """verl's extraction (see the module docstring): the last 300 characters, `#### <number>` or last run."""
    tail = solution_str[-VERL_CLIP_CHARS:]
    if method == "strict":
        found: list[str] = _VERL_STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    if method == "flexible":
        runs: list[str] = _VERL_ANY.findall(tail)
        if not runs:
            return None
        kept = [r for r in runs if r not in ("", ".")]
        # all runs are "." alone: verl's loop ends on the first run it visited last, runs[0]
        return kept[-1] if kept else runs[0]
    raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")


def compute_score_verl(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    method: Method = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """verl's verdict: `score` if the extracted answer string equals str(ground_truth), else `format_score`;
    0 without an answer. Arguments as `compute_score`. Checked against verl's own answers on recorded cases
    (tests/rewards/test_gsm8k_verl.py). One departure (docs/from_verl.md): verl compares with the ground truth
    as given, so a non-string one (the int 42) never matches; here str(ground_truth) does."""
    answer = extract_solution_verl(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth) else format_score
