"""The images of recorded samples: written once per content under `rollouts/images/`, named by the records
and the rollout table, and left out (with a warning) when they are not image bytes."""

from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from quartet.config import load_config
from quartet.core.batch import Batch
from quartet.trainer.records.rollout_images import ImageStore, image_bytes, image_ext
from quartet.trainer.records.rollout_records import RolloutRecorder


class _Chars:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i) for i in ids)

    def batch_decode(self, rows: list[list[int]]) -> list[str]:
        return [self.decode(r) for r in rows]


def _picture(color: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, format=fmt)
    return buffer.getvalue()


def _batch(images: list[Any]) -> Batch:
    n = len(images)
    column = np.empty(n, dtype=object)
    column[:] = images
    return Batch(
        {
            "prompts": torch.full((n, 2), 3),
            "responses": torch.full((n, 3), 1),
            "attention_mask": torch.ones(n, 5, dtype=torch.int64),
            "response_mask": torch.ones(n, 3, dtype=torch.int64),
        },
        {"images": column, "uid": np.array([f"u{i // 2}" for i in range(n)], dtype=object)},
        batch_size=n,
    )


def _recorder(run_dir: Path) -> RolloutRecorder:
    cfg = load_config(None, ["trainer.rollout_freq=1", "trainer.rollout_samples=0"])
    return RolloutRecorder(cfg, _Chars(), run_dir)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_each_image_is_written_once_and_named_by_records_and_table(tmp_path: Path) -> None:
    red, blue, green = _picture((255, 0, 0)), _picture((0, 0, 255)), _picture((0, 255, 0), "JPEG")
    recorder = _recorder(tmp_path)
    # two samples of one prompt share its picture; the third has two pictures, one of them the same again
    recorder.train(_batch([[red], [red], [blue, {"bytes": green, "path": None}]]), step=2)
    folder = tmp_path / "rollouts" / "images"
    expected = {
        f"{hashlib.sha256(red).hexdigest()}.png": red,
        f"{hashlib.sha256(blue).hexdigest()}.png": blue,
        f"{hashlib.sha256(green).hexdigest()}.jpg": green,
    }
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == expected
    red_path, blue_path, green_path = (f"rollouts/images/{name}" for name in expected)
    lines = _lines(tmp_path / "rollouts" / "step_2.jsonl")
    assert [line["images"] for line in lines] == [[red_path], [red_path], [blue_path, green_path]]
    table = pq.read_table(tmp_path / "rollouts" / "step_2.parquet")
    assert table["images"].to_pylist() == [line["images"] for line in lines]
    # a later step with the same picture writes no new file and leaves the old one as it was
    before = (folder / Path(red_path).name).stat().st_mtime_ns
    recorder.train(_batch([[red]]), step=3)
    assert len(list(folder.iterdir())) == 3 and (folder / Path(red_path).name).stat().st_mtime_ns == before
    writer = recorder.val_writer(3)
    assert writer is not None
    writer(_batch([[blue]]))
    assert _lines(tmp_path / "rollouts" / "val_step_3.jsonl")[0]["images"] == [blue_path]


def test_a_batch_without_images_records_none(tmp_path: Path) -> None:
    batch = _batch([[b""]])
    del batch.non_tensors["images"]
    _recorder(tmp_path).train(batch, step=1)
    (line,) = _lines(tmp_path / "rollouts" / "step_1.jsonl")
    assert "images" not in line and not (tmp_path / "rollouts" / "images").exists()
    assert "images" not in pq.read_table(tmp_path / "rollouts" / "step_1.parquet").column_names


def test_bytes_that_are_no_image_are_left_out_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    red = _picture((255, 0, 0))
    with caplog.at_level(logging.WARNING, logger="quartet.trainer.records.rollout_images"):
        paths = ImageStore(tmp_path).paths(_batch([[b"<svg/>", red], ["a/path.png"], None]), rows=3)
    assert paths == [[f"rollouts/images/{hashlib.sha256(red).hexdigest()}.png"], [], []]
    assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 1


def test_signatures_and_cells() -> None:
    assert image_ext(_picture((1, 2, 3))) == "png" and image_ext(_picture((1, 2, 3), "JPEG")) == "jpg"
    assert image_ext(_picture((1, 2, 3), "GIF")) == "gif" and image_ext(_picture((1, 2, 3), "WEBP")) == "webp"
    assert image_ext(b"PNG but not really") is None
    assert image_bytes({"bytes": b"x", "path": None}) == b"x" and image_bytes(memoryview(b"y")) == b"y"
    assert image_bytes("file.png") is None and image_bytes({"path": "file.png"}) is None
