"""The step deadline of the agent loops (one slow conversation cannot hold the step: cut, counted, masked)
and the turn rewards a tool gives single model turns (placed on each turn's last token for the trainer).

The policy is scripted as in test_agent_runner: a calculator call on the question's expression, then the
tool's result as the answer. A "slow" row's second turn never comes back in time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from quartet.agents.batch import agent_batch_metrics
from quartet.agents.runner import AgentRunner
from quartet.agents.tools.calculator import CalculatorTool
from quartet.config.rollout import MultiTurnConfig
from quartet.core.batch import Batch
from quartet.rollout.types import FinishReason, GenerationOutput, SamplingParams

FAST, SLOW = "What is 12 * 34 + 5?", "What is 482 * 917 + 33?"


class ScriptedPolicy:
    """Tool call first, the tool's result after; the SLOW question's answer turn hangs (until cancelled)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.cancelled = 0

    async def __call__(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[GenerationOutput]:
        text = self.tok.decode(list(prompt_ids), skip_special_tokens=False)
        last_tool = text.rfind("<|im_start|>tool\n")
        if last_tool < 0:
            expression = re.findall(r"What is (.+)\?", text)[-1]
            call = {"name": "calculator", "arguments": {"expression": expression}}
            reply = f"<tool_call>{json.dumps(call)}</tool_call>"
        else:
            if SLOW in text:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    self.cancelled += 1  # the engine would abort the request here
                    raise
            reply = text[last_tool:].split("\n")[1].removesuffix("<|im_end|>")
        ids = self.tok.encode(reply + "<|im_end|>", add_special_tokens=False)
        return [GenerationOutput("r", 0, tuple(ids), tuple(-0.5 for _ in ids), FinishReason.STOP)]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _prompts(questions: list[str]) -> Batch:
    rows = len(questions)
    return Batch(
        {
            "prompts": torch.ones(rows, 3, dtype=torch.int64),
            "attention_mask": torch.ones(rows, 3, dtype=torch.int64),
        },
        {
            "raw_prompt": [[{"role": "user", "content": q}] for q in questions],
            "agent_name": ["tool_agent"] * rows,
            "extra_info": [{"index": i} for i in range(rows)],
        },
    )


def test_the_deadline_cuts_the_slow_conversation_keeps_its_first_turn_and_counts_it(tokenizer: Any) -> None:
    mt = MultiTurnConfig(enable=True, tools=("calculator",), step_deadline_s=1.0)
    runner = AgentRunner.from_config(mt, tokenizer, max_response_tokens=96)
    policy = ScriptedPolicy(tokenizer)
    sampling = SamplingParams(temperature=1.0, n=2, max_new_tokens=96, seed=1)
    batch = runner.run(_prompts([FAST, SLOW]), sampling, policy, pad_token_id=0)

    reasons = list(batch.non_tensors["finish_reason"])
    assert reasons == ["no_tool_call", "no_tool_call", "deadline", "deadline"]
    assert policy.cancelled == 2  # both slow generations were cancelled at the deadline, not left running
    metrics = agent_batch_metrics(batch)
    assert metrics["agent/deadline_cut/total"] == 2.0 and metrics["agent/finish/deadline"] == 0.5

    for row in (2, 3):  # cut: the tool call turn (model), the tool's result (environment), nothing after
        spans = batch.non_tensors["turn_spans"][row]
        assert [role for role, _, _ in spans] == ["assistant", "tool"]
        (_, a0, b0), (_, a1, b1) = spans
        mask = batch["response_mask"][row]
        assert mask[a0:b0].tolist() == [1] * (b0 - a0) and mask[a1:b1].tolist() == [0] * (b1 - a1)
        width = batch["prompts"].shape[1]
        assert int(mask.sum()) == b0 - a0 and int(batch["attention_mask"][row, width:].sum()) == b1
        assert batch.non_tensors["extra_info"][row]["num_turns"] == 1
        call = tokenizer.decode(batch["responses"][row, a0:b0].tolist(), skip_special_tokens=False)
        assert call.startswith("<tool_call>") and "482 * 917 + 33" in call
    for row in (0, 1):  # finished in time: both model turns trained
        roles = [role for role, _, _ in batch.non_tensors["turn_spans"][row]]
        assert roles == ["assistant", "tool", "assistant"]
        assert batch.non_tensors["extra_info"][row]["final_message"] == str(12 * 34 + 5)


def test_no_deadline_waits_for_every_conversation(tokenizer: Any) -> None:
    mt = MultiTurnConfig(enable=True, tools=("calculator",))
    runner = AgentRunner.from_config(mt, tokenizer, max_response_tokens=96)
    policy = ScriptedPolicy(tokenizer)
    sampling = SamplingParams(temperature=1.0, n=1, max_new_tokens=96, seed=1)

    async def bounded() -> None:
        await asyncio.wait_for(
            runner.trajectories(runner.rows(_prompts([SLOW])), sampling, policy), timeout=0.5
        )

    with pytest.raises(TimeoutError):  # the slow turn is still awaited: nothing cut it
        asyncio.run(bounded())


def test_a_tools_call_reward_lands_on_the_last_token_of_the_turn_that_made_the_call(tokenizer: Any) -> None:
    mt = MultiTurnConfig(enable=True)
    runner = AgentRunner.from_config(mt, tokenizer, max_response_tokens=96)
    runner.env.tools["calculator"] = CalculatorTool(call_reward=0.25)
    schemas = [CalculatorTool.schema]
    runner.env.renderer = type(runner.env.renderer)(tokenizer, schemas)
    sampling = SamplingParams(temperature=1.0, n=1, max_new_tokens=96, seed=1)
    batch = runner.run(_prompts([FAST]), sampling, ScriptedPolicy(tokenizer), pad_token_id=0)

    spans = batch.non_tensors["turn_spans"][0]
    (_, a0, b0), _, (_, a2, b2) = spans
    expected = torch.zeros_like(batch["turn_rewards"][0])
    expected[b0 - 1] = 0.25  # the call's turn; the answer turn made no call and earns nothing
    assert torch.equal(batch["turn_rewards"][0], expected)
    assert agent_batch_metrics(batch)["agent/turn_reward/mean"] == pytest.approx(0.25)


class _NaNRewardCalculator(CalculatorTool):
    """A tool whose call reward is broken: NaN."""

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> Any:
        result = await super().execute(instance_id, arguments)
        return dataclasses.replace(result, reward=float("nan"))


def test_a_non_finite_turn_reward_is_counted_and_never_summed(tokenizer: Any) -> None:
    runner = AgentRunner.from_config(MultiTurnConfig(enable=True), tokenizer, max_response_tokens=96)
    runner.env.tools["calculator"] = _NaNRewardCalculator()
    runner.env.renderer = type(runner.env.renderer)(tokenizer, [CalculatorTool.schema])
    sampling = SamplingParams(temperature=1.0, n=2, max_new_tokens=96, seed=1)
    batch = runner.run(_prompts([FAST]), sampling, ScriptedPolicy(tokenizer), pad_token_id=0)
    assert torch.isfinite(batch["turn_rewards"]).all() and batch["turn_rewards"].abs().sum() == 0
    metrics = agent_batch_metrics(batch)
    assert metrics["agent/bad_turn_rewards/mean"] == 1.0  # one broken reward per conversation
