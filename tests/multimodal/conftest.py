"""The tiny Qwen2-VL and Pillow-drawn images for the vision tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vision_cases import image_row, png

from quartet.config.data import DataConfig
from quartet.core.batch import Batch
from quartet.data.images import ImageInputs
from quartet.data.prompts import PromptDataset
from quartet.models.loading import load_causal_lm, load_image_processor, load_tokenizer
from quartet.rollout import SamplingParams, TorchRolloutEngine, generate_batch


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2-VL with its tokenizer and image processor, saved with save_pretrained."""
    from quartet.config import TinyModelConfig
    from quartet.config.model import TinyArch
    from quartet.models.tiny import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(arch=TinyArch.QWEN2_VL), tmp_path_factory.mktemp("vlm"))


def _dataset(folder: Path) -> PromptDataset:
    tokenizer = load_tokenizer(folder)
    rows = [
        image_row("<image>What color is the shape?", [png("red")]),
        image_row("Compare <image> with <image>.", [png("blue", (100, 60)), png("green", shape="ellipse")]),
        image_row("No picture: say hi.", []),
        image_row("<image>", [{"bytes": png("yellow"), "path": None}]),
    ]
    images = ImageInputs.of(load_image_processor(folder), tokenizer)
    return PromptDataset.from_rows(
        rows, DataConfig(max_prompt_length=128), tokenizer, "rows.jsonl", images=images
    )


@pytest.fixture(scope="session")
def rollout(tiny_vlm_dir: Path) -> Batch:
    """Three samples each of four image prompts (one, two, no and one image) from the built-in engine."""
    data = _dataset(tiny_vlm_dir)
    model = load_causal_lm(tiny_vlm_dir)
    engine = TorchRolloutEngine(model, load_tokenizer(tiny_vlm_dir), max_num_seqs=5)
    try:
        sampling = SamplingParams(temperature=1.0, n=3, max_new_tokens=10, seed=3)
        return generate_batch(engine, data.batch([0, 1, 2, 3]), sampling, data.pad_id)
    finally:
        engine.shutdown()
