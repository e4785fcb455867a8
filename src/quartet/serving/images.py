"""Images of a token request (`generate_tokens(..., multi_modal=...)`, `/v1/quartet/generate`): checked in
full before the engine, and their JSON form.

An agent loop of a vision-language model sends, with each turn's token ids, all the conversation's images
so far as the image processor made them and the slots they fill (`quartet.agents.images`):

    {"pixel_values": {"dtype": "float32", "shape": [patches, C * t * p * p], "data": "<base64>"},
     "image_grid_thw": [[t, h, w], ...],      # one per image, in order
     "image_mask": [0, 1, 1, ...]}            # optional: per prompt token, 1 on an image slot

Pixels travel as processed rather than as encoded files: the engine reads exactly the pixels the trainer
will, no image decoder runs on the server, and the body limit (`max_body_bytes`) bounds them. The engine
prefills all requests of a step together, so a request whose images do not fit its tokens would fail the
others' prefill: `check_multi_modal` refuses it first (ValueError, a 400 over HTTP) unless the grid's
patch count equals the pixel rows, every image's grid is a whole number of merged patches, the pixels
are finite and as wide as the vision tower's patch, and the prompt's slots (its image tokens, or those
`image_mask` marks) are exactly one per merged patch.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quartet.models.vision import vision_model
from quartet.serving.fields import bad

__all__ = ["VisionSpec", "check_multi_modal", "multi_modal_from_json", "multi_modal_to_json", "vision_spec"]

_KEYS = ("pixel_values", "image_grid_thw", "image_mask")


@dataclass(frozen=True)
class VisionSpec:
    """What a request's images must match: the model's image token, merge size and patch width."""

    image_token_id: int
    merge_size: int
    patch_width: int
    """C * temporal_patch * patch^2: the width of a `pixel_values` row."""


def vision_spec(engine: Any) -> VisionSpec | None:
    """The spec of a built-in engine's vision-language model; None when it takes no images (a text model,
    an engine that processes images its own way)."""
    model = getattr(engine, "model", None)
    trunk = vision_model(model) if isinstance(model, torch.nn.Module) else None
    if trunk is None:
        return None
    vision = trunk.config.vision_config
    width = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    return VisionSpec(int(trunk.config.image_token_id), int(vision.spatial_merge_size), width)


def check_multi_modal(
    prompt_ids: Sequence[int], multi_modal: Mapping[str, Any], spec: VisionSpec | None
) -> dict[str, Any]:
    """`multi_modal` as the engine takes it (tensors, `image_mask` a bool list), or ValueError naming the
    field at fault (module docstring)."""
    if spec is None:
        raise ValueError(
            "multi_modal: this replica's engine takes no images (a text model, or rollout.engine: vllm, "
            "whose image turns are not supported)"
        )
    unknown = sorted(set(multi_modal) - set(_KEYS))
    if unknown:
        raise ValueError(f"multi_modal: unknown key(s) {unknown}; known: {', '.join(_KEYS)}")
    pixels, grid = _pixels(multi_modal.get("pixel_values"), spec), _grid(multi_modal.get("image_grid_thw"))
    patches = int(grid.prod(dim=1).sum())
    if patches != pixels.shape[0]:
        raise ValueError(f"multi_modal.image_grid_thw: {patches} patches for {pixels.shape[0]} pixel rows")
    if bool(((grid[:, 1:] % spec.merge_size) != 0).any()):
        raise ValueError(f"multi_modal.image_grid_thw: h and w must be multiples of {spec.merge_size}")
    ids = torch.tensor(list(prompt_ids), dtype=torch.int64)
    slots = ids == spec.image_token_id
    mask = multi_modal.get("image_mask")
    if mask is not None:
        if (
            not isinstance(mask, Sequence)
            or len(mask) != len(ids)
            or any(not isinstance(m, bool) for m in mask)
        ):
            raise ValueError(f"multi_modal.image_mask: must be {len(ids)} booleans, one per prompt token")
        given = torch.tensor(list(mask), dtype=torch.bool)
        if bool((given & ~slots).any()):
            raise ValueError("multi_modal.image_mask: marks a token that is not the image token")
        slots &= given
    needed = patches // spec.merge_size**2
    if int(slots.sum()) != needed:
        raise ValueError(
            f"multi_modal: the prompt has {int(slots.sum())} image slots for {needed} image tokens "
            "(one per merged patch of each image)"
        )
    out: dict[str, Any] = {"pixel_values": pixels, "image_grid_thw": grid}
    return out if mask is None else {**out, "image_mask": [bool(m) for m in mask]}


def _pixels(value: Any, spec: VisionSpec) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or not value.is_floating_point():
        raise ValueError("multi_modal.pixel_values: must be a 2-D float tensor [patches, width]")
    if value.shape[1] != spec.patch_width or value.shape[0] == 0:
        raise ValueError(
            f"multi_modal.pixel_values: shape {tuple(value.shape)}, the model's patches are "
            f"{spec.patch_width} wide"
        )
    if not bool(torch.isfinite(value).all()):
        raise ValueError("multi_modal.pixel_values: holds NaN or infinite values")
    return value


def _grid(value: Any) -> torch.Tensor:
    ok = isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] == 3 and value.shape[0] > 0
    if not ok or value.is_floating_point() or value.dtype == torch.bool or bool((value < 1).any()):
        raise ValueError(
            "multi_modal.image_grid_thw: must be an integer tensor [images, 3] of positive sizes"
        )
    if bool((value >= 2**16).any()):
        raise ValueError("multi_modal.image_grid_thw: sizes must be below 65536")
    grid: torch.Tensor = value.to(torch.int64)
    return grid


# ---- JSON -------------------------------------------------------------------------------------------------


def multi_modal_to_json(multi_modal: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON form of a request's images (module docstring), for `HttpReplicaClient`."""
    pixels = multi_modal["pixel_values"].detach().to("cpu", torch.float32).contiguous()
    out: dict[str, Any] = {
        "pixel_values": {
            "dtype": "float32",
            "shape": list(pixels.shape),
            "data": base64.b64encode(pixels.numpy().astype("<f4").tobytes()).decode("ascii"),
        },
        "image_grid_thw": [[int(x) for x in row] for row in multi_modal["image_grid_thw"].tolist()],
    }
    if multi_modal.get("image_mask") is not None:
        out["image_mask"] = [int(bool(m)) for m in multi_modal["image_mask"]]
    return out


def multi_modal_from_json(value: Any) -> dict[str, Any]:
    """A `multi_modal` JSON object as tensors; a 400 naming the field for any malformed part (its
    consistency with the prompt is `check_multi_modal`'s)."""
    if not isinstance(value, dict):
        raise bad("'multi_modal' must be an object", "multi_modal")
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise bad(f"'multi_modal' has unknown field(s) {unknown}; known: {', '.join(_KEYS)}", "multi_modal")
    out: dict[str, Any] = {
        "pixel_values": _pixels_from_json(value.get("pixel_values")),
        "image_grid_thw": _grid_from_json(value.get("image_grid_thw")),
    }
    mask = value.get("image_mask")
    if mask is not None:
        if not isinstance(mask, list) or any(m not in (0, 1) or isinstance(m, float) for m in mask):
            raise bad("'multi_modal.image_mask' must be a list of 0 and 1", "multi_modal.image_mask")
        out["image_mask"] = [bool(m) for m in mask]
    return out


def _pixels_from_json(value: Any) -> torch.Tensor:
    param = "multi_modal.pixel_values"
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data"}:
        raise bad(f"'{param}' must be an object with dtype, shape and data", param)
    if value["dtype"] != "float32":
        raise bad(f"'{param}.dtype' must be 'float32'", f"{param}.dtype")
    shape = value["shape"]
    if not (isinstance(shape, list) and len(shape) == 2 and all(_count(s) for s in shape)):
        raise bad(f"'{param}.shape' must be [patches, width] of positive integers", f"{param}.shape")
    if not isinstance(value["data"], str):
        raise bad(f"'{param}.data' must be a base64 string", f"{param}.data")
    try:
        raw = base64.b64decode(value["data"], validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"'{param}.data' is not valid base64", f"{param}.data") from None
    if len(raw) != 4 * shape[0] * shape[1]:
        raise bad(f"'{param}.data' holds {len(raw)} bytes for shape {shape} of float32", f"{param}.data")
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape[0], shape[1])


def _grid_from_json(value: Any) -> torch.Tensor:
    param = "multi_modal.image_grid_thw"
    ok = isinstance(value, list) and bool(value)
    ok = ok and all(isinstance(r, list) and len(r) == 3 and all(_count(x, 2**16) for x in r) for r in value)
    if not ok:
        raise bad(f"'{param}' must be a non-empty list of [t, h, w] positive integers", param)
    return torch.tensor(value, dtype=torch.int64)


def _count(value: Any, limit: int = 2**31) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < limit
