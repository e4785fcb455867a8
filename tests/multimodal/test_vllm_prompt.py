"""The prompt an image request gives vLLM and the weight names it takes from the trainer (no vLLM needed)."""

from __future__ import annotations

import torch
from vision_cases import png

from quartet.rollout import GenerationRequest
from quartet.rollout.vllm_images import collapse_image_runs, vllm_prompt
from quartet.rollout.vllm_support import CheckedWeights


def test_collapse_image_runs() -> None:
    assert collapse_image_runs([1, 7, 7, 7, 2, 7, 7, 3, 7], 7) == [1, 7, 2, 7, 3, 7]


def test_vllm_prompt_of_an_image_request() -> None:
    blobs = [png("red", (64, 32)), png("blue")]
    request = GenerationRequest((5, 9, 7, 7, 7, 8, 9, 7, 7, 8, 4), multi_modal={"images": blobs})
    prompt = vllm_prompt(request, image_token_id=7)
    assert prompt is not None and prompt["prompt_token_ids"] == [5, 9, 7, 8, 9, 7, 8, 4]
    images = prompt["multi_modal_data"]["image"]
    assert [im.size for im in images] == [(64, 32), (64, 64)] and images[0].mode == "RGB"
    assert vllm_prompt(GenerationRequest((1, 2)), image_token_id=7) is None


def test_checked_weights_take_the_nested_names_of_transformers_5() -> None:
    """The trainer's Qwen2-VL names (`model.language_model.`, `model.visual.`) are checked against, and sent
    as, the checkpoint's flat layout; shapes are still checked and unknown names still refused."""
    shapes = {
        "model.layers.0.mlp.up_proj.weight": (4, 2),
        "visual.blocks.0.attn.qkv.weight": (6, 2),
        "lm_head.weight": (3, 2),
    }
    sent = [
        ("model.language_model.layers.0.mlp.up_proj.weight", torch.zeros(4, 2)),
        ("model.visual.blocks.0.attn.qkv.weight", torch.zeros(6, 2)),
        ("lm_head.weight", torch.zeros(3, 2)),
    ]
    checked = CheckedWeights(sent, shapes)
    assert [name for name, _ in checked] == list(shapes)
    assert checked.problem is None and checked.count == 3
    wrong_shape = CheckedWeights([("model.visual.blocks.0.attn.qkv.weight", torch.zeros(5, 2))], shapes)
    assert list(wrong_shape) == [] and isinstance(wrong_shape.problem, ValueError)
    other_layer = "model.language_model.layers.1.mlp.up_proj.weight"
    unknown = CheckedWeights([(other_layer, torch.zeros(4, 2))], shapes)
    assert list(unknown) == [] and isinstance(unknown.problem, KeyError)
