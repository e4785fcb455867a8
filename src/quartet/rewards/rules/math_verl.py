"""Competition math scored as verl 0.9.1 scores `lighteval/MATH` (its Hendrycks-style `math` rule).

Used for the MATH data sources when `reward.rule_mode=verl` (the default); `math_answers` is the lenient
rule (`reward.rule_mode=lenient`). The rule, as documented by verl and the MATH paper's evaluation code:

Extraction. If the response contains `\\boxed ` (with a space), the answer is what follows its last
occurrence up to the next `$`. Otherwise the last `\\boxed` (else the last `\\fbox`) with its braces
balanced; none, or braces never closed, gives no answer (score 0). A `\\fbox{...}` is found but is not a
`\\boxed{` group, so it scores 0 too (verl fails to unwrap it and returns 0).

Normalisation of both the answer and the ground truth, in this order: drop newlines and `\\!`; `\\\\` ->
`\\`; `tfrac`/`dfrac` -> `frac`; drop `\\left`, `\\right`, `^{\\circ}`, `^\\circ`, `\\$`; a unit written as
`\\text{ ...}` (with a space) is cut off with what follows it (two such units: the normalisation fails);
drop `\\%`; ` .` -> ` 0.`, `{.` -> `{0.`; a leading `.` gets a `0`; a
`k = ` prefix of at most two characters before a single `=` is removed; `\\sqrt2` -> `\\sqrt{2}`; spaces
removed; `\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}` (a `\\frac` followed by fewer than two
characters leaves the string unchanged); `0.5` -> `\\frac{1}{2}`; an integer `a/b` -> `\\frac{a}{b}`.

Verdict: 1.0 when the normalised strings are equal; if normalising either raises, the raw strings are
compared instead. Otherwise 0.0. No symbolic equivalence: `1/2` and `0.5` match, `2/4` and `1/2` do not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compute_score", "is_equiv", "last_boxed", "normalize"]


class _Unnormalizable(ValueError):
    """The normalisation cannot proceed (verl's assertion): compare the raw strings."""


def last_boxed(text: str) -> str | None:
    """The content of the last box (see the module docstring), None without a usable one."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    command = "\\boxed"
    if start < 0:
        start, command = text.rfind("\\fbox"), "\\fbox"
        if start < 0:
            return None
    depth = 0
    for end in range(start, len(text)):
        if text[end] == "{":
            depth += 1
        elif text[end] == "}":
            depth -= 1
            if depth == 0:
                group = text[start : end + 1]
                if command != "\\boxed" or not group.startswith("\\boxed{"):
                    return None  # verl cannot unwrap it: no answer
                return group[len("\\boxed{") : -1]
    return None


def _cut_text_unit(s: str) -> str:
    parts = s.split("\\text{ ")
    if len(parts) > 2:
        raise _Unnormalizable("several \\text{ } units")
    return parts[0]


def _brace_sqrt(s: str) -> str:
    if "\\sqrt" not in s:
        return s
    head, *rest = s.split("\\sqrt")
    out = [head]
    for piece in rest:
        if not piece:
            raise _Unnormalizable("\\sqrt at the end")
        out.append("\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:]))
    return "".join(out)


def _brace_fracs(s: str) -> str:
    head, *rest = s.split("\\frac")
    out = [head]
    for piece in rest:
        if piece.startswith("{"):
            out.append("\\frac" + piece)
            continue
        if len(piece) < 2:
            return s  # `\frac` with fewer than two characters after it: left as it was
        a = piece[0]
        b = piece[1]
        tail = piece[2:]
        out.append("\\frac{" + a + "}" + (b + tail if b == "{" else "{" + b + "}" + tail))
    return "".join(out)


def _slash_to_frac(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def normalize(s: str) -> str:
    """verl's normalisation of one answer (see the module docstring); `_Unnormalizable` where verl fails."""
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac")):
        s = s.replace(old, new)
    for gone in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$"):
        s = s.replace(gone, "")
    s = _cut_text_unit(s)
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _brace_fracs(_brace_sqrt(s).replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def is_equiv(answer: str | None, reference: str | None) -> bool:
    """Equal after normalisation (raw equality where normalising fails); both None count as equal."""
    if answer is None or reference is None:
        return answer is None and reference is None
    try:
        return normalize(answer) == normalize(reference)
    except _Unnormalizable:
        return answer == reference


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the last box's content is equivalent to the ground truth, else 0.0 (verl's signature)."""
    answer = last_boxed(solution_str)
    return 1.0 if answer is not None and is_equiv(answer, str(ground_truth)) else 0.0
