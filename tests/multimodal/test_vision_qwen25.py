"""Qwen2.5-VL (windowed vision tower, its own `get_rope_index`): the built-in engine's log-probs of image
prompts equal the trainer's (fp32), as for Qwen2-VL, and its critic's values equal a plain forward."""

from __future__ import annotations

from pathlib import Path

import pytest
from vision_cases import image_row, plain_values, png, without_sampled_pads

from quartet.config import TinyModelConfig
from quartet.config.data import DataConfig
from quartet.config.model import Dtype, TinyArch
from quartet.data.images import ImageInputs
from quartet.data.prompts import PromptDataset
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.models.loading import load_causal_lm, load_image_processor, load_tokenizer
from quartet.models.tiny import ensure_tiny_model, save_value_model
from quartet.rollout import SamplingParams, TorchRolloutEngine, generate_batch

pytestmark = pytest.mark.slow  # builds a second tiny tokenizer: 7 s here, ~25 s on a loaded 2-core box


def test_qwen2_5_vl_engine_and_trainer_agree(tmp_path: Path) -> None:
    folder = ensure_tiny_model(TinyModelConfig(arch=TinyArch.QWEN2_5_VL), tmp_path)
    tokenizer = load_tokenizer(folder)
    images = ImageInputs.of(load_image_processor(folder), tokenizer)
    rows = [
        image_row("<image> and <image>?", [png("red", (112, 112)), png("blue", (90, 60), "ellipse")]),
        image_row("text only", []),
    ]
    data = PromptDataset.from_rows(
        rows, DataConfig(max_prompt_length=128), tokenizer, "r.jsonl", images=images
    )
    engine = TorchRolloutEngine(load_causal_lm(folder), tokenizer, max_num_seqs=4)
    try:
        sampling = SamplingParams(temperature=1.0, n=2, max_new_tokens=8, seed=2)
        rollout = generate_batch(engine, data.batch([0, 1]), sampling, data.pad_id)
    finally:
        engine.shutdown()
    trainer = TrainingEngine(EngineSpec(str(folder), ModelKind.CAUSAL_LM, Dtype.FLOAT32))
    logprobs, _ = trainer.forward_logprobs(rollout, 1.0, MicroSpec(size=3))
    mask = rollout["response_mask"].bool()
    assert float((logprobs - rollout["rollout_logprobs"]).abs()[mask].max()) <= 1e-5

    value_dir = save_value_model(folder, tmp_path / "value")
    critic = TrainingEngine(EngineSpec(str(value_dir), ModelKind.VALUE, Dtype.FLOAT32, remove_padding=True))
    batch = without_sampled_pads(rollout, int(trainer.module.config.image_token_id))
    values = critic.forward_values(batch, MicroSpec(size=3))
    for i, want in enumerate(plain_values(value_dir, batch)):
        assert float((values[i, : len(want)] - want).abs().max()) <= 1e-5
