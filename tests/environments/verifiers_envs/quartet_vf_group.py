"""A verifiers environment whose rubric has a group reward function (a test fixture): it scores all of a
prompt's rollouts at once, which quartet's per-episode scoring cannot run; loading it is refused."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def load_environment() -> vf.Environment:
    data = Dataset.from_list([{"question": "Say anything.", "answer": "x"}])

    async def longest_wins(completions: list[vf.Messages]) -> list[float]:
        sizes = [len(str(c[-1]["content"])) for c in completions]
        return [float(s == max(sizes)) for s in sizes]

    return vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[longest_wins]))
