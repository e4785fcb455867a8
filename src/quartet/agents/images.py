"""Images in agent trajectories: the prompt's, then those tool results add, each expanded and processed once.

A vision-language model (Qwen2-VL style) sees an image as a run of `<|image_pad|>` tokens, one per merged
patch, whose embeddings the vision tower's features replace. An agent loop keeps, per trajectory, the
encoded images in the order they appear (`TrajectoryImages`): the prompt's first (its `<image>`
placeholders become image content parts, as the prompt loader does), then those of later environment
turns (a `ToolResult` with `images`, rendered as a tool message whose content holds one `{"type": "image"}`
part per image). Every rendering's k-th image token is repeated once per merged patch of image k.

Each generation request carries all the trajectory's images so far (`pixel_values`, `image_grid_thw`) and
`image_mask`: the image slots, i.e. the image tokens the model did not write. A model that samples an
`<|image_pad|>` wrote a plain token (response_mask 1), which the engine and the trainer both read as text.
The environment's text may not smuggle a slot in: `<|image_pad|>` and `<|video_pad|>` written in a tool's
or a user's text are spelled without their bars (`safe_text`), so the slots are exactly the images'.

The layer rules keep `quartet.data` out of reach here, so the little the loader does with images (decode,
count tokens, expand) is done again with the same processor; the rollout role builds the processor with the
run's `data.min_pixels` / `data.max_pixels`, so counts and pixels are those of the prompt loader.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["IMAGE_PAD", "ImageKit", "TrajectoryImages", "image_parts", "prompt_image_messages", "safe_text"]

IMAGE_PAD = "<|image_pad|>"
_PLACEHOLDER = "<image>"
_SPLIT = re.compile(f"({re.escape(_PLACEHOLDER)})")
_SMUGGLED = {IMAGE_PAD: "<image_pad>", "<|video_pad|>": "<video_pad>"}

Prepared = tuple[dict[str, torch.Tensor], int]
"""One processed image: its `pixel_values` and `image_grid_thw`, and its number of image tokens."""


def safe_text(text: str) -> str:
    """Environment text with the image and video pad tokens spelled as plain text (module docstring)."""
    for token, plain in _SMUGGLED.items():
        text = text.replace(token, plain)
    return text


def image_parts(text: str, count: int) -> list[dict[str, Any]]:
    """A message content of `text` followed by `count` image parts (a tool result's images)."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return parts + [{"type": "image"} for _ in range(count)]


@dataclass(frozen=True)
class ImageKit:
    """A model's image processor and image token: what the loops of one replica share."""

    processor: Any
    """A Qwen2-VL style image processor (`quartet.models.loading.load_image_processor`)."""
    image_token_id: int

    @classmethod
    def of(cls, processor: Any, tokenizer: Any) -> ImageKit:
        """The kit of `processor` and a tokenizer that knows `<|image_pad|>` (ValueError otherwise)."""
        token = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if not isinstance(token, int) or token == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {IMAGE_PAD} token: is this a Qwen2-VL style model?")
        return cls(processor, token)

    @property
    def merge_size(self) -> int:
        return int(getattr(self.processor, "merge_size", 1))

    def decode(self, blob: bytes) -> Any:
        """The RGB image in `blob`; ValueError saying why when Pillow cannot read it."""
        from PIL import Image

        try:
            with Image.open(io.BytesIO(blob)) as image:
                image.load()
                return image.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise ValueError(f"not a readable image ({len(blob)} bytes): {type(err).__name__}") from None

    def process(self, blob: bytes) -> Prepared:
        """One encoded image's `pixel_values`, `image_grid_thw` and its number of image tokens."""
        out = self.processor(images=[self.decode(blob)], return_tensors="pt")
        grid = out["image_grid_thw"]
        tokens = int(grid.prod()) // self.merge_size**2
        return {"pixel_values": out["pixel_values"], "image_grid_thw": grid}, tokens

    def expand(self, ids: Sequence[int], counts: Sequence[int]) -> list[int]:
        """`ids` with the k-th image token repeated `counts[k]` times; ValueError when the rendering holds
        another number of image tokens (a chat template that does not render image content parts)."""
        where = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(where) != len(counts):
            raise ValueError(
                f"the chat template wrote {len(where)} image tokens for {len(counts)} images: it must render "
                "image content parts ({'type': 'image'}) as Qwen2-VL's does"
            )
        out: list[int] = []
        start = 0
        for index, count in zip(where, counts, strict=True):
            out += list(ids[start:index]) + [self.image_token_id] * count
            start = index + 1
        return out + list(ids[start:])


def prompt_image_messages(messages: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """`messages` with each `<image>` of their text an image content part; ValueError when the text holds
    another number of placeholders than the row's `count` images."""
    found = sum(str(m.get("content") or "").count(_PLACEHOLDER) for m in messages)
    if found != count:
        raise ValueError(f"the prompt has {found} {_PLACEHOLDER} placeholders for {count} images")
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or _PLACEHOLDER not in content:
            out.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for piece in _SPLIT.split(content):
            if piece == _PLACEHOLDER:
                parts.append({"type": "image"})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({**message, "content": parts})
    return out


@dataclass
class TrajectoryImages:
    """One trajectory's images in order, each processed once, and what a request or the trainer needs."""

    kit: ImageKit
    blobs: list[bytes] = field(default_factory=list)
    """The encoded images, prompt's first."""
    processed: list[dict[str, torch.Tensor]] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    """Image tokens of each image."""

    def add(self, blobs: Sequence[bytes], prepared: Sequence[Prepared] | None = None) -> list[int]:
        """Append images (`prepared`: their `prepare` result, when already made); their token counts.
        ValueError, and nothing appended, when one does not decode."""
        done = list(prepared) if prepared is not None else self.prepare(blobs)
        self.blobs += [bytes(b) for b in blobs]
        self.processed += [p for p, _ in done]
        self.counts += [n for _, n in done]
        return [n for _, n in done]

    def prepare(self, blobs: Sequence[bytes]) -> list[Prepared]:
        """Each image processed, not yet appended (ValueError for one that does not decode)."""
        return [self.kit.process(bytes(b)) for b in blobs]

    def inputs(self) -> dict[str, torch.Tensor] | None:
        """All images' `pixel_values` [patches, D] and `image_grid_thw` [images, 3] (a row's
        `multi_modal_inputs`); None without images."""
        if not self.processed:
            return None
        return {
            "pixel_values": torch.cat([p["pixel_values"] for p in self.processed]),
            "image_grid_thw": torch.cat([p["image_grid_thw"] for p in self.processed]),
        }

    def request(self, prompt: Sequence[int], response: Sequence[int], mask: Sequence[int]) -> dict[str, Any]:
        """The generation request's `multi_modal` for the history `prompt + response` (`mask`: the
        response's mask, 1 on model tokens): the images and the slots (image tokens the model did not
        write)."""
        pad = self.kit.image_token_id
        slots = [t == pad for t in prompt] + [
            t == pad and m == 0 for t, m in zip(response, mask, strict=True)
        ]
        inputs = self.inputs()
        return {**(inputs or {}), "image_mask": slots}
