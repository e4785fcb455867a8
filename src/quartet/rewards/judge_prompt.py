"""The judge's side of an LLM-judge reward: the rubric prompt it is sent, and how its reply becomes a score.

A rubric is a template in which `{question}`, `{response}` and `{ground_truth}` are replaced by the row's
text; any other brace is kept as written (so a rubric may show JSON without escaping). The judge must end
its reply with a verdict, read by `parse_verdict`:

    <score>7</score>        the last such tag wins, or
    Score: 7                the last `Score:` line (also `**Score:** 7`, `score = 7`, `Score: 7/10`)

A reply without a verdict, with a number outside [score_min, score_max], or empty is a *bad verdict*:
`Verdict.score` is None and `Verdict.problem` says which. The caller gives it the configured fallback
score and counts it, so a judge that stopped following the rubric shows in the metrics instead of
silently scoring 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.config.reward import JUDGE_FIELDS, JudgeConfig, check_rubric

__all__ = ["DEFAULT_RUBRIC", "Verdict", "fill_rubric", "load_rubric", "parse_verdict", "question_text"]

DEFAULT_RUBRIC = """You are grading a response to a question. Decide how well the response answers the \
question: is it correct, complete and clear? When a reference answer is given, a correct response agrees \
with it.

Question:
{question}

Reference answer:
{ground_truth}

Response to grade:
{response}

Explain your judgement in a few sentences. Then end your reply with one line of exactly this form:
Score: N
where N is an integer from 0 (wrong, empty or off topic) to 10 (correct, complete and clear)."""
"""The rubric used when `reward.judge.rubric` and `rubric_file` are empty (scores 0 to 10)."""

NO_REFERENCE = "(none given)"
"""What `{ground_truth}` becomes for a row without one."""

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_TAG = re.compile(rf"<score>\s*({_NUMBER})\s*</score>", re.IGNORECASE)
_LINE = re.compile(rf"score\s*\**\s*[:=]\s*\**\s*({_NUMBER})", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    """A judge reply read: its score on the rubric's scale, or why there is none."""

    score: float | None
    """The verdict's number; None for a bad verdict."""
    problem: str = ""
    """Why the verdict is bad (empty when good)."""


def load_rubric(cfg: JudgeConfig) -> str:
    """The rubric template: `rubric`, the text of `rubric_file`, or the default; checked for `{response}`."""
    if cfg.rubric:
        return cfg.rubric
    if not cfg.rubric_file:
        return DEFAULT_RUBRIC
    path = Path(cfg.rubric_file).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(
            f"reward.judge.rubric_file: cannot read {str(path)!r} ({err}); give the path of a text file "
            "holding the rubric template"
        ) from err
    check_rubric(text, f"reward.judge.rubric_file ({path})")
    return text


def fill_rubric(template: str, question: str, response: str, ground_truth: Any) -> str:
    """The judge prompt of one response: each placeholder replaced once, in one pass (a response that
    itself contains `{question}` is not expanded again)."""
    truth = NO_REFERENCE if ground_truth is None or ground_truth == "" else str(ground_truth)
    values = {"question": question, "response": response, "ground_truth": truth}
    pattern = re.compile("|".join(re.escape("{" + name + "}") for name in JUDGE_FIELDS))
    return pattern.sub(lambda match: values[match.group(0)[1:-1]], template)


def question_text(raw_prompt: Any) -> str:
    """The question a response answers: the last user message of a chat prompt, or the prompt text."""
    if isinstance(raw_prompt, str):
        return raw_prompt
    if isinstance(raw_prompt, Sequence):
        users = [m for m in raw_prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return _content_text(users[-1].get("content"))
        if raw_prompt and isinstance(raw_prompt[-1], Mapping):
            return _content_text(raw_prompt[-1].get("content"))
    return "" if raw_prompt is None else str(raw_prompt)


def _content_text(content: Any) -> str:
    """A message's content as text (OpenAI's list-of-parts form joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        return "".join(str(p) for p in parts)
    return "" if content is None else str(content)


def parse_verdict(reply: str, score_min: float, score_max: float) -> Verdict:
    """The score of a judge reply: the last `<score>..</score>`, else the last `Score: N`; range-checked."""
    if not reply.strip():
        return Verdict(None, "empty reply")
    tags = _TAG.findall(reply)
    found = tags or _LINE.findall(reply)
    if not found:
        return Verdict(None, "no verdict (neither <score>N</score> nor a 'Score: N' line)")
    value = float(found[-1])
    if not math.isfinite(value):
        return Verdict(None, f"verdict {found[-1]!r} is not a finite number")
    if not score_min <= value <= score_max:
        return Verdict(None, f"verdict {value:g} is outside [{score_min:g}, {score_max:g}]")
    return Verdict(value)
