"""Pillow-drawn images and rows in verl's multimodal layout, for the vision tests."""

from __future__ import annotations

import io
from typing import Any


def png(color: str, size: tuple[int, int] = (64, 64), shape: str = "rectangle") -> bytes:
    """A PNG of a `color` shape on white, drawn with Pillow."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    box = (8, 8, size[0] - 16, size[1] - 16)
    draw.ellipse(box, fill=color) if shape == "ellipse" else draw.rectangle(box, fill=color)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def image_row(text: str, images: list[Any], answer: str = "red") -> dict[str, Any]:
    """A row in verl's multimodal layout (data_source 'arithmetic' so the built-in rules score it)."""
    return {
        "prompt": [{"role": "user", "content": text}],
        "data_source": "arithmetic",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "images": images,
    }
