"""Shared pieces of the image agent-loop tests: a parser that makes every model turn a zoom call, image rows,
and an independent reconstruction of what a trajectory's tokens must be."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from vision_cases import image_row, png

from quartet.agents.tools.parsing import ParsedTurn, ToolCall
from quartet.data.images import ImageInputs, expand_image_tokens

BOX = {"x0": 0, "y0": 0, "x1": 32, "y1": 32}
"""The box every turn zooms into (a 32 x 32 corner, shown at 64 x 64)."""


class ZoomEveryTurn:
    """A tool-call parser reading every model turn as a call to `zoom` on `BOX`: a random model never
    writes a well-formed call, and what is under test is what the loop does with the image it returns."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(text, [ToolCall("zoom", dict(BOX))])


def rows() -> list[dict[str, Any]]:
    """Two prompts, of one and two images."""
    return [
        image_row("<image>How many shapes?", [png("red")]),
        image_row("Compare <image> with <image>.", [png("blue", (100, 60)), png("green", shape="ellipse")]),
    ]


def pixels(blob: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as image:
        return np.asarray(image.convert("RGB"))


def zoomed(blob: bytes) -> np.ndarray:
    """`BOX` of the image, each pixel repeated 2 x 2 (nearest-neighbour enlargement), from numpy alone."""
    crop = pixels(blob)[BOX["y0"] : BOX["y1"], BOX["x0"] : BOX["x1"]]
    return np.repeat(np.repeat(crop, 2, axis=0), 2, axis=1)


def tool_turn_ids(tokenizer: Any, images: ImageInputs, ended: bool) -> list[int]:
    """The tokens after a model turn that zoomed: the template's tool message with its text and image,
    the next assistant header, the image token expanded (the data loader's `expand_image_tokens`)."""
    text = f"image 0, box ({BOX['x0']}, {BOX['y0']})-({BOX['x1']}, {BOX['y1']}), enlarged 2x"
    message = {"role": "tool", "content": [{"type": "text", "text": text}, {"type": "image"}]}
    rendered = tokenizer.apply_chat_template([message], add_generation_prompt=True, tokenize=False)
    prefix = "" if ended else "<|im_end|>"
    ids = tokenizer.encode(prefix + "\n" + rendered, add_special_tokens=False)
    side = 2 * (BOX["x1"] - BOX["x0"])
    return expand_image_tokens(ids, images.image_token_id, [images.tokens_per_image(side, side)], "tool")
