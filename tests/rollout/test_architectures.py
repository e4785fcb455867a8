"""Greedy decoding matches transformers on each supported architecture (random in-process models)."""

from __future__ import annotations

import pytest
import torch
from rollout_cases import hf_greedy
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine, UnsupportedModelError

SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=None,
)


def build(model_cls: type[PreTrainedModel], config: object) -> PreTrainedModel:
    torch.manual_seed(0)
    model = model_cls(config)
    model.train(False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # 3-D: a mixture of experts' stacked weights [E, out, in]
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5)
    return model


@pytest.mark.parametrize(
    ("model_cls", "config"),
    [
        (LlamaForCausalLM, LlamaConfig(**SHAPE)),
        (Qwen3ForCausalLM, Qwen3Config(head_dim=16, **SHAPE)),  # q_norm / k_norm
        (MistralForCausalLM, MistralConfig(sliding_window=None, **SHAPE)),
        (  # a sparse MLP in every layer: 8 experts, 2 per token
            Qwen3MoeForCausalLM,
            Qwen3MoeConfig(
                head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, **SHAPE
            ),
        ),
    ],
    ids=["llama", "qwen3", "mistral", "qwen3_moe"],
)
def test_greedy_matches_generate(model_cls: type[PreTrainedModel], config: object) -> None:
    model = build(model_cls, config)
    prompts = [[5, 9, 33, 2, 7, 81], [3], [100, 101, 102]]
    expected = hf_greedy(model, prompts, 12, pad_id=0)
    assert all(len(set(e)) > 3 for e in expected)
    with TorchRolloutEngine(model, max_num_seqs=2) as eng:
        outs = eng.generate(
            [
                GenerationRequest(tuple(p), SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))
                for p in prompts
            ]
        )
    assert [list(o[0].token_ids) for o in outs] == expected


def test_other_architectures_are_refused() -> None:
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        TorchRolloutEngine(model)
