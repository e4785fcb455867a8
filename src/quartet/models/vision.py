"""What the rollout and training engines share about Qwen2-VL style models: image features, M-RoPE positions,
and which image tokens are the prompt's.

Qwen2-VL (and Qwen2.5-VL) place an image as a run of `<|image_pad|>` tokens in the prompt, one per merged
patch; the vision tower's output replaces their embeddings. Positions are 3-D (M-RoPE): text tokens advance
(t, h, w) together, an image's tokens take their grid coordinates, and the text after an image continues
from the largest position so far. `get_rope_index` of the model computes them; a sequence's last position
then differs from its length by its `rope_delta`, and a generated token at index i sits at i + rope_delta.

The model finds image tokens by their id anywhere in `input_ids`. A response may contain `<|image_pad|>`
too (a sampled token like any other, rare for a trained model and not for a random one), which would then
be counted as an image slot. `image_token_mask` tells the model which image tokens belong to the prompt
(`guard_placeholders` installs the check once per model), so training passes read exactly the prompt's
image tokens, as the rollout engine did.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

__all__ = [
    "MultiModalInputs",
    "guard_placeholders",
    "image_features",
    "image_token_mask",
    "is_vision_module",
    "mrope_positions",
    "stack_multi_modal",
    "stand_in_image",
    "vision_model",
]

MultiModalInputs = dict[str, torch.Tensor]
"""One row's processed images: `pixel_values` [patches, C * t * p * p] and `image_grid_thw` [images, 3]."""

_PROMPT_IMAGE_MASK: ContextVar[tuple[torch.Tensor, bool] | None] = ContextVar(
    "quartet_prompt_image_mask", default=None
)


def vision_model(model: nn.Module) -> Any | None:
    """The multimodal trunk (`Qwen2VLModel`: `visual`, `language_model`, `get_rope_index`) inside a
    transformers model or a peft wrapper of one; None for a text-only model."""
    unwrap = getattr(model, "get_base_model", None)
    inner: Any = unwrap() if callable(unwrap) else model
    trunk = getattr(inner, "model", None)
    if trunk is not None and hasattr(trunk, "visual") and hasattr(trunk, "get_rope_index"):
        return trunk
    return None


def is_vision_module(model: nn.Module) -> bool:
    """True for a Qwen2-VL style model (it reads images)."""
    return vision_model(model) is not None


def stand_in_image(trunk: Any) -> MultiModalInputs:
    """The smallest image the vision tower takes (one merged patch of zeros), for a forward without images
    on a rank whose peers have some: under FSDP every rank must run the same sharded blocks."""
    vision = trunk.config.vision_config
    merge = int(vision.spatial_merge_size)
    width = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    return {
        "pixel_values": torch.zeros(merge * merge, width),
        "image_grid_thw": torch.tensor([[1, merge, merge]]),
    }


def stack_multi_modal(rows: Sequence[MultiModalInputs | None]) -> MultiModalInputs | None:
    """The images of several rows, in row order, as one forward's `pixel_values` and `image_grid_thw`;
    None when no row has images."""
    present = [r for r in rows if r is not None]
    if not present:
        return None
    return {
        "pixel_values": torch.cat([r["pixel_values"] for r in present]),
        "image_grid_thw": torch.cat([r["image_grid_thw"] for r in present]),
    }


def image_features(trunk: Any, inputs: MultiModalInputs, dtype: torch.dtype) -> torch.Tensor:
    """The vision tower's output [image tokens, D] for `inputs`, every image's tokens in order."""
    device = trunk.language_model.embed_tokens.weight.device
    pixels = inputs["pixel_values"].to(device)
    grid = inputs["image_grid_thw"].to(device)
    out = trunk.get_image_features(pixels, grid, return_dict=True)
    return torch.cat(list(out.pooler_output)).to(dtype)


def mrope_positions(
    trunk: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_mask: torch.Tensor,
    grid: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE position ids [3, b, T] of rows `input_ids` [b, T] (0 on padding) and each row's rope delta [b].

    `image_mask` [b, T] marks the image tokens that hold the images of `grid` [images, 3] (row-major).
    """
    types = image_mask.to(torch.int32)
    positions, deltas = trunk.get_rope_index(
        input_ids,
        mm_token_type_ids=types,
        image_grid_thw=grid,
        attention_mask=attention_mask,
    )
    return positions, deltas.reshape(-1)


@contextmanager
def image_token_mask(mask: torch.Tensor | None, stand_in: bool = False) -> Iterator[None]:
    """Inside the block a guarded model (`guard_placeholders`) takes the image tokens of its next forwards
    from `mask` ([b, T] bool, True on the prompt's image tokens) instead of every `<|image_pad|>`.

    stand_in: the forward's image is a stand-in (`stand_in_image`) whose features go nowhere: `mask` is
    then all False."""
    token = _PROMPT_IMAGE_MASK.set(None if mask is None else (mask, stand_in))
    try:
        yield
    finally:
        _PROMPT_IMAGE_MASK.reset(token)


def guard_placeholders(model: nn.Module) -> None:
    """Make the model's image placeholders those of `image_token_mask` while one is set (idempotent)."""
    trunk = vision_model(model)
    if trunk is None or getattr(trunk, "_quartet_guarded", False):
        return
    original = trunk.get_placeholder_mask

    def guarded(
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor,
        image_features: torch.Tensor | None = None,
        video_features: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        given = _PROMPT_IMAGE_MASK.get()
        if given is None or image_features is None:
            result: tuple[torch.Tensor, torch.Tensor] = original(
                input_ids, inputs_embeds, image_features=image_features, video_features=video_features
            )
            return result
        mask, stand_in = given
        if mask.shape != inputs_embeds.shape[:2]:
            raise ValueError(
                f"image token mask {tuple(mask.shape)} for inputs {tuple(inputs_embeds.shape[:2])}"
            )
        count = int(mask.sum())
        if count != (0 if stand_in else image_features.shape[0]):
            raise ValueError(f"{count} prompt image tokens for {image_features.shape[0]} image features")
        image = mask.unsqueeze(-1).to(inputs_embeds.device)
        return image, torch.zeros_like(image)

    trunk.get_placeholder_mask = guarded
    trunk._quartet_guarded = True
