"""A vision-language run folder as the trainer writes it for one recorded step, without training: the
inspector's image tests (API and page) read it."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from quartet.core.batch import Batch
from quartet.trainer.records.rollout_images import ImageStore
from quartet.trainer.records.rollout_tables import TokenTableWriter


class _Chars:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i) for i in ids)

    def batch_decode(self, rows: list[list[int]]) -> list[str]:
        return [self.decode(r) for r in rows]


def picture(color: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (6, 6), color).save(buffer, format=fmt)
    return buffer.getvalue()


RED, BLUE = picture((255, 0, 0)), picture((0, 0, 255), "JPEG")


def write_run(run: Path, images: list[list[bytes]]) -> None:
    """A run folder as a trainer writes it for one recorded step of a vision-language batch."""
    n = len(images)
    column = np.empty(n, dtype=object)
    column[:] = images
    batch = Batch(
        {
            "prompts": torch.full((n, 2), 2),
            "responses": torch.full((n, 2), 1),
            "attention_mask": torch.ones(n, 4, dtype=torch.int64),
            "response_mask": torch.ones(n, 2, dtype=torch.int64),
        },
        {"images": column},
        batch_size=n,
    )
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    paths = ImageStore(run).paths(batch, n)
    TokenTableWriter(run / "rollouts", _Chars(), 0, 64.0).write(batch, 1, paths)
