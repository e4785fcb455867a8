"""The prefill inputs of image prompts for the built-in engine: embeddings with the image features in place
of the prompt's image tokens, and the M-RoPE positions and rope deltas of Qwen2-VL (`quartet.models.vision`).

The vision tower runs once per prefill over every image of the admitted groups (each group's images in
order); decoding then needs only each sequence's rope delta (`SequenceState.rope_delta`): its next token's
position is its length plus the delta, the same in all three M-RoPE sections.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from quartet.models.vision import image_features, mrope_positions, stack_multi_modal
from quartet.rollout.types import GenerationRequest

__all__ = ["VisionPrefill", "vision_prefill"]

VisionPrefill = tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]
"""((embeddings [G, P, D], positions [3, G, P]), rope deltas [G])."""

_PIXEL_KEYS = ("pixel_values", "image_grid_thw")


def vision_prefill(
    trunk: Any, embed: Any, ids: torch.Tensor, lengths: torch.Tensor, requests: Sequence[GenerationRequest]
) -> VisionPrefill | None:
    """Prefill inputs of right-padded prompts `ids` [G, P] (real `lengths` [G]) of `requests`, or None when
    none carries images (text prompts keep the plain path, positions 0..P-1).

    trunk: the model's multimodal trunk (`models.vision.vision_model`); embed: its token embedding.
    A request's image slots are its prompt's image tokens, or where its `multi_modal["image_mask"]` (one
    bool per prompt token) says: a multi-turn history whose earlier turns sampled an `<|image_pad|>` marks
    the environment's image tokens only. Raises ValueError when the slots do not match the images.
    """
    rows = [
        {k: r.multi_modal[k] for k in _PIXEL_KEYS} if r.multi_modal is not None else None for r in requests
    ]
    stacked = stack_multi_modal(rows)
    if stacked is None:
        return None
    valid = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)
    image_mask = (ids == int(trunk.config.image_token_id)) & valid
    for i, request in enumerate(requests):
        given = request.multi_modal.get("image_mask") if request.multi_modal is not None else None
        if given is not None:
            slots = torch.as_tensor(given, dtype=torch.bool, device=ids.device)
            image_mask[i, : slots.shape[0]] &= slots
    h = embed(ids)
    features = image_features(trunk, stacked, h.dtype)
    if features.shape[0] != int(image_mask.sum()):
        raise ValueError(
            f"the prompts hold {int(image_mask.sum())} image tokens for {features.shape[0]} image features"
        )
    h = h.masked_scatter(image_mask.unsqueeze(-1), features)
    grid = stacked["image_grid_thw"].to(ids.device)
    positions, deltas = mrope_positions(trunk, ids, valid.to(torch.int64), image_mask, grid)
    return (h, positions), deltas
