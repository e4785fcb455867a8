"""A tiny Qwen2-VL (or Qwen2.5-VL) for tests and examples: vision tower, tokenizer, template, image processor.

Like `quartet.models.tiny`, nothing is downloaded: the tiny byte-level BPE tokenizer is trained with the
vision tokens of Qwen2-VL added as special tokens (`<|vision_start|>`, `<|image_pad|>`, `<|vision_end|>`,
`<|video_pad|>`), its chat template renders an image content part (`{"type": "image"}`) as Qwen2-VL's does
(`<|vision_start|><|image_pad|><|vision_end|>`), and a randomly initialised
`Qwen2VLForConditionalGeneration` gets a vision tower of two blocks 32 wide (patch 14, merge 2). The image
processor's pixel bounds are small (56x56 to 112x112 pixels), so an image is 16 to 64 patches, 4 to 16
tokens in the prompt. Everything is saved to one folder and loaded back through transformers'
`AutoModelForImageTextToText` / `AutoImageProcessor` / `AutoTokenizer.from_pretrained` (and
`AutoProcessor` where torchvision, which transformers' Qwen2-VL video processor needs, is installed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from quartet.config.model import TinyArch, TinyModelConfig
from quartet.models.tiny_tokenizer import CHAT_TEMPLATE, build_tiny_tokenizer

__all__ = [
    "IMAGE_PAD",
    "VISION_CHAT_TEMPLATE",
    "VISION_END",
    "VISION_START",
    "VISION_TOKENS",
    "build_tiny_vlm",
    "save_tiny_vlm",
    "tiny_vision_config",
]

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VISION_END = "<|vision_end|>"
VIDEO_PAD = "<|video_pad|>"
VISION_TOKENS = (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD)
MIN_PIXELS = 56 * 56
"""Smallest image after resizing: 4 x 4 patches of 14 pixels, 4 tokens after the 2 x 2 merge."""
MAX_PIXELS = 112 * 112
"""Largest image after resizing: 8 x 8 patches, 16 tokens."""

# The tiny ChatML template (quartet.models.tiny_tokenizer) with Qwen2-VL's rendering of content parts: a
# message's content is a string, or a list of parts where an image part becomes the three vision tokens
# (the processor later repeats <|image_pad|> once per merged patch) and a text part its text.
VISION_CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    "{{- '" + VISION_START + IMAGE_PAD + VISION_END + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
) + CHAT_TEMPLATE.replace("(message['content'] or '')", "render(message['content'])")


def build_tiny_vision_tokenizer(spec: TinyModelConfig) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with the vision tokens and the vision chat template."""
    tokenizer = build_tiny_tokenizer(spec.vocab_size, spec.seed, VISION_TOKENS)
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    return tokenizer


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's split of the rotary frequencies over (time, height, width): [16, 24, 24] of 64 at head
    dim 128, scaled to `head_dim` (a multiple of 16)."""
    if head_dim % 16:
        raise ValueError(f"a tiny VLM needs a head dim divisible by 16 (M-RoPE sections), got {head_dim}")
    return [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]


def tiny_vision_config(spec: TinyModelConfig) -> dict[str, Any]:
    """The `vision_config` of `spec`'s tiny VLM: two blocks 32 wide whose merger feeds the text width (the
    memory planner reads it too)."""
    vision: dict[str, Any] = dict(depth=2, num_heads=2, patch_size=14, spatial_merge_size=2)
    vision.update(temporal_patch_size=2, in_channels=3)
    if spec.arch is TinyArch.QWEN2_5_VL:
        vision.update(hidden_size=32, intermediate_size=64, out_hidden_size=spec.hidden_size)
        vision.update(window_size=56, fullatt_block_indexes=[1])
    else:
        vision.update(embed_dim=32, hidden_size=spec.hidden_size, mlp_ratio=2)
    return vision


def build_tiny_vlm(spec: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised Qwen2-VL (`spec.arch` qwen2_vl) or Qwen2.5-VL (qwen2_5_vl) of `spec`'s text
    shape, with a two-block vision tower whose merger feeds the text width."""
    ids = [int(tokenizer.convert_tokens_to_ids(token)) for token in VISION_TOKENS]  # type: ignore[arg-type]
    head_dim = spec.hidden_size // spec.num_attention_heads
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": _mrope_section(head_dim),
        },
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=spec.tie_word_embeddings,
        rms_norm_eps=1e-6,
    )
    vision = tiny_vision_config(spec)
    tokens: dict[str, Any] = dict(image_token_id=ids[1], video_token_id=ids[3], vision_start_token_id=ids[0])
    tokens.update(vision_end_token_id=ids[2], tie_word_embeddings=spec.tie_word_embeddings)
    torch.manual_seed(spec.seed)
    model: PreTrainedModel
    if spec.arch is TinyArch.QWEN2_5_VL:
        config25 = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens)
        model = Qwen2_5_VLForConditionalGeneration(config25)  # type: ignore[no-untyped-call]  # unannotated
    else:
        config = Qwen2VLConfig(text_config=text, vision_config=vision, **tokens)
        model = Qwen2VLForConditionalGeneration(config)  # type: ignore[no-untyped-call]  # as above
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny_vlm(folder: str | Path, spec: TinyModelConfig) -> Path:
    """Tokenizer, image processor (and the processor's own config) and the tiny VLM of `spec` in `folder`."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = Path(folder)
    tokenizer = build_tiny_vision_tokenizer(spec)
    model = build_tiny_vlm(spec, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    images = Qwen2VLImageProcessorPil(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    images.save_pretrained(folder)
    processor = "Qwen2_5_VLProcessor" if spec.arch is TinyArch.QWEN2_5_VL else "Qwen2VLProcessor"
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": processor}, indent=2) + "\n")
    return folder
