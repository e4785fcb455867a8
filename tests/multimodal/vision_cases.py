"""Pillow-drawn images and rows in verl's multimodal layout, and a plain transformers forward of a value
model, for the vision tests."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from quartet.core.batch import Batch


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


def without_sampled_pads(batch: Batch, image_id: int) -> Batch:
    """`batch` with every sampled `<|image_pad|>` of a response replaced by a text token, so a plain
    transformers forward (which reads every image token as an image slot) can be compared with it."""
    responses = batch["responses"].clone()
    responses[responses == image_id] = image_id - 1
    return Batch({**batch.tensors, "responses": responses}, dict(batch.non_tensors), batch.meta)


def plain_values(folder: Path, batch: Batch) -> list[torch.Tensor]:
    """Each row's values of its response tokens from the value model in `folder` loaded by plain
    `AutoModelForTokenClassification.from_pretrained`, one unpadded row at a time with its own images; the
    model computes the M-RoPE positions itself."""
    from transformers import AutoModelForTokenClassification

    import quartet.models.vision_value  # noqa: F401  # registers the VLM value classes

    model: Any = AutoModelForTokenClassification.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    assert type(model).__name__.endswith("ValueModel")
    image_id = int(model.config.image_token_id)
    p_len = batch["prompts"].shape[1]
    out = []
    for i in range(len(batch)):
        real = batch["attention_mask"][i] != 0
        ids = torch.cat([batch["prompts"][i], batch["responses"][i]])[real].unsqueeze(0)
        prompt_len, response_len = int(real[:p_len].sum()), int(real[p_len:].sum())
        images = batch.non_tensors["multi_modal_inputs"][i] or {}
        with torch.no_grad():
            values = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                mm_token_type_ids=(ids == image_id).int(),
                **images,
            ).logits[0, :, 0]
        # value[t] is the output at the position whose logits choose response token t
        out.append(values[prompt_len - 1 : prompt_len - 1 + response_len])
    return out
