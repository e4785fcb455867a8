"""The prompt of an image request for vLLM: `multi_modal_data={"image": [...]}` with the prompt's tokens.

vLLM runs the model's own processor on the images and expands each image's placeholder itself, so it gets
the prompt with ONE `<|image_pad|>` per image (as the chat template wrote it, verl's `raw_prompt_ids`),
not the expanded run the built-in engine and the trainer read. The sampled tokens come back as they are:
the response does not depend on how the prompt's placeholders were written.
"""

from __future__ import annotations

import io
from typing import Any

from quartet.rollout.types import GenerationRequest

__all__ = ["collapse_image_runs", "vllm_prompt"]


def collapse_image_runs(ids: list[int], image_token_id: int) -> list[int]:
    """`ids` with every run of consecutive image tokens written as one (one placeholder per image)."""
    out: list[int] = []
    for token in ids:
        if token == image_token_id and out and out[-1] == image_token_id:
            continue
        out.append(token)
    return out


def vllm_prompt(request: GenerationRequest, image_token_id: int | None) -> dict[str, Any] | None:
    """A vLLM `TokensPrompt` for a request with images (decoded with Pillow); None for a text request."""
    mm = request.multi_modal
    if mm is None or not mm.get("images"):
        return None
    if image_token_id is None:
        raise ValueError(f"request {request.request_id} has images but the model has no image token")
    from PIL import Image

    images = [Image.open(io.BytesIO(blob)).convert("RGB") for blob in mm["images"]]
    ids = collapse_image_runs(list(request.prompt_token_ids), image_token_id)
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}
