"""The prompt an image request gives vLLM (no vLLM needed): one placeholder per image, the images decoded."""

from __future__ import annotations

from vision_cases import png

from quartet.rollout import GenerationRequest
from quartet.rollout.vllm_images import collapse_image_runs, vllm_prompt


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
