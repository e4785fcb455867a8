"""On-policy distillation in a tool loop: only model-written tokens get the teacher's signal. A scripted
conversation with a real calculator call (tool turn between two model turns) becomes the rollout batch;
the distillation advantage is non-zero on exactly the model's tokens and zero on the tool's, and with a
discount the sum runs over model tokens only, skipping the tool turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from quartet.agents.batch import trajectories_to_batch
from quartet.agents.tool_loop import LoopLimits, run_tool_loop
from quartet.agents.tools.calculator import CalculatorTool
from quartet.agents.tools.parsing import get_parser
from quartet.agents.trajectory import ChatRenderer
from quartet.core.batch import Batch
from quartet.core.distill import reverse_kl_advantages
from quartet.rollout.types import FinishReason, GenerationOutput

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'


def test_only_model_tokens_get_the_teacher_signal(tiny_model_dir: Path) -> None:
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    turns = [CALL, "It is 391."]

    async def policy(prompt_ids: list[int], budget: int, /, **_: object) -> GenerationOutput:
        ids = renderer.encode(turns.pop(0) + renderer.end_of_turn)
        return GenerationOutput("r", 0, tuple(ids), tuple([-0.3] * len(ids)), FinishReason.STOP)

    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    tools = {"calculator": CalculatorTool()}
    limits = LoopLimits(max_assistant_turns=3, max_response_tokens=256)
    t = asyncio.run(run_tool_loop(messages, policy, renderer, get_parser("hermes"), tools, limits))
    assert [s.role for s in t.turns] == ["assistant", "tool", "assistant"]
    prompts = Batch(
        {"prompts": torch.zeros(1, 4, dtype=torch.int64)}, {"raw": np.array([None], dtype=object)}
    )
    batch = trajectories_to_batch(prompts, [t], 1, 0, 256)
    mask = batch["response_mask"]
    teacher = torch.full_like(batch["rollout_logprobs"], -1.0)  # the teacher finds every token likelier

    advantages = reverse_kl_advantages(batch["rollout_logprobs"], teacher, mask)
    model = mask[0].bool()
    tool = t.turns[1]
    assert torch.all(advantages[0, model] == torch.tensor(-(-0.3 - -1.0)))
    assert torch.all(advantages[0, tool.start : tool.stop] == 0)  # the calculator's tokens: no signal
    discounted = reverse_kl_advantages(batch["rollout_logprobs"], teacher, mask, gamma=1.0)
    model_tokens = int(model.sum())
    first, last = t.turns[0], t.turns[2]
    # with gamma 1 a token's advantage sums the reverse KL of every model token from it on, the tool's skipped
    assert float(discounted[0, first.start]) == pytest.approx(-0.7 * model_tokens, rel=1e-5)
    assert float(discounted[0, last.start]) == pytest.approx(-0.7 * (last.stop - last.start), rel=1e-5)
