"""The built-in `zoom` tool: the crop it shows is the box of the prompt's image enlarged (checked against
numpy), and every bad call is an error result for the model, never an exception."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from quartet.agents.runner import build_tools
from quartet.agents.tools.executor import run_tool_calls
from quartet.agents.tools.parsing import ToolCall
from quartet.agents.tools.zoom import ZoomTool
from quartet.config.rollout import MultiTurnConfig


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, "PNG")
    return out.getvalue()


def _pixels(blob: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(blob)) as image:
        return np.asarray(image.convert("RGB"))


def _picture() -> np.ndarray:
    """An 84 x 84 picture whose every pixel differs from its neighbours (a crop off by one would show)."""
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(84, 84, 3), dtype=np.uint8)


def _call(tool: ZoomTool, images: list[bytes] | None, arguments: dict[str, Any]) -> Any:
    async def go() -> Any:
        instance = await tool.create(images=images) if images is not None else await tool.create()
        results, metrics = await run_tool_calls(
            [ToolCall("zoom", arguments)], {"zoom": tool}, {"zoom": instance}, 5.0, 512
        )
        await tool.release(instance)
        return results[0], metrics

    return asyncio.run(go())


def test_zoom_shows_the_box_enlarged() -> None:
    picture = _picture()
    tool = ZoomTool()
    result, metrics = _call(tool, [_png(picture)], {"x0": 28, "y0": 0, "x1": 56, "y1": 28})
    assert result.error is None and metrics["tool/failed"] == 0 and len(result.images) == 1
    expected = np.repeat(np.repeat(picture[0:28, 28:56], 2, axis=0), 2, axis=1)
    assert np.array_equal(_pixels(result.images[0]), expected)
    assert result.text == "image 0, box (28, 0)-(56, 28), enlarged 2x"
    # a second image by index, and the longer side capped at max_side
    other = _picture()[::-1].copy()
    capped = ZoomTool(scale=4, max_side=100)
    result, _ = _call(
        capped, [_png(picture), _png(other)], {"x0": 0, "y0": 0, "x1": 50, "y1": 25, "image": 1}
    )
    assert _pixels(result.images[0]).shape == (50, 100, 3) and "enlarged 2x" in result.text


@pytest.mark.parametrize(
    ("images", "arguments", "says"),
    [
        (None, {"x0": 0, "y0": 0, "x1": 10, "y1": 10}, "no image"),
        ("empty", {"x0": 0, "y0": 0, "x1": 10, "y1": 10}, "no image"),
        ("one", {"x0": 0, "y0": 0, "x1": 10, "y1": 10, "image": 1}, "image 1 does not exist"),
        ("one", {"x0": 0, "y0": 0, "x1": 85, "y1": 10}, "not inside image 0 of 84 x 84"),
        ("one", {"x0": 10, "y0": 0, "x1": 10, "y1": 10}, "x0 < x1"),
        ("one", {"x0": 20, "y0": 30, "x1": 10, "y1": 10}, "x0 < x1"),
        ("one", {"x0": -1, "y0": 0, "x1": 10, "y1": 10}, "invalid arguments"),
        ("one", {"x0": 0, "y0": 0, "x1": 10}, "invalid arguments"),
        ("one", {"x0": 0, "y0": 0, "x1": 10, "y1": 10, "zoom": 3}, "invalid arguments"),
        ("one", {"x0": "a", "y0": 0, "x1": 10, "y1": 10}, "invalid arguments"),
        ("one", {"x0": 1.5, "y0": 0, "x1": 10, "y1": 10}, "invalid arguments"),
        ("broken", {"x0": 0, "y0": 0, "x1": 10, "y1": 10}, "image 0 cannot be read"),
    ],
)
def test_bad_calls_are_answered(images: Any, arguments: dict[str, Any], says: str) -> None:
    blobs = {"one": [_png(_picture())], "broken": [b"not a picture"], "empty": []}.get(images, images)
    result, metrics = _call(ZoomTool(), blobs, arguments)
    assert result.error is not None and says in result.text and not result.images
    assert metrics["tool/calls"] == 1 and metrics.get("tool/exceptions", 0) == 0


def test_zoom_is_a_built_in_tool_that_wants_images() -> None:
    tools = build_tools(MultiTurnConfig(enable=True, tools=("zoom",)))
    assert list(tools) == ["zoom"] and tools["zoom"].wants_images
    with pytest.raises(ValueError, match="scale"):
        ZoomTool(scale=0)
