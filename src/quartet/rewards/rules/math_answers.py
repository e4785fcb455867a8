"""Competition math (MATH, AIME, DAPO-Math): the last boxed answer against the reference, after normalising.

Extraction. The content of the LAST `\\boxed{...}` or `\\fbox{...}` (braces balanced, escaped braces
skipped), or of `\\boxed 5`. A last box that never closes (a truncated response) gives no answer: an
earlier box is usually an intermediate result. For DAPO-style prompts ("the last line of your response
should be `Answer: ...`") `answer_line=True` also accepts the last `Answer:` line when there is no box.

Normalisation (`normalize_answer`), in this order, so that equal answers written differently compare equal:
1. `$`, `\\(`/`\\)`, `\\left`/`\\right`, `\\displaystyle` and the spacing commands `\\! \\, \\; \\: \\ ~`
   are dropped; `\\dfrac`/`\\tfrac` become `\\frac`; degrees (`^\\circ`, `°`) and percent signs go.
2. A trailing `\\text{...}` (or `\\mbox`, `\\textrm`) after a number is a unit and is dropped
   (`5\\text{ cm}` -> `5`); any other `\\text{X}` is unwrapped to `X`. A trailing plain unit word after a
   number (`5 cm`, `12 square units`) is dropped too (a short list; single letters never, they may be
   variables).
3. A leading `x =` (one `=`, a single variable or a command like `\\theta` on the left) is dropped.
4. Whitespace and a trailing `.` are removed; `{,}` and thousands commas in a plain number go (`1,000`).
5. Shorthand is braced: `\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}`, `\\sqrt2` -> `\\sqrt{2}`; `.5` -> `0.5`.

Comparison (`answers_equal`). Equal normalised strings match. Otherwise, when both parse as numbers
(integers, decimals, `a/b`, `\\frac{a}{b}` with numeric a and b, a sign in front) they match when the
exact rationals are equal, so `0.5`, `1/2` and `\\frac{1}{2}` agree but `0.33` and `\\frac{1}{3}` do not.
Tuples and intervals compare element by element when their brackets are the same (`(1,2]` != `(1,2)`).
An empty answer never matches.

Departures from lm-eval's `is_equiv` / verl's `math` and `math_dapo`, on purpose: no symbolic algebra
(sympy's LaTeX parser needs antlr4, not a dependency), so `\\frac{\\sqrt{2}}{2}` and `\\sqrt{2}/2` differ;
numbers compare as exact rationals instead of as strings; a last box that never closes scores 0. Scores are
1.0 / 0.0 for every source (DAPO trains with +1 / -1: use a custom function for that).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

__all__ = [
    "answers_equal",
    "as_number",
    "compute_score",
    "extract_answer_line",
    "extract_boxed",
    "normalize_answer",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_TEXT_COMMANDS = ("\\text", "\\mbox", "\\textrm", "\\textbf", "\\mathrm", "\\mathbf", "\\textit")
_UNIT_COMMANDS = ("\\text", "\\mbox", "\\textrm")
_DROP = (
    ("\\$", ""), ("$", ""), ("\\(", ""), ("\\)", ""), ("\\displaystyle", ""),
    ("\\!", ""), ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "), ("~", " "), ("\n", " "),
    ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
    ("^{\\circ}", ""), ("^\\circ", ""), ("\\circ", ""), ("\\degree", ""), ("°", ""),
    ("\\%", ""), ("%", ""),
)  # fmt: skip
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_UNIT_WORDS = re.compile(
    r"(?<=[\d}])\s+(?:square\s+|sq\.?\s+|cubic\s+)?"
    r"(?:units?|cm|centimeters?|mm|millimeters?|meters?|km|kilometers?|inches|inch|feet|foot|ft|yards?|"
    r"miles?|mph|hours?|minutes?|seconds?|days?|weeks?|years?|degrees?|dollars?|cents?|pounds?|ounces?)"
    r"(?:\^\{?\d\}?)?\s*$"
)
_VARIABLE = re.compile(r"\s*(?:[A-Za-z](?:_\{?\w+\}?)?|\\[A-Za-z]+)\s*")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL = r"[+-]?(?:\d+\.?\d*|\.\d+)"
_PLAIN_NUMBER = re.compile(_DECIMAL)
_SLASH_NUMBER = re.compile(rf"({_DECIMAL})/({_DECIMAL})")
_FRAC_NUMBER = re.compile(rf"([+-]?)\\frac\{{({_DECIMAL})\}}\{{({_DECIMAL})\}}")
_ANSWER_LINE = re.compile(r"answer\s*:\s*\**\s*([^\n]+)", re.IGNORECASE)
_OPENERS = {"(": ")", "[": "]", "{": "}"}


def _group_end(text: str, open_pos: int) -> int | None:
    """Index just past the `}` closing the `{` at `open_pos` (escaped braces skipped); None if unclosed."""
    depth = 0
    i = open_pos
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (or `\\boxed 5`); None if absent or unclosed."""
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + len(command)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _group_end(text, i)
        return None if end is None else text[i + 1 : end - 1].strip()
    if i > start + len(command):  # `\boxed 5`: up to the next space or `$`
        match = re.match(r"[^\s$]+", text[i:])
        return match.group(0) if match else None
    return None


def extract_answer_line(text: str) -> str | None:
    """The text after the last `Answer:` (DAPO's answer format), without `$`, `*` and a final `.`."""
    found = _ANSWER_LINE.findall(text)
    if not found:
        return None
    answer = found[-1].strip().rstrip(".").strip("*$ ").rstrip(".")
    return answer or None


def _replace_groups(text: str, commands: tuple[str, ...], keep_content: bool) -> str:
    """Each `\\cmd{X}` of `commands` replaced by X (or removed); unclosed groups are left as they are."""
    out: list[str] = []
    i = 0
    while i < len(text):
        hit = next((c for c in commands if text.startswith(c + "{", i)), None)
        if hit is None:
            out.append(text[i])
            i += 1
            continue
        end = _group_end(text, i + len(hit))
        if end is None:
            out.append(text[i:])
            break
        if keep_content:
            out.append(text[i + len(hit) + 1 : end - 1])
        i = end
    return "".join(out)


def _drop_trailing_unit(text: str) -> str:
    """`5\\text{ cm}` -> `5`: a final text group after something holding a digit is a unit."""
    stripped = text.rstrip()
    if not stripped.endswith("}"):
        return text
    for command in _UNIT_COMMANDS:
        start = stripped.rfind(command + "{")
        if start > 0 and _group_end(stripped, start + len(command)) == len(stripped):
            head = stripped[:start]
            if any(c.isdigit() for c in head):
                return head
    return text


def _read_argument(text: str, i: int) -> tuple[str, int] | None:
    """One macro argument at `i`: a braced group, a `\\command`, or a single character (with its end)."""
    if i >= len(text):
        return None
    if text[i] == "{":
        end = _group_end(text, i)
        return None if end is None else (text[i + 1 : end - 1], end)
    if text[i] == "\\":
        match = re.match(r"\\[A-Za-z]+", text[i:])
        if match:
            return match.group(0), i + len(match.group(0))
    return text[i], i + 1


def _brace_shorthand(text: str, command: str, n_args: int) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\sqrt2` -> `\\sqrt{2}` (whitespace already removed)."""
    out: list[str] = []
    i = 0
    while True:
        j = text.find(command, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        k = j + len(command)
        out.append(text[i:k])
        if k < len(text) and text[k] == "[":  # \sqrt[3]{x}: keep the optional argument
            close = text.find("]", k)
            if close < 0:
                out.append(text[k:])
                return "".join(out)
            out.append(text[k : close + 1])
            k = close + 1
        for _ in range(n_args):
            arg = _read_argument(text, k)
            if arg is None:
                break
            out.append("{" + arg[0] + "}")
            k = arg[1]
        i = k


def normalize_answer(answer: str) -> str:
    """A canonical string for a math answer (see the module docstring for the steps)."""
    text = str(answer).strip()
    for old, new in _DROP:
        text = text.replace(old, new)
    text = _LEFT_RIGHT.sub("", text)
    text = _drop_trailing_unit(text)
    text = _replace_groups(text, _TEXT_COMMANDS, keep_content=True)
    text = _UNIT_WORDS.sub("", text)
    if text.count("=") == 1:
        lhs, rhs = text.split("=")
        if _VARIABLE.fullmatch(lhs):
            text = rhs
    text = re.sub(r"\s+", "", text).rstrip(".")
    text = text.replace("{,}", "")
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    text = _brace_shorthand(text, "\\frac", 2)
    text = _brace_shorthand(text, "\\sqrt", 1)
    return re.sub(r"(?<![\d}])\.(\d)", r"0.\1", text)


def _decimal(text: str) -> Fraction:
    return Fraction(Decimal(text))


def as_number(normalized: str) -> Fraction | None:
    """The exact value of a normalised answer that is a plain number, `a/b` or `\\frac{a}{b}`; else None."""
    try:
        if _PLAIN_NUMBER.fullmatch(normalized):
            return _decimal(normalized)
        match = _SLASH_NUMBER.fullmatch(normalized)
        if match:
            den = _decimal(match.group(2))
            return _decimal(match.group(1)) / den if den else None
        match = _FRAC_NUMBER.fullmatch(normalized)
        if match:
            den = _decimal(match.group(3))
            value = _decimal(match.group(2)) / den if den else None
            return -value if value is not None and match.group(1) == "-" else value
    except (InvalidOperation, ValueError):
        return None
    return None


def _split_tuple(text: str) -> tuple[str, list[str]]:
    """(brackets, parts): `(1,2]` -> ("(]", ["1", "2"]); no enclosing brackets -> ("", parts)."""
    brackets, inner = "", text
    if text.startswith("\\{") and text.endswith("\\}"):
        brackets, inner = "\\{\\}", text[2:-2]
    elif len(text) >= 2 and text[0] in "([" and text[-1] in ")]":
        depth = 0
        for i, char in enumerate(text):
            depth += char in "([{"
            depth -= char in ")]}"
            if depth == 0 and i < len(text) - 1:  # the first bracket closes early: `(1)+(2)`
                return "", [text]
        brackets, inner = text[0] + text[-1], text[1:-1]
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in inner:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return brackets, parts


def _equal_normalized(a: str, b: str) -> bool:
    if a == b:
        return True
    x, y = as_number(a), as_number(b)
    if x is not None and y is not None:
        return x == y
    (brackets_a, parts_a), (brackets_b, parts_b) = _split_tuple(a), _split_tuple(b)
    if brackets_a != brackets_b or len(parts_a) != len(parts_b) or len(parts_a) < 2:
        return False
    return all(_equal_normalized(p, q) for p, q in zip(parts_a, parts_b, strict=True))


def answers_equal(prediction: str, reference: str) -> bool:
    """True when two answers are equal after normalising (see the module docstring)."""
    a, b = normalize_answer(prediction), normalize_answer(reference)
    return bool(a) and bool(b) and _equal_normalized(a, b)


def _references(ground_truth: Any) -> list[str]:
    """Acceptable answers: one, or several (a list); a boxed reference solution gives its box."""
    items = list(ground_truth) if isinstance(ground_truth, list | tuple) else [ground_truth]
    out = []
    for item in items:
        text = str(item)
        boxed = extract_boxed(text) if any(c in text for c in _BOX_COMMANDS) else None
        out.append(boxed if boxed is not None else text)
    return out


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    answer_line: bool = False,
) -> float:
    """1.0 when the response's last boxed answer equals the reference (or one of a list of them), else 0.0.

    Args:
        data_source: unused (verl signature).
        solution_str: the decoded response.
        ground_truth: the reference answer, a list of acceptable ones, or a solution with a `\\boxed{}`.
        extra_info: unused (verl signature).
        answer_line: also accept DAPO's `Answer: ...` line when the response has no box.
    """
    prediction = extract_boxed(solution_str)
    if prediction is None and answer_line:
        prediction = extract_answer_line(solution_str)
    if prediction is None:
        return 0.0
    return 1.0 if any(answers_equal(prediction, ref) for ref in _references(ground_truth)) else 0.0
