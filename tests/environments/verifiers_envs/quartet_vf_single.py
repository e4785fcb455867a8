"""A single-turn verifiers environment in verifiers' own style (a test fixture): sums to state, scored by a
rubric of two weighted reward functions, one async. `fail=True` makes a reward function raise; `blob=True`
adds a column of bytes (which quartet's rows cannot carry as JSON)."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def load_environment(
    num_examples: int = 6, concise_weight: float = 0.5, fail: bool = False, blob: bool = False
) -> vf.Environment:
    data = Dataset.from_list(
        [
            {"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1), "info": {"a": a}}
            | ({"blob": bytes([a])} if blob else {})
            for a in range(1, num_examples + 1)
        ]
    )

    async def correct_answer(completion: vf.Messages, answer: str) -> float:
        return 1.0 if answer in str(completion[-1]["content"]) else 0.0

    def concise(completion: vf.Messages, info: dict) -> float:
        if fail:
            raise KeyError("no_such_field")
        words = str(completion[-1]["content"]).split()
        return 1.0 if len(words) <= 4 else 0.25 + 0.0 * info["a"]

    rubric = vf.Rubric(funcs=[correct_answer, concise], weights=[1.0, concise_weight])
    return vf.SingleTurnEnv(dataset=data, system_prompt="Answer with the number only.", rubric=rubric)
