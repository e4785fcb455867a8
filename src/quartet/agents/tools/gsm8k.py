"""A GSM8K answer tool: the model submits its final answer, the tool says whether it matches the ground truth.

quartet's counterpart of verl's `Gsm8kTool` (a verl tools file naming `verl.tools.gsm8k_tool.Gsm8kTool`
builds this one, `quartet.agents.verl_compat`), with the same contract so a verl recipe trains the same:

- per trajectory, `create(ground_truth=...)` (the row's `extra_info.tools_kwargs.<name>.create_kwargs`);
- a call `{"answer": "..."}` is read as the final answer: its LAST number (`-?[0-9.,]+`, a lone "." or ","
  skipped) compared with the ground truth, thousands separators and a trailing "." removed on both sides;
  score 1.0 when equal, else 0.0 (`gsm8k_score`);
- the call's own reward: 0.0 when the score went up from the instance's previous best, else
  `-repeat_penalty` (0.05, verl's), so resubmitting a wrong or the same answer costs a little;
- `calc_reward` is the score of the last submitted answer (the trajectory's outcome).
"""

from __future__ import annotations

import re
from typing import Any

from quartet.agents.tools.base import Tool, ToolResult

__all__ = ["Gsm8kAnswerTool", "gsm8k_score", "last_number"]

_NUMBER = re.compile(r"-?[0-9.,]+")


def last_number(text: str) -> str | None:
    """The last number-like run of `text` with its commas and a trailing "." removed; None when none."""
    found: str
    for found in reversed(_NUMBER.findall(text)):
        cleaned = found.replace(",", "").rstrip(".")
        if cleaned not in ("", "-"):
            return cleaned
    return None


def gsm8k_score(answer: str, ground_truth: object) -> float:
    """1.0 when the last number of `answer` equals the ground truth (same normalization), else 0.0."""
    got = last_number(answer)
    want = last_number(str(ground_truth)) if ground_truth is not None else None
    return 1.0 if got is not None and got == want else 0.0


class Gsm8kAnswerTool(Tool):
    """Checks a submitted GSM8K answer against the trajectory's ground truth (module docstring)."""

    schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "Submit your final answer to the math problem; says whether it is correct.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "the final answer, a number"}},
                "required": ["answer"],
            },
        },
    }

    def __init__(self, *, schema: dict[str, Any] | None = None, repeat_penalty: float = 0.05) -> None:
        """`repeat_penalty`: what a call that does not raise the score costs (its turn's reward)."""
        super().__init__(schema=schema)
        if repeat_penalty < 0:
            raise ValueError(f"repeat_penalty must be >= 0, got {repeat_penalty}")
        self.repeat_penalty = repeat_penalty

    async def create(self, instance_id: str | None = None, **tools_kwargs: Any) -> str:
        """`ground_truth` is required: without it no answer could ever be right."""
        if "ground_truth" not in tools_kwargs:
            raise ValueError(
                "calc_gsm8k_reward needs create_kwargs.ground_truth (the row's "
                "extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs)"
            )
        instance_id = await super().create(instance_id, **tools_kwargs)
        self.instances[instance_id].update(score=0.0, answer="")
        return instance_id

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        state = self.instances[instance_id]
        answer = str(arguments.get("answer", ""))
        score = gsm8k_score(answer, state["ground_truth"])
        turn = 0.0 if score > state["score"] else -self.repeat_penalty
        state.update(score=score, answer=answer)
        return ToolResult(f"answer {answer!r}: score {score:g}", reward=turn)

    async def calc_reward(self, instance_id: str) -> float:
        return float(self.instances[instance_id]["score"])
