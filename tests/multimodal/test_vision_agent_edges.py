"""What the agent loop does with images it cannot use: an unreadable tool image is an error for the model,
image tokens written in the environment's text stay text, an image turn past the response budget ends
the trajectory whole, and a text model drops a tool's images saying so (a scripted policy, no engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from vision_cases import png

from quartet.agents.images import ImageKit, TrajectoryImages
from quartet.agents.tool_loop import LoopLimits, run_tool_loop
from quartet.agents.tools.base import Tool, ToolResult
from quartet.agents.tools.parsing import ParsedTurn, ToolCall
from quartet.agents.trajectory import ChatRenderer
from quartet.models.loading import load_image_processor, load_tokenizer
from quartet.rollout.types import FinishReason, GenerationOutput


class Shower(Tool):
    """Answers with `text` and `images`."""

    schema = {"type": "function", "function": {"name": "show", "parameters": {"type": "object"}}}

    def __init__(self, text: str, images: Sequence[bytes]) -> None:
        super().__init__()
        self.text, self.images = text, tuple(images)

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(self.text, images=self.images)


class CallEveryTurn:
    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(text, [ToolCall("show", {})])


def _run(folder: Path, tool: Shower, vision: bool, max_tokens: int = 200, turn: Sequence[str] = ()) -> Any:
    """One trajectory of two model turns, each `turn` (tokens by name; two plain ids by default)."""
    tokenizer = load_tokenizer(folder)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    written = tuple(tokenizer.convert_tokens_to_ids(list(turn))) if turn else (5, 6)
    seen: list[dict[str, Any] | None] = []

    async def generate(
        ids: list[int], budget: int, multi_modal: dict[str, Any] | None = None
    ) -> GenerationOutput:
        seen.append(multi_modal)
        logprobs = (-1.0,) * (len(written) + 1)
        return GenerationOutput("r", 0, (*written, eot), logprobs, FinishReason.STOP)

    images = None
    if vision:
        images = TrajectoryImages(ImageKit.of(load_image_processor(folder), tokenizer))
        images.add([png("red")])
    messages = [{"role": "user", "content": "<image>Look." if vision else "Look."}]
    limits = LoopLimits(max_assistant_turns=2, max_response_tokens=max_tokens)
    renderer = ChatRenderer(tokenizer, [tool.schema])
    trajectory = asyncio.run(
        run_tool_loop(messages, generate, renderer, CallEveryTurn(), {"show": tool}, limits, images=images)
    )
    return trajectory, seen, tokenizer


def test_an_unreadable_tool_image_is_an_error(tiny_vlm_dir: Path) -> None:
    trajectory, seen, tokenizer = _run(tiny_vlm_dir, Shower("here", [b"not an image"]), vision=True)
    assert trajectory.metrics["tool/bad_images"] == 1 and len(trajectory.images.blobs) == 1
    assert "cannot be read" in tokenizer.decode(trajectory.response_ids)
    assert all(int(m["image_grid_thw"].shape[0]) == 1 for m in seen if m is not None)


def test_pad_tokens_in_tool_text_stay_text(tiny_vlm_dir: Path) -> None:
    tool = Shower("sneaky <|image_pad|><|video_pad|>", [png("blue")])
    trajectory, seen, tokenizer = _run(tiny_vlm_dir, tool, vision=True)
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    kit = trajectory.images
    assert len(kit.blobs) == 2  # the prompt's, the tool's (its second call hit the turn limit)
    slots = [t == pad for t in trajectory.prompt_ids + trajectory.response_ids]
    assert sum(slots) == sum(kit.counts)  # exactly the images' tokens: the text's pad stayed text
    assert "sneaky <image_pad><video_pad>" in tokenizer.decode(trajectory.response_ids)
    assert sum(seen[-1]["image_mask"]) == sum(kit.counts)


def test_an_image_turn_past_the_budget_ends_the_trajectory(tiny_vlm_dir: Path) -> None:
    trajectory, _, _ = _run(
        tiny_vlm_dir, Shower("big", [png("blue", (112, 112))]), vision=True, max_tokens=20
    )
    assert trajectory.finish_reason == "max_tokens" and len(trajectory.images.blobs) == 1
    assert trajectory.response_mask == [1, 1, 1]  # the model's turn only: no image cut in half


def test_a_text_model_drops_tool_images(tiny_vlm_dir: Path) -> None:
    trajectory, seen, tokenizer = _run(tiny_vlm_dir, Shower("here", [png("red")]), vision=False)
    assert trajectory.metrics["tool/images_dropped"] == 1 and trajectory.images is None
    assert "1 image(s) not shown" in tokenizer.decode(trajectory.response_ids) and seen == [None, None]


def test_rerender_refuses_images(tiny_vlm_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_vlm_dir)
    images = TrajectoryImages(ImageKit.of(load_image_processor(tiny_vlm_dir), tokenizer))
    with pytest.raises(ValueError, match="template_mode: rerender"):
        asyncio.run(
            run_tool_loop(
                [],
                None,
                ChatRenderer(tokenizer),
                CallEveryTurn(),
                {},
                LoopLimits(),
                rerender=True,
                images=images,
            )  # type: ignore[arg-type]
        )


def test_a_sampled_pad_is_no_slot(tiny_vlm_dir: Path) -> None:
    """The model writes `<|image_pad|>` in each turn: the requests' slots are the images' tokens only, and
    the server's check (which the engine's prefill relies on) takes them."""
    from quartet.models.loading import load_causal_lm
    from quartet.serving.images import check_multi_modal, vision_spec

    turn = ["<|image_pad|>", "<|image_pad|>"]
    trajectory, seen, tokenizer = _run(tiny_vlm_dir, Shower("look", [png("blue")]), vision=True, turn=turn)
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    ids = trajectory.prompt_ids + trajectory.response_ids
    prompt = len(trajectory.prompt_ids)
    assert ids.count(pad) == sum(trajectory.images.counts) + 4  # two sampled pads in each of two turns
    spec = vision_spec(type("Engine", (), {"model": load_causal_lm(tiny_vlm_dir)})())
    second = prompt + trajectory.turns[2].start  # the second model turn's prompt: all but its own tokens
    for request, length in zip(seen, (prompt, second), strict=True):
        assert request is not None and len(request["image_mask"]) == length
        written = [prompt + i for i, m in enumerate(trajectory.response_mask) if m and prompt + i < length]
        assert len(written) == (0 if length == prompt else 3)  # the first turn's 2 pads and end of turn
        assert not any(request["image_mask"][i] for i in written)
        shown = int(request["image_grid_thw"].shape[0])
        assert sum(request["image_mask"]) == sum(trajectory.images.counts[:shown])
        check_multi_modal(ids[:length], request, spec)  # raises on any mismatch
