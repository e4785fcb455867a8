"""The value model (critic) of a vision-language model: loading, its values on image prompts against an
independent transformers forward (fp32, padded and packed), and that the image reaches it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForTokenClassification
from vision_cases import plain_values, without_sampled_pads

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.inputs import build_inputs
from quartet.engines.model_init import load_reward_model
from quartet.engines.vision_inputs import NO_VISION, vision_call
from quartet.models.loading import ModelFolderError, load_causal_lm, load_value_model
from quartet.models.tiny import save_value_model


@pytest.fixture(scope="module")
def value_dir(tiny_vlm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved value model started from the tiny Qwen2-VL (trunk reused, fresh head)."""
    torch.manual_seed(0)
    return save_value_model(tiny_vlm_dir, tmp_path_factory.mktemp("vlm_value"))


@pytest.fixture(scope="module")
def batch(rollout: Batch, tiny_vlm_dir: Path) -> Batch:
    """The rollout without sampled `<|image_pad|>` tokens (`vision_cases.without_sampled_pads`)."""
    return without_sampled_pads(rollout, int(load_causal_lm(tiny_vlm_dir).config.image_token_id))


@pytest.mark.parametrize(
    ("micro", "packed"),
    [
        (MicroSpec(size=100), False),
        (MicroSpec(max_tokens=60), False),
        (MicroSpec(size=100), True),  # packed rows: M-RoPE positions and image slots packed too
        (MicroSpec(size=1), True),
    ],
)
def test_critic_values_equal_an_independent_forward(
    value_dir: Path, batch: Batch, micro: MicroSpec, packed: bool
) -> None:
    engine = TrainingEngine(EngineSpec(str(value_dir), ModelKind.VALUE, Dtype.FLOAT32, remove_padding=packed))
    assert (engine.module.config.text_config._attn_implementation == "quartet_varlen") is packed
    values = engine.forward_values(batch, micro)
    expected = plain_values(value_dir, batch)
    assert sum(len(e) for e in expected) > 20
    for i, want in enumerate(expected):
        assert float((values[i, : len(want)] - want).abs().max()) <= 1e-5
        assert not values[i, len(want) :].any()  # 0 past the response's end


def test_the_image_reaches_the_critic(value_dir: Path, batch: Batch) -> None:
    """Swapping two rows' pixels (same grid, other colour) changes their values."""
    engine = TrainingEngine(EngineSpec(str(value_dir), ModelKind.VALUE, Dtype.FLOAT32))
    rows = batch.index([0, 9])  # a red square and a yellow one, each one image of 16 tokens
    mm: Any = list(rows.non_tensors["multi_modal_inputs"])
    assert mm[0]["image_grid_thw"].tolist() == mm[1]["image_grid_thw"].tolist()
    swapped = Batch(rows.tensors, {**rows.non_tensors, "multi_modal_inputs": mm[::-1]}, rows.meta)
    base = engine.forward_values(rows, MicroSpec(size=2))
    other = engine.forward_values(swapped, MicroSpec(size=2))
    mask = rows["response_mask"].bool()
    assert float((base - other).abs()[mask].max()) > 1e-4


def test_a_vlm_critic_starts_from_the_policy_and_round_trips(tiny_vlm_dir: Path, value_dir: Path) -> None:
    policy = load_causal_lm(tiny_vlm_dir).state_dict()
    fresh = load_value_model(tiny_vlm_dir).state_dict()
    trunk = [k for k in fresh if k.startswith("model.")]
    assert any(k.startswith("model.visual.") for k in trunk) and "lm_head.weight" not in fresh
    assert all(torch.equal(fresh[k], policy[k]) for k in trunk)  # the policy's trunk, visual included
    assert fresh["score.weight"].shape == (1, policy["lm_head.weight"].shape[1])
    saved = load_value_model(value_dir).state_dict()
    plain = AutoModelForTokenClassification.from_pretrained(value_dir).state_dict()
    assert saved.keys() == plain.keys() == fresh.keys()
    assert all(torch.equal(saved[k], plain[k]) for k in saved)
    assert (value_dir / "preprocessor_config.json").exists()  # the image processor travels with it


def test_the_critic_exports_a_loadable_value_model(value_dir: Path, batch: Batch, tmp_path: Path) -> None:
    engine = TrainingEngine(EngineSpec(str(value_dir), ModelKind.VALUE, Dtype.FLOAT32))
    folder = engine.export_hf(tmp_path / "hf")
    assert folder is not None
    exported = load_value_model(folder).state_dict()
    live = engine.module.state_dict()
    assert exported.keys() == live.keys() and all(torch.equal(exported[k], live[k]) for k in live)


def test_a_vlm_reward_model_is_refused_naming_the_key(tiny_vlm_dir: Path) -> None:
    with pytest.raises(ModelFolderError, match=r"reward\.model_path .*reward\.function"):
        load_reward_model(tiny_vlm_dir)


def test_a_text_model_refuses_a_micro_batch_with_images(batch: Batch) -> None:
    """A text critic of a VLM policy would score image rows without their images: refused, naming the key."""
    text_model = torch.nn.Linear(2, 2)  # no multimodal trunk: what a text critic's engine holds
    with pytest.raises(ValueError, match=r"critic\.model_path"):
        vision_call(text_model, batch, build_inputs(batch), torch.device("cpu"))
    rows = batch.index([6, 7])  # the prompt without images: nothing to lose
    assert all(m is None for m in rows.non_tensors["multi_modal_inputs"])
    assert vision_call(text_model, rows, build_inputs(rows), torch.device("cpu")) == NO_VISION
