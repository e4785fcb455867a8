"""The planner's count of mixture-of-experts models against the models transformers builds on the meta device:
total parameters (every expert), active parameters per token, the value head, LoRA, and `quartet plan`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    DeepseekV3Config,
    GptOssConfig,
    MixtralConfig,
    PretrainedConfig,
    Qwen2MoeConfig,
    Qwen3MoeConfig,
)

from quartet.config.model import TinyArch, TinyModelConfig
from quartet.planning.model_shape import HeadKind, shape_from_config, shape_from_path, shape_from_tiny

COMMON: dict[str, Any] = dict(
    vocab_size=300, hidden_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
)
CONFIGS = {
    "qwen3_moe": lambda: Qwen3MoeConfig(
        **COMMON, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=20, intermediate_size=72,
        mlp_only_layers=[0], decoder_sparse_step=1, tie_word_embeddings=False,
    ),
    "qwen3_moe_step2": lambda: Qwen3MoeConfig(
        **COMMON, num_experts=5, num_experts_per_tok=3, moe_intermediate_size=12, intermediate_size=40,
        decoder_sparse_step=2, attention_bias=True, head_dim=16,
    ),
    "qwen2_moe": lambda: Qwen2MoeConfig(
        **COMMON, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=20, intermediate_size=72,
        shared_expert_intermediate_size=56, mlp_only_layers=[3],
    ),
    "mixtral": lambda: MixtralConfig(
        **COMMON, num_local_experts=4, num_experts_per_tok=2, intermediate_size=24
    ),
    "gpt_oss": lambda: GptOssConfig(  # biased attention, sinks, biased router and experts
        **COMMON, head_dim=16, num_local_experts=6, num_experts_per_tok=2, intermediate_size=20,
        tie_word_embeddings=False,
    ),
    "deepseek_v3": lambda: DeepseekV3Config(  # MLA with a query low rank; 1 dense layer; 2 shared experts
        **{**COMMON, "num_key_value_heads": 4}, intermediate_size=72, moe_intermediate_size=20,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10,
        n_shared_experts=2,
    ),
    "deepseek_v3_q_proj": lambda: DeepseekV3Config(  # q_proj (no query low rank), biases, 2 dense layers
        **{**COMMON, "num_key_value_heads": 4}, intermediate_size=72, moe_intermediate_size=20,
        n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1, first_k_dense_replace=2,
        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10,
        attention_bias=True, tie_word_embeddings=True,
    ),
}  # fmt: skip


def _meta(config: PretrainedConfig, auto: Any = AutoModelForCausalLM) -> torch.nn.Module:
    with torch.device("meta"):
        return auto.from_config(config)  # type: ignore[no-any-return]


def _idle_expert_params(model: torch.nn.Module, config: Any) -> int:
    """Parameters of the experts one token does not run: (E - k) / E of every experts module's weights."""
    experts = getattr(config, "num_experts", None) or config.num_local_experts
    idle = experts - config.num_experts_per_tok
    total = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert total % experts == 0
    return total // experts * idle


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_total_active_and_value_params_equal_the_built_model(name: str) -> None:
    config = CONFIGS[name]()
    shape = shape_from_config(config)
    model = _meta(config)
    total = sum(p.numel() for p in model.parameters())
    assert shape.is_moe and shape.total_params == total
    assert shape.active_params == total - _idle_expert_params(model, config)
    assert shape.active_params < shape.total_params
    config.num_labels = 1
    value = _meta(config, AutoModelForTokenClassification)
    assert shape.params(HeadKind.VALUE) == sum(p.numel() for p in value.parameters())
    largest = max(p.numel() for p in model.model.layers.parameters())
    assert shape.expert_tensor_params == largest


def test_the_tiny_moe_shape_equals_its_saved_folder(moe_model_dir: Path) -> None:
    # `moe_model_dir`'s spec (tests/conftest.py: TINY_MOE)
    spec = TinyModelConfig(TinyArch.QWEN3_MOE, hidden_size=32, num_hidden_layers=2, num_experts=4)
    saved = shape_from_path(moe_model_dir)
    model = AutoModelForCausalLM.from_pretrained(moe_model_dir)
    assert saved.total_params == sum(p.numel() for p in model.parameters())
    tiny = shape_from_tiny(spec)
    # The tiny shape counts at model.tiny.vocab_size (an upper bound of the trained vocabulary).
    assert tiny.total_params - saved.total_params == (tiny.vocab_size - saved.vocab_size) * spec.hidden_size
    assert (tiny.active_params, tiny.moe_layers, tiny.qk_norm) == (
        tiny.total_params - 2 * 2 * 3 * 32 * 64,  # 2 layers x 2 idle experts x gate/up/down 32 x 64
        2,
        True,
    )


def test_quartet_plan_prints_total_and_active(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from quartet.cli.main import main

    overrides = ["model.tiny.arch=qwen3_moe", "model.tiny.num_experts=8", f"trainer.output_dir={tmp_path}"]
    main(["plan", *overrides, "--json"])
    out = json.loads(capsys.readouterr().out)["model"]
    shape = shape_from_tiny(TinyModelConfig(arch=TinyArch.QWEN3_MOE, num_experts=8))
    assert (out["params"], out["active_params"]) == (shape.total_params, shape.active_params)
    main(["plan", *overrides])
    first = capsys.readouterr().out.splitlines()[0]
    assert f"{shape.total_params:,} parameters, {shape.active_params:,} active per token: 2 of 8" in first


def test_the_tiny_gpt_oss_and_deepseek_shapes_equal_their_saved_folders(moe_shape_dir: Path) -> None:
    """`moe_shape_dir`'s spec (tests/tiny_shapes.py) counted before the model exists, against the
    saved model (the tiny shape counts at model.tiny.vocab_size, an upper bound of the trained vocabulary)."""
    from tiny_shapes import tiny_shape_spec

    arch = json.loads((moe_shape_dir / "config.json").read_text())["model_type"]
    spec = tiny_shape_spec(arch)
    model = AutoModelForCausalLM.from_pretrained(moe_shape_dir)
    total = sum(p.numel() for p in model.parameters())
    assert shape_from_path(moe_shape_dir).total_params == total
    tiny = shape_from_tiny(spec)
    assert tiny.total_params - total == (tiny.vocab_size - model.config.vocab_size) * spec.hidden_size
    assert tiny.active_params == tiny.total_params - _idle_expert_params(model, model.config)


def test_the_kv_cache_estimate_is_what_transformers_caches(moe_shape_dir: Path) -> None:
    """Bytes per token of the cache a forward with `use_cache` fills: gpt-oss's keys and values (its
    sliding layers hold at most the window: the prompt here fits in it), DeepSeek-V3's latent and rotary
    key (MLA caches those, not the expanded keys and values)."""
    model = AutoModelForCausalLM.from_pretrained(moe_shape_dir)
    tokens = 6
    with torch.no_grad():
        cache = model(torch.arange(10, 10 + tokens)[None], use_cache=True).past_key_values
    cached = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) * 4
    assert shape_from_path(moe_shape_dir).kv_bytes_per_token(4) == cached // tokens
