"""Tiny models of real transformers architectures, with a tokenizer trained here, for tests and the demo.

Nothing is downloaded: a byte-level BPE tokenizer trained here (`quartet.models.tiny_tokenizer`, with a
ChatML chat template) is saved next to a randomly initialised Qwen2, Llama or mixture-of-experts causal LM
(Qwen3-MoE, gpt-oss, DeepSeek-V3; or a Qwen2-VL,
`quartet.models.tiny_vision`). Everything is then loaded back through the ordinary
`AutoTokenizer.from_pretrained` / `AutoModelForCausalLM.from_pretrained` path, like a downloaded checkpoint.
`resolve_model` picks the folder a run trains: `model.path`, or this tiny model when the path is empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from quartet.config import QuartetConfig
from quartet.config.model import TinyArch, TinyModelConfig
from quartet.models.loading import load_value_model
from quartet.models.tiny_tokenizer import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    TOKENIZER_REVISION,
    build_tiny_tokenizer,
)
from quartet.models.tiny_vision import save_tiny_vlm

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "build_tiny_causal_lm",
    "build_tiny_tokenizer",
    "ensure_tiny_model",
    "resolve_model",
    "save_tiny_model",
    "save_value_model",
    "tiny_shape_config",
]


def _common(spec: TinyModelConfig, vocab: int, eos: int | None, pad: int | None) -> dict[str, Any]:
    """The config fields every architecture of the kit shares."""
    return dict(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
    )


def tiny_shape_config(spec: TinyModelConfig) -> Any:
    """The transformers config of a tiny gpt-oss or DeepSeek-V3 of `spec` at `vocab_size` (what the planner
    sizes before the tokenizer exists: the trained vocabulary is at most that)."""
    common = _common(spec, spec.vocab_size, None, None)
    if spec.arch is TinyArch.GPT_OSS:
        return _gpt_oss_config(spec, common)
    if spec.arch is TinyArch.DEEPSEEK_V3:
        return _deepseek_v3_config(spec, common)
    raise ValueError(f"tiny_shape_config builds gpt_oss and deepseek_v3 configs, not {spec.arch}")


def build_tiny_causal_lm(spec: TinyModelConfig, tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    """A randomly initialised causal LM of `spec`'s architecture and shape, sized to the tokenizer."""
    common = _common(spec, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(spec.seed)
    model: PreTrainedModel
    if spec.arch is TinyArch.QWEN2:
        model = Qwen2ForCausalLM(Qwen2Config(**common))  # type: ignore[no-untyped-call]  # as above
    elif spec.arch is TinyArch.QWEN3_MOE:
        moe = Qwen3MoeConfig(  # the head size is hidden_size / num_attention_heads, as for the others
            **common,
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.num_experts_per_tok,
            moe_intermediate_size=spec.moe_intermediate_size,
            decoder_sparse_step=1,  # every layer's MLP is sparse
            norm_topk_prob=True,  # the chosen experts' weights sum to 1, as Qwen3-30B-A3B's config says
        )
        model = Qwen3MoeForCausalLM(moe)  # type: ignore[no-untyped-call]  # as above
    elif spec.arch is TinyArch.GPT_OSS:
        model = GptOssForCausalLM(_gpt_oss_config(spec, common))  # type: ignore[no-untyped-call]  # as above
    elif spec.arch is TinyArch.DEEPSEEK_V3:
        model = _deepseek_v3(spec, common)
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))  # type: ignore[no-untyped-call]  # as above
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


GPT_OSS_WINDOW = 8
"""The tiny gpt-oss's sliding window (tokens): short, so that the test rows reach past it."""


def _gpt_oss_config(spec: TinyModelConfig, common: dict[str, Any]) -> GptOssConfig:
    """gpt-oss's shape: `intermediate_size` is each expert's width there (it has no dense MLP)."""
    return GptOssConfig(
        **{**common, "intermediate_size": spec.moe_intermediate_size},
        head_dim=spec.hidden_size // spec.num_attention_heads,
        num_local_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        sliding_window=GPT_OSS_WINDOW,  # layers alternate: sliding (even), full (odd), as gpt-oss's
        rope_parameters={  # YaRN as gpt-oss's (factor 32 over 4,096 there), over the tiny model's length
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": max(spec.max_position_embeddings // 4, 1),
        },
    )


def _deepseek_v3(spec: TinyModelConfig, common: dict[str, Any]) -> PreTrainedModel:
    """DeepSeek-V3's shape, small: MLA with a query low-rank projection, the first layer dense, one shared
    expert, 2 expert groups of which each token's top-k come from 1. The score correction bias (a buffer
    that DeepSeek adjusts outside the gradient to balance the load) is drawn at random, so the routers'
    choice differs from the top-k of their own scores as in a trained model."""
    model = DeepseekV3ForCausalLM(_deepseek_v3_config(spec, common))  # type: ignore[no-untyped-call]  # unannotated
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.05)
    return model


def _deepseek_v3_config(spec: TinyModelConfig, common: dict[str, Any]) -> DeepseekV3Config:
    """The tiny DeepSeek-V3's config (`_deepseek_v3`)."""
    head_dim = spec.hidden_size // spec.num_attention_heads
    return DeepseekV3Config(
        **{**common, "num_key_value_heads": spec.num_attention_heads},  # MLA: one latent, every head
        moe_intermediate_size=spec.moe_intermediate_size,
        n_routed_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        n_shared_experts=1,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=2 * head_dim,
        q_lora_rank=2 * head_dim,
        qk_rope_head_dim=head_dim // 2,  # queries and keys 1.5 x the values' width, as V3's 192 and 128
        qk_nope_head_dim=head_dim,
        v_head_dim=head_dim,
        norm_topk_prob=True,
    )


def save_tiny_model(folder: str | Path, spec: TinyModelConfig | None = None) -> Path:
    """Build tokenizer and causal LM of `spec` and `save_pretrained` both into `folder`."""
    spec = spec or TinyModelConfig()
    if spec.arch.is_vision:
        return save_tiny_vlm(folder, spec)
    folder = Path(folder)
    tokenizer = build_tiny_tokenizer(spec.vocab_size, spec.seed)
    model = build_tiny_causal_lm(spec, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def save_value_model(causal_lm_folder: str | Path, folder: str | Path) -> Path:
    """Save to `folder` a value model: the causal LM's trunk and a fresh scalar head (one value per token).

    It is transformers' token-classification model with one label, the layout verl's critics use, so it
    loads with `AutoModelForTokenClassification.from_pretrained(folder)` (or `load_value_model`). A
    vision-language folder gives a `models.vision_value` model (the same call loads it once that module is
    imported) and keeps its image processor's files.
    """
    model = load_value_model(causal_lm_folder)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "preprocessor_config.json",
        "processor_config.json",
    ):
        src = Path(causal_lm_folder) / name
        if src.exists():
            shutil.copy(src, folder / name)
    return folder


def ensure_tiny_model(spec: TinyModelConfig, root: str | Path) -> Path:
    """The folder of the tiny model of `spec` under `root`, building it once (keyed by the spec's hash).

    The folder is written under a temporary name and renamed, so concurrent callers and interrupted builds
    never leave a half-written model behind.
    """
    key = {**dataclasses.asdict(spec), "tokenizer_revision": TOKENIZER_REVISION}
    blob = json.dumps(key, sort_keys=True, default=str).encode()
    folder = Path(root) / f"tiny-{spec.arch.value}-{hashlib.sha256(blob).hexdigest()[:12]}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        save_tiny_model(tmp, spec)
        tmp.rename(folder)
    except OSError:
        if not (folder / "config.json").exists():  # not a lost race with another builder
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def resolve_model(cfg: QuartetConfig) -> str:
    """`model.path`, or the tiny model of `model.tiny` built once under `<output_dir>/models` (RL and SFT)."""
    if cfg.model.path:
        return cfg.model.path
    return str(ensure_tiny_model(cfg.model.tiny, Path(cfg.trainer.output_dir) / "models"))
