"""Images of multimodal prompt rows (verl's layout), checked at load and processed per batch.

A row holds its images in the `data.image_key` column (default `images`): a list, each item one of
    {"bytes": b"...", "path": "..."}   the Image feature of HF `datasets` (what verl's parquet files hold;
                                       the bytes win, the path is read when the bytes are empty)
    {"image": "a.png"}                 qwen-vl-utils' form
    b"..."                             the encoded file (PNG, JPEG, ...)
    "a.png"                            a path, relative to the data file's folder (JSON Lines rows)
and its prompt messages mark where each image goes with `<image>` in their text, in order. A row whose
images cannot be read (bytes Pillow cannot decode, a missing file) or whose image count differs from its
`<image>` count is a bad row (`bad_image`, `image_count_mismatch`), refused or counted and skipped like any
malformed row (`data.skip_bad_rows`).

At load every image is decoded once (so a bad one is found before any actor starts) and its prompt tokens
counted from its size (`tokens_per_image`: the processor's patches / merge^2), so `data.max_prompt_length`
counts the expanded prompt the model sees. Only the encoded bytes are kept; pixels are made per batch
(`ImageInputs.process`), as verl's `multi_modal_inputs` per row.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quartet.data.errors import RowProblem

__all__ = ["IMAGE_PLACEHOLDER", "ImageInputs", "expand_image_tokens", "image_messages", "read_images"]

IMAGE_PLACEHOLDER = "<image>"
_SPLIT = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)})")
_IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True)
class ImageInputs:
    """What loading and batching images need: the model's image processor and its image token."""

    processor: Any
    """The image processor (`quartet.models.loading.load_image_processor`): pixels and grids of images."""
    image_token_id: int
    """The token repeated once per merged patch of an image (`<|image_pad|>`)."""
    key: str = "images"
    """The column holding a row's images (`data.image_key`)."""

    @classmethod
    def of(cls, processor: Any, tokenizer: Any, key: str = "images") -> ImageInputs:
        """The inputs of a Qwen2-VL style processor and a tokenizer that knows `<|image_pad|>`."""
        token = tokenizer.convert_tokens_to_ids(_IMAGE_PAD)
        if not isinstance(token, int) or token == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {_IMAGE_PAD} token: is this a Qwen2-VL style model?")
        return cls(processor, token, key)

    @property
    def merge_size(self) -> int:
        """Patches merged per side into one prompt token (2 for Qwen2-VL)."""
        return int(getattr(self.processor, "merge_size", 1))

    def tokens_per_image(self, width: int, height: int) -> int:
        """Prompt tokens of an image of this size: the processor's patches after resizing / merge^2."""
        patches = int(self.processor.get_number_of_image_patches(height, width, {}))
        return patches // self.merge_size**2

    def process(self, blobs: Sequence[bytes]) -> dict[str, torch.Tensor]:
        """`pixel_values` [patches, C * t * p * p] and `image_grid_thw` [images, 3] of encoded images."""
        images = [_decode(blob, "") for blob in blobs]
        out = self.processor(images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def _decode(blob: bytes, column: str) -> Any:
    """The image in `blob`, fully decoded to RGB; `RowProblem` (bad_image) when Pillow cannot read it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(blob)) as image:
            image.load()
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise RowProblem(
            "bad_image",
            column,
            f"not a readable image ({len(blob)} bytes, starting {blob[:8]!r}): Pillow raised "
            f"{type(err).__name__}",
        ) from err


def _read_path(path: str, base: Path, column: str) -> bytes:
    file = Path(path).expanduser()
    file = file if file.is_absolute() else base / file
    try:
        return file.read_bytes()
    except OSError as err:
        raise RowProblem(
            "bad_image",
            column,
            f"cannot read the image file {file}: {err.strerror or err}",
            "relative paths are read from the data file's folder",
        ) from err


def _image_bytes(item: Any, base: Path, column: str) -> bytes:
    """The encoded bytes of one image cell (forms in the module docstring)."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, str):
        return _read_path(item, base, column)
    if isinstance(item, dict):
        blob = item.get("bytes")
        if blob:
            return bytes(blob)
        path = item.get("path") or item.get("image")
        if isinstance(path, str) and path:
            return _read_path(path, base, column)
        raise RowProblem("bad_image", column, f"the image has neither bytes nor a path (keys {sorted(item)})")
    got = type(item).__name__
    raise RowProblem("bad_image", column, f"expected image bytes, a path or {{bytes, path}}, got {got}")


def read_images(row: dict[str, Any], key: str, base: Path) -> list[tuple[bytes, tuple[int, int]]]:
    """Each image of `row[key]` as (encoded bytes, (width, height)), decoded once to check it; [] when the
    row has no such column or it is empty. Raises `RowProblem` naming `key[i]`."""
    cell = row.get(key)
    if cell is None:
        return []
    if isinstance(cell, (bytes, str, dict)):
        cell = [cell]
    if not isinstance(cell, (list, tuple)):
        raise RowProblem("bad_image", key, f"expected a list of images, got {type(cell).__name__}")
    out = []
    for i, item in enumerate(cell):
        blob = _image_bytes(item, base, f"{key}[{i}]")
        image = _decode(blob, f"{key}[{i}]")
        out.append((blob, (int(image.width), int(image.height))))
    return out


def image_messages(messages: list[dict[str, Any]], count: int, column: str) -> list[dict[str, Any]]:
    """`messages` with each `<image>` of their text turned into an image content part (Qwen2-VL's chat
    template renders it as the vision tokens); raises `RowProblem` when the placeholders are not `count`."""
    found = sum(str(m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in messages)
    if found != count:
        raise RowProblem(
            "image_count_mismatch",
            column,
            f"the prompt has {found} {IMAGE_PLACEHOLDER} placeholders for {count} images",
            f"write one {IMAGE_PLACEHOLDER} in the prompt text per image, in the images' order",
        )
    if not count:
        return messages
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
            out.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for piece in _SPLIT.split(content):
            if piece == IMAGE_PLACEHOLDER:
                parts.append({"type": "image"})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({**message, "content": parts})
    return out


def expand_image_tokens(ids: list[int], image_token_id: int, counts: Sequence[int], column: str) -> list[int]:
    """`ids` with the k-th image token repeated `counts[k]` times (one per merged patch of image k), as
    Qwen2-VL's processor expands its text; `RowProblem` when the template wrote another number of them."""
    where = [i for i, t in enumerate(ids) if t == image_token_id]
    if len(where) != len(counts):
        raise RowProblem(
            "image_count_mismatch",
            column,
            f"the chat template wrote {len(where)} image tokens for {len(counts)} images",
            "check that the model's chat template renders image content parts",
        )
    out: list[int] = []
    start = 0
    for index, count in zip(where, counts, strict=True):
        out.extend(ids[start:index])
        out.extend([image_token_id] * count)
        start = index + 1
    out.extend(ids[start:])
    return out


def row_images(
    row: dict[str, Any], messages: list[dict[str, Any]], images: ImageInputs | None, base: Path, column: str
) -> tuple[list[dict[str, Any]], list[bytes], list[int]]:
    """A row's messages as the chat template must see them, its encoded images, and the prompt tokens of
    each image. Without `images` (a text-only model) a row that holds images is refused, not read as text."""
    key = images.key if images is not None else "images"
    if images is None:
        cell = row.get(key)
        if cell is not None and len(cell):
            raise RowProblem(
                "images_need_vision_model",
                key,
                f"the row holds {len(cell)} images but the model is text only",
                "train a vision-language model (model.path holding one, or model.tiny.arch: qwen2_vl)",
            )
        return messages, [], []
    read = read_images(row, key, base)
    shown = image_messages(messages, len(read), column)
    counts = [images.tokens_per_image(w, h) for _, (w, h) in read]
    return shown, [blob for blob, _ in read], counts
