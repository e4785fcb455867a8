"""The tool loop, token by token: a scripted policy (so the calls are known) over the tiny model's real
tokenizer and template, the real calculator tool, a scripted tool; then the real tiny model through the
built-in engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from quartet.agents.tool_loop import LoopLimits, run_tool_loop
from quartet.agents.tools.base import Tool, ToolResult
from quartet.agents.tools.calculator import CalculatorTool
from quartet.agents.tools.parsing import get_parser
from quartet.agents.trajectory import ChatRenderer, token_drift
from quartet.rollout.types import FinishReason, GenerationOutput, GenerationRequest, SamplingParams

GOOD = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'
UNKNOWN = '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'


class EchoTool(Tool):
    """Says back its text; counts its instances so the test sees create/release."""

    schema = {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "echo text",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    }

    def __init__(self) -> None:
        super().__init__(schema=self.schema)
        self.live: set[str] = set()

    async def create(self, instance_id: str | None = None, **tools_kwargs: Any) -> str:
        iid = instance_id or f"echo-{len(self.live)}"
        self.live.add(iid)
        return iid

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(text=f"echo: {arguments['text']}")

    async def release(self, instance_id: str) -> None:
        self.live.discard(instance_id)


class ScriptedPolicy:
    """Returns the next scripted turn's tokens (end-of-turn appended), recording the prompts it was given."""

    def __init__(self, renderer: ChatRenderer, turns: list[str]) -> None:
        self.renderer, self.turns, self.prompts = renderer, list(turns), []
        self.sampled: list[list[int]] = []

    async def __call__(self, prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
        self.prompts.append(list(prompt_ids))
        ids = self.renderer.encode(self.turns.pop(0) + self.renderer.end_of_turn)[:max_new_tokens]
        self.sampled.append(ids)
        stop = (
            FinishReason.STOP
            if ids[-1] == self.renderer.encode(self.renderer.end_of_turn)[0]
            else FinishReason.LENGTH
        )
        return GenerationOutput("r", 0, tuple(ids), tuple(-0.1 * (i + 1) for i in range(len(ids))), stop)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_tool_loop_masks_ids_errors_and_drift(renderer: ChatRenderer) -> None:
    echo = EchoTool()
    tools = {"calculator": CalculatorTool(), "echo": echo}
    policy = ScriptedPolicy(renderer, [GOOD + UNKNOWN, ECHO + "<tool_call>{bad json", "The answer is 391."])
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    limits = LoopLimits(max_assistant_turns=5, max_response_tokens=1024)
    traj = asyncio.run(run_tool_loop(messages, policy, renderer, get_parser("hermes"), tools, limits))

    assert traj.finish_reason == "no_tool_call" and traj.assistant_turns == 3
    # each model turn's prompt was exactly everything before it: history never re-tokenized
    for turn, prompt in zip([t for t in traj.turns if t.role == "assistant"], policy.prompts, strict=True):
        assert prompt == traj.prompt_ids + traj.response_ids[: turn.start]
    # mask 1 exactly on the sampled tokens, and the log-probs are the policy's
    model = [i for t in traj.turns if t.role == "assistant" for i in range(t.start, t.stop)]
    assert [i for i, m in enumerate(traj.response_mask) if m] == model
    assert [traj.response_ids[i] for i in model] == [x for ids in policy.sampled for x in ids]
    assert all(traj.logprobs[i] == 0.0 for i in range(len(traj.response_ids)) if i not in set(model))
    # the tools' answers, and the errors, reached the model in the environment turns
    env_text = [
        renderer.tokenizer.decode(traj.response_ids[t.start : t.stop]) for t in traj.turns if t.role == "tool"
    ]
    assert "391" in env_text[0] and "unknown tool" in env_text[0] and "search" in env_text[0]
    assert "echo: hi" in env_text[1] and "Error" in env_text[1]
    assert traj.metrics["tool/calls"] == 3 and traj.metrics["tool/failed"] == 1
    assert traj.metrics["tool/parse_errors"] == 1
    assert not echo.live  # released
    assert token_drift(renderer, traj) == 0


def test_tool_loop_stops_at_turn_and_token_limits(renderer: ChatRenderer) -> None:
    tools = {"calculator": CalculatorTool()}
    policy = ScriptedPolicy(renderer, [GOOD] * 5)
    messages = [{"role": "user", "content": "go"}]
    traj = asyncio.run(
        run_tool_loop(
            messages,
            policy,
            renderer,
            get_parser("hermes"),
            tools,
            LoopLimits(max_assistant_turns=2, max_response_tokens=4096),
        )
    )
    assert traj.finish_reason == "max_turns" and traj.assistant_turns == 2
    policy = ScriptedPolicy(renderer, [GOOD] * 5)
    budget = 60
    traj = asyncio.run(
        run_tool_loop(
            messages,
            policy,
            renderer,
            get_parser("hermes"),
            tools,
            LoopLimits(max_assistant_turns=9, max_response_tokens=budget),
        )
    )
    assert traj.finish_reason == "max_tokens" and len(traj.response_ids) <= budget


def test_tool_loop_with_the_tiny_model_and_the_builtin_engine(
    tiny_model_dir: Path, renderer: ChatRenderer
) -> None:
    from quartet.rollout.torch.engine import TorchRolloutEngine

    engine = TorchRolloutEngine.from_pretrained(str(tiny_model_dir))
    try:

        async def generate(prompt_ids: list[int], max_new_tokens: int) -> GenerationOutput:
            sampling = SamplingParams(temperature=1.0, max_new_tokens=min(max_new_tokens, 24), seed=3)
            return (await engine.generate_one(GenerationRequest(tuple(prompt_ids), sampling)))[0]

        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        limits = LoopLimits(max_assistant_turns=2, max_response_tokens=48)
        traj = asyncio.run(
            run_tool_loop(
                messages, generate, renderer, get_parser("hermes"), {"calculator": CalculatorTool()}, limits
            )
        )
        first = traj.turns[0]
        again = engine.generate(
            [
                GenerationRequest(
                    tuple(traj.prompt_ids), SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
                )
            ]
        )
        assert traj.response_ids[first.start : first.stop] == list(
            again[0][0].token_ids
        )  # seeded: same tokens
        assert traj.response_mask[first.start : first.stop] == [1] * (first.stop - first.start)
        assert traj.finish_reason in {"no_tool_call", "max_tokens", "max_turns", "length"}
    finally:
        engine.shutdown()
