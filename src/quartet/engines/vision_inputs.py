"""The image inputs of a micro-batch for a vision-language model's training passes (`models.vision`).

A row's images travel with it in the batch's `multi_modal_inputs` column (one object per row), so any
micro-batching, reordering or split across ranks keeps them together. For the rows of one micro-batch the
model gets their images stacked in row order, the M-RoPE positions [3, b, T] of the trimmed inputs from the
model's own `get_rope_index`, and the mask of the image slots: the image tokens the model did not write,
those of the prompt and of later turns the environment added (a tool's image, response_mask 0). A sampled
`<|image_pad|>` (response_mask 1) stays a plain token, as it was for the rollout engine. A row's
`multi_modal_inputs` then hold all its images in the order they appear.

Under FSDP every rank must run the same sharded modules in every forward (each runs their all-gathers), so
a sharded engine gives a micro-batch without images a stand-in image whose features go nowhere
(`models.vision.stand_in_image`); they stay in the graph, so the tower's gradient collectives run too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from quartet.core.batch import Batch
from quartet.engines.inputs import ModelInputs
from quartet.models.vision import mrope_positions, stack_multi_modal, stand_in_image, vision_model

__all__ = ["NO_VISION", "VisionCall", "packed_vision", "vision_call"]

VisionCall = tuple[dict[str, Any], torch.Tensor | None, bool]
"""Extra keyword arguments of the model's forward, the prompt's image-token mask [b, T] (or None), and
whether the image is a stand-in."""

NO_VISION: VisionCall = ({}, None, False)


def vision_call(
    module: nn.Module, mb: Batch, inputs: ModelInputs, device: torch.device, sharded: bool = False
) -> VisionCall:
    """Forward kwargs (`pixel_values`, `image_grid_thw`, 3-D `position_ids`) of micro-batch `mb` whose
    trimmed inputs are `inputs`; nothing for a text-only model, or for a micro-batch without images unless
    the engine is `sharded` (then a stand-in image)."""
    trunk = vision_model(module)
    rows = mb.non_tensors.get("multi_modal_inputs")
    if trunk is None:
        if rows is not None and any(r is not None for r in rows):
            raise ValueError(
                "the micro-batch holds images but this model reads text only, so it would score the rows "
                "without them: a critic of a vision-language policy must be one too (leave "
                "critic.model_path empty to start it from the policy, or name a Qwen2-VL / Qwen2.5-VL folder)"
            )
        return NO_VISION
    stacked = stack_multi_modal(list(rows)) if rows is not None else None
    ids, mask = inputs.input_ids, inputs.attention_mask
    if stacked is None:
        if not sharded:
            return NO_VISION
        stand_in = stand_in_image(trunk)
        kwargs = {k: v.to(device) for k, v in stand_in.items()}
        return kwargs, torch.zeros(ids.shape, dtype=torch.bool, device=device), True
    width = inputs.response_width
    image_mask = (ids == int(trunk.config.image_token_id)) & (mask != 0)
    written = mb["response_mask"][:, :width].to(image_mask.device) != 0  # tokens the model sampled
    image_mask[:, ids.shape[1] - width :] &= ~written
    grid = stacked["image_grid_thw"]
    positions, _ = mrope_positions(trunk, ids, mask, image_mask, grid)
    kwargs = {
        "pixel_values": stacked["pixel_values"].to(device),
        "image_grid_thw": grid.to(device),
        "position_ids": positions.to(device),
    }
    return kwargs, image_mask.to(device), False


def packed_vision(vision: VisionCall, attention_mask: torch.Tensor) -> VisionCall:
    """`vision` of a padded micro-batch for the same rows packed into one sequence (`engines.packing`):
    positions [3, b, T] -> [3, 1, N] and the image-slot mask [b, T] -> [1, N], real tokens only."""
    kwargs, mask, stand_in = vision
    if mask is None:
        return vision
    real = attention_mask.to(mask.device) != 0
    out = dict(kwargs)
    if "position_ids" in kwargs:
        out["position_ids"] = kwargs["position_ids"][:, real].unsqueeze(1)
    return out, mask[real].unsqueeze(0), stand_in
