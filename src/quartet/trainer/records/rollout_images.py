"""The images of recorded samples: each written once, named by its content, in `<run dir>/rollouts/images/`.

A vision-language batch carries the non-tensor column `images`: per sample, the list of its images as
encoded bytes (PNG, JPEG, ...). The rollout records and tables name them by path (relative to the run
folder, `rollouts/images/<sha256>.<ext>`) instead of holding them, so a step that samples the same prompt
`rollout.n` times, or a prompt seen again at a later step, stores its picture once. The file type is read
from the bytes' signature; bytes of another kind are left out of the record, with a warning once per run.
Files are written to a temporary name and renamed, so the inspector never serves half an image.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from quartet.core.batch import Batch
from quartet.tracking.run_layout import rollout_image_file

__all__ = ["ImageStore", "image_bytes", "image_ext"]

log = logging.getLogger(__name__)

_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
)


def image_ext(data: bytes) -> str | None:
    """The file extension of encoded image bytes (png, jpg, gif, webp); None for anything else."""
    for magic, ext in _SIGNATURES:
        if data.startswith(magic):
            return ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def image_bytes(value: Any) -> bytes | None:
    """The encoded bytes of one image cell: bytes, or a `{"bytes": ...}` dict (Hugging Face's image form);
    None for anything else (a bare path, a decoded array: not what the trainer's batch carries)."""
    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return None


class ImageStore:
    """Writes the images of a batch's first rows under `run_dir`, each content once; their paths."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.warned = False

    def paths(self, batch: Batch, rows: int) -> list[list[str]] | None:
        """For each of the first `rows` rows, the run-relative paths of its images (written if new); None
        when the batch has no `images` column."""
        if "images" not in batch.non_tensors:
            return None
        column = batch.non_tensors["images"]
        return [self._row(column[i]) for i in range(min(rows, len(column)))]

    def _row(self, cell: Any) -> list[str]:
        if cell is None:
            return []
        images = [cell] if isinstance(cell, bytes | bytearray | dict) else list(cell)
        out = []
        for image in images:
            data = image_bytes(image)
            ext = image_ext(data) if data is not None else None
            if data is None or ext is None:
                if not self.warned:
                    log.warning(
                        "a sample's image is not PNG/JPEG/GIF/WebP bytes (got %s): left out of the rollout "
                        "records",
                        type(image).__name__,
                    )
                    self.warned = True
                continue
            out.append(self.write(data, ext))
        return out

    def write(self, data: bytes, ext: str) -> str:
        """Store `data` (if no file holds it yet); its run-relative path."""
        relative = rollout_image_file(hashlib.sha256(data).hexdigest(), ext)
        path = self.run_dir / relative
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return relative
