"""A multi-turn verifiers environment in verifiers' own style (a test fixture): guess the hidden word; each
wrong guess gets a hint from `env_response`; the rollout stops when the word is said (a `@vf.stop`
condition) or after `max_turns` guesses."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

WORDS = ["pear", "plum", "lime", "kiwi"]


class GuessWordEnv(vf.MultiTurnEnv):
    async def setup_state(self, state: vf.State) -> vf.State:
        state["hints"] = 0
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: object) -> vf.Messages:
        state["hints"] += 1
        answer = str(state["answer"])
        return [
            {
                "role": "user",
                "content": f"No. Hint {state['hints']}: it starts with {answer[: state['hints']]}.",
            }
        ]

    @vf.stop
    async def guessed(self, state: vf.State) -> bool:
        if not state["trajectory"]:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return str(state["answer"]) in str(last["content"])


def load_environment(max_turns: int = 3) -> vf.Environment:
    data = Dataset.from_list([{"question": "Guess my fruit (four letters).", "answer": w} for w in WORDS])

    async def found(completion: vf.Messages, answer: str) -> float:
        said = [m for m in completion if m["role"] == "assistant"]
        return 1.0 if said and answer in str(said[-1]["content"]) else 0.0

    async def quick(state: vf.State) -> float:
        return 1.0 / len(state["trajectory"])

    rubric = vf.Rubric(funcs=[found, quick], weights=[1.0, 0.25])
    return GuessWordEnv(dataset=data, rubric=rubric, max_turns=max_turns)
