"""The agent loops of one replica over a prompt batch: loop chosen per row, n seeded trajectories per row,
the rollout Batch the trainer reads (masks, prompts, extra_info for the reward, loop metrics).

The policy is scripted from what it reads in its prompt (so the expected calls and answers are known): a
question gets a calculator call on its expression, a tool result gets the result repeated as the answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from quartet.agents.batch import agent_batch_metrics
from quartet.agents.loops import UnknownAgentError
from quartet.agents.runner import AgentRunner, trajectory_seed
from quartet.config.rollout import MultiTurnConfig
from quartet.core.batch import Batch
from quartet.rollout.types import FinishReason, GenerationOutput, SamplingParams

QUESTIONS = ["What is 482 * 917 + 33?", "What is 12 * 34 + 5?"]


class PromptReadingPolicy:
    """Calls the calculator on the question's expression, then answers with the tool's result."""

    def __init__(self, tokenizer: Any, wrong_answer_for: str = "") -> None:
        self.tok = tokenizer
        self.seeds: list[int | None] = []
        self.wrong_answer_for = wrong_answer_for

    async def __call__(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[GenerationOutput]:
        self.seeds.append(sampling.seed)
        text = self.tok.decode(list(prompt_ids), skip_special_tokens=False)
        last_tool = text.rfind("<|im_start|>tool\n")
        if last_tool < 0:
            expression = re.findall(r"What is (.+)\?", text)[-1]
            call = {"name": "calculator", "arguments": {"expression": expression}}
            reply = f"<tool_call>{json.dumps(call)}</tool_call>"
        else:
            reply = text[last_tool:].split("\n")[1].removesuffix("<|im_end|>")
            if self.wrong_answer_for and self.wrong_answer_for in text:
                reply = "7"
        ids = self.tok.encode(reply + "<|im_end|>", add_special_tokens=False)[: sampling.max_new_tokens]
        logprobs = tuple(-0.5 for _ in ids)
        return [GenerationOutput("r", 0, tuple(ids), logprobs, FinishReason.STOP)]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def prompts(agent_names: list[str | None]) -> Batch:
    rows = len(agent_names)
    return Batch(
        {
            "prompts": torch.ones(rows, 3, dtype=torch.int64),
            "attention_mask": torch.ones(rows, 3, dtype=torch.int64),
        },
        {
            "raw_prompt": [[{"role": "user", "content": QUESTIONS[i % 2]}] for i in range(rows)],
            "agent_name": agent_names,
            "extra_info": [{"index": i} for i in range(rows)],
            "ground_truth": [str(eval(QUESTIONS[i % 2][8:-1])) for i in range(rows)],  # noqa: S307 - literals
        },
    )


def test_tool_rows_become_token_exact_training_rows(tokenizer: Any) -> None:
    mt = MultiTurnConfig(enable=True, tools=("calculator",))
    runner = AgentRunner.from_config(mt, tokenizer, max_response_tokens=96)
    policy = PromptReadingPolicy(tokenizer)
    sampling = SamplingParams(temperature=1.0, n=2, max_new_tokens=96, seed=5)
    batch = runner.run(prompts([None, "tool_agent"]), sampling, policy, tokenizer.pad_token_id)

    assert len(batch) == 4 and batch["responses"].shape[1] == 96
    for row in range(4):
        info = batch.non_tensors["extra_info"][row]
        truth = batch.non_tensors["ground_truth"][row]
        # the answer the reward function sees is the model's last turn, and it is the calculator's result
        assert info["final_message"] == truth == str(eval(QUESTIONS[row // 2 % 2][8:-1]))  # noqa: S307
        assert info["num_turns"] == 2 and info["index"] == row // 2
        metrics = batch.non_tensors["agent_metrics"][row]
        assert metrics["tool/calls"] == 1 and metrics["tool/failed"] == 0
        assert metrics["agent/token_drift"] == 0
        # mask: 1 on the two model turns, 0 on the tool turn between them and on padding
        mask = batch["response_mask"][row]
        length = int(batch["attention_mask"][row, batch["prompts"].shape[1] :].sum())
        runs = [int(v) for v in mask[:length]]
        changes = [i for i in range(1, length) if runs[i] != runs[i - 1]]
        assert runs[0] == 1 and len(changes) == 2 and mask[length:].sum() == 0
        tool_text = tokenizer.decode(batch["responses"][row][changes[0] : changes[1]])
        assert f"<|im_start|>tool\n{truth}<|im_end|>" in tool_text
        # log-probs are the engine's on model tokens, 0 elsewhere
        lp = batch["rollout_logprobs"][row][:length]
        assert torch.all(lp[mask[:length] == 1] == -0.5) and torch.all(lp[mask[:length] == 0] == 0)
        # the prompt is rendered with the calculator's schema in it
        assert "calculator" in tokenizer.decode(batch["prompts"][row])
    # every trajectory and turn sampled with its own seed, derived from the request's
    expected = {trajectory_seed(5, r, s, 2, t) for r in range(2) for s in range(2) for t in range(2)}
    assert sorted(policy.seeds) == sorted(expected) and len(expected) == 8

    figures = agent_batch_metrics(batch)
    assert figures["tool/calls/total"] == 4 and figures["tool/calculator/calls/total"] == 4
    assert figures["agent/assistant_turns/mean"] == 2 and figures["agent/finish/no_tool_call"] == 1.0
    assert figures["agent/token_drift/max"] == 0


def test_single_turn_rows_and_unknown_loops(tokenizer: Any) -> None:
    mt = MultiTurnConfig(enable=True, tools=("calculator",))
    runner = AgentRunner.from_config(mt, tokenizer, max_response_tokens=64)
    policy = PromptReadingPolicy(tokenizer)
    sampling = SamplingParams(n=1, max_new_tokens=64, seed=0)
    batch = runner.run(prompts(["single_turn"]), sampling, policy, tokenizer.pad_token_id)
    # no tools in a single-turn prompt; one model turn, the whole response is the model's
    assert "calculator" not in tokenizer.decode(batch["prompts"][0]).split("user")[0]
    assert batch.non_tensors["extra_info"][0]["num_turns"] == 1
    written = int(batch["response_mask"][0].sum())
    assert written > 0 and batch["response_mask"][0][:written].all()

    with pytest.raises(
        UnknownAgentError, match="unknown agent_name 'react'.*single_turn, tool_agent, user_sim"
    ):
        runner.run(prompts(["react"]), sampling, policy, tokenizer.pad_token_id)
    with pytest.raises(UnknownAgentError, match="interaction None.*this run has: none"):
        runner.run(prompts(["user_sim"]), sampling, policy, tokenizer.pad_token_id)


def test_tool_rewards_and_drift_reach_the_batch(tokenizer: Any) -> None:
    """A model answering wrong after the tool still gets its turns recorded; drift stays 0."""
    mt = MultiTurnConfig(enable=True, tools=("calculator",))
    runner = AgentRunner.from_config(mt, tokenizer, max_response_tokens=96)
    policy = PromptReadingPolicy(tokenizer, wrong_answer_for="12 * 34")
    batch = runner.run(
        prompts(["tool_agent", "tool_agent"]), SamplingParams(n=1, max_new_tokens=96), policy, 0
    )
    finals = [info["final_message"] for info in batch.non_tensors["extra_info"]]
    assert finals == ["442027", "7"]


class BinarySearchPlayer:
    """Plays the guessing game from its prompt: narrows [low, high] by the user's Higher./Lower. replies."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer

    async def __call__(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[GenerationOutput]:
        text = self.tok.decode(list(prompt_ids), skip_special_tokens=False)
        low, high = (int(x) for x in re.findall(r"from (\d+) to (\d+)", text)[0])
        turns = re.findall(r"<\|im_start\|>assistant\n(\d+)<\|im_end\|>\n<\|im_start\|>user\n(\w+)\.", text)
        for guess, reply in turns:
            low, high = (int(guess) + 1, high) if reply == "Higher" else (low, int(guess) - 1)
        ids = self.tok.encode(f"{(low + high) // 2}<|im_end|>", add_special_tokens=False)
        return [GenerationOutput("r", 0, tuple(ids), tuple(-0.1 for _ in ids), FinishReason.STOP)]


def test_user_sim_rows_play_the_guessing_game(tokenizer: Any) -> None:
    from quartet.agents.interactions.guessing import binary_search_transcript

    mt = MultiTurnConfig(
        enable=True, interactions=("guessing_game",), max_assistant_turns=8, max_user_turns=8
    )
    runner = AgentRunner.from_config(mt, tokenizer, max_response_tokens=128)
    targets = [37, 100]
    batch = Batch(
        {
            "prompts": torch.ones(2, 3, dtype=torch.int64),
            "attention_mask": torch.ones(2, 3, dtype=torch.int64),
        },
        {
            "raw_prompt": [[{"role": "user", "content": "I picked a number from 1 to 100. Guess it."}]] * 2,
            "agent_name": ["user_sim"] * 2,
            "extra_info": [
                {"interaction_kwargs": {"name": "guessing_game", "target": t, "low": 1, "high": 100}}
                for t in targets
            ],
        },
    )
    out = runner.run(batch, SamplingParams(n=1, max_new_tokens=128, seed=1), BinarySearchPlayer(tokenizer), 0)
    for row, target in enumerate(targets):
        info, metrics = out.non_tensors["extra_info"][row], out.non_tensors["agent_metrics"][row]
        guesses = binary_search_transcript(target, 1, 100)  # the interaction's own independent record
        assert info["env_reward"] == 1.0 and info["final_message"] == str(target)
        assert info["num_turns"] == len(guesses) and metrics["agent/user_turns"] == len(guesses) - 1
        assert metrics["interaction/guesses"] == len(guesses) and metrics["agent/token_drift"] == 0
        assert out.non_tensors["finish_reason"][row] == "interaction_done"
        # user turns are the environment's: mask 0, and they say Higher./Lower. as the game requires
        length = int(out["attention_mask"][row, out["prompts"].shape[1] :].sum())
        env_text = tokenizer.decode(out["responses"][row][:length][out["response_mask"][row][:length] == 0])
        expected = ["Higher." if g < target else "Lower." for g in guesses[:-1]]
        assert re.findall(r"(Higher\.|Lower\.)", env_text) == expected
