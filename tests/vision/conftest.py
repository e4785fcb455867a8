"""The tiny Qwen2-VL and Pillow-drawn images for the vision tests (built once per session)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest


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


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-VL with its tokenizer and image processor, saved with save_pretrained."""
    from quartet.config import TinyModelConfig
    from quartet.config.model import TinyArch
    from quartet.models.tiny import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(arch=TinyArch.QWEN2_VL), tmp_path_factory.mktemp("vlm"))
