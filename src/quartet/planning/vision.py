"""The vision tower's activations: what a Qwen2-VL / Qwen2.5-VL forward adds to the language model's.

An image token is `merge`^2 = 4 patches, and every patch runs through every vision block, so the tower works
on 4x as many positions as the image tokens it produces. Notation per patch: E the tower's width, I its MLP
width, H its heads, hd = E / H, W = C x t x p x p its pixel inputs (3 x 2 x 14 x 14 = 1176), f = 4 bytes,
c the compute dtype's bytes (f without autocast).

**Kept for backward** (the tower trains, `model.freeze_vision_tower: false`), counted with
`torch.autograd.graph.saved_tensors_hooks` on both architectures (tests/multimodal/test_vision_planning.py,
float32 and bfloat16 autocast):

    pixels                 c W      the patch embedding's (cast) input
    rotary tables          2 f hd   cos and sin, shared by the blocks
    block, qwen2_vl        c (11 E + 3 I) + f (H + 4)
        LayerNorm in/out twice (4 E, mean and rstd 4 f), rotated q and k (2 E), the qkv output (3 E), the
        attention output and its contiguous copy (2 E), the residual into norm2 (E), the MLP's fc1 output,
        activation and fc2 input (3 I), the attention's log-sum-exp (f H)
    block, qwen2_5_vl      f (2 E + 2 + H) + c (11 E + 4 I), and c E more under autocast
        RMSNorm keeps its float32 input and rstd (f) and its normalised and scaled outputs (c), the gated MLP
        four I-wide tensors; the rest as qwen2_vl
    merger                 qwen2_vl: c 4 E + 2 f;  qwen2_5_vl: f (E + 2) + c 4 E (its window order's
                           int64 index per image token, taken before the blocks and after the merger)

plus, under autocast, the half-precision copies of the tower's weights (c per parameter). A frozen tower
keeps nothing: no parameter needs a gradient and the pixels need none.

**Working set** of a forward that keeps nothing (a frozen tower, or a no-grad pass: old log-probs, the
reference, the critic's values, the rollout's prefill): the pixels, the rotary tables, the residual and the
widest block temporaries of all patches, c W + 2 f hd + f E + c max(7 E, E + 3 I) per patch (an estimate:
one block's tensors at a time, freed before the next). The tower runs before the language model, so this
sits on top of the embeddings only; it is counted as its own component.

How many image tokens: the plan takes every row at its longest, so every prompt token of a micro-batch may
be an image token (`data.max_prompt_length` counts them); image-heavy prompts come close to that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["VisionShape", "vision_activation_bytes", "vision_saved_bytes_per_patch", "vision_shape_of"]

F32 = 4


@dataclass(frozen=True)
class VisionShape:
    """Sizes of a Qwen2-VL style vision tower, from the model config's `vision_config`."""

    depth: int
    """Vision blocks."""
    width: int
    """E: the blocks' hidden size."""
    intermediate: int
    """I: the MLP's hidden size."""
    num_heads: int
    """H: attention heads."""
    patch_inputs: int
    """W: pixel values per patch (channels x temporal patch x patch x patch)."""
    merge: int
    """Spatial merge size: an image token is merge^2 patches."""
    gated: bool
    """Qwen2.5-VL's blocks (RMSNorm, gated SiLU MLP); False: Qwen2-VL's (LayerNorm, two-layer MLP)."""
    params: int = 0
    """The tower's parameters (their half-precision copies under autocast when it trains)."""

    @property
    def patches_per_token(self) -> int:
        """Patches merged into one image token."""
        return self.merge * self.merge


def vision_shape_of(model_type: str, vision: Any, params: int) -> VisionShape:
    """The `VisionShape` of a `qwen2_vl` / `qwen2_5_vl` `vision_config`."""
    gated = model_type == "qwen2_5_vl"
    width = int(vision.hidden_size if gated else vision.embed_dim)
    intermediate = int(vision.intermediate_size if gated else width * vision.mlp_ratio)
    inputs = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    merge = int(vision.spatial_merge_size)
    return VisionShape(
        int(vision.depth), width, intermediate, int(vision.num_heads), inputs, merge, gated, params
    )


def vision_saved_bytes_per_patch(v: VisionShape, compute_bytes: int) -> int:
    """Bytes autograd keeps per patch through the whole trained tower (module doc's table)."""
    e = v.width
    i = v.intermediate
    h = v.num_heads
    c = compute_bytes
    hd = e // h
    if v.gated:
        block = F32 * (2 * e + 2 + h) + c * (11 * e + 4 * i) + (c * e if c < F32 else 0)
        merger = F32 * (e + 1) + c * 4 * e + F32  # + the window order's int64 index, read twice
    else:
        block = c * (11 * e + 3 * i) + F32 * (h + 4)
        merger = c * 4 * e + 2 * F32
    return c * v.patch_inputs + 2 * F32 * hd + v.depth * block + merger


def _working_bytes_per_patch(v: VisionShape, compute_bytes: int) -> int:
    e = v.width
    i = v.intermediate
    c = compute_bytes
    widest = c * max(7 * e, e + 3 * i)
    return c * v.patch_inputs + 2 * F32 * (e // v.num_heads) + F32 * e + widest


def vision_activation_bytes(v: VisionShape, image_tokens: int, compute_bytes: int, *, trains: bool) -> int:
    """The tower's share of a pass over `image_tokens` image tokens: what a trained tower keeps for backward
    (with its weights' half-precision copies under autocast), else the working set of a forward."""
    patches = image_tokens * v.patches_per_token
    if not trains:
        return patches * _working_bytes_per_patch(v, compute_bytes)
    casts = compute_bytes * v.params if compute_bytes < F32 else 0
    return patches * vision_saved_bytes_per_patch(v, compute_bytes) + casts
