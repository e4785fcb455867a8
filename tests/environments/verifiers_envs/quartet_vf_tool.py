"""A tool verifiers environment in verifiers' own style (a test fixture): a `ToolEnv` whose python function
`add` the model calls; the rollout stops at the first turn without a tool call."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def load_environment(max_turns: int = 4) -> vf.Environment:
    data = Dataset.from_list(
        [
            {"question": f"Use the add tool: {a} + {b}?", "answer": str(a + b)}
            for a, b in [(2, 3), (40, 2), (7, 8)]
        ]
    )

    def correct(completion: vf.Messages, answer: str) -> float:
        return 1.0 if answer in str(completion[-1]["content"]) else 0.0

    rubric = vf.Rubric(funcs=[correct], weights=[2.0])
    return vf.ToolEnv(dataset=data, tools=[add], rubric=rubric, max_turns=max_turns)
