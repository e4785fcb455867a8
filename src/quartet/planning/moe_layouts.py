"""The planner's reading of gpt-oss and DeepSeek-V3 configs: their attention as a Llama-style layout, plus
what differs (`model_shape.ModelShape`'s layout fields), so that the counts equal what transformers builds.

gpt-oss (`gpt_oss`): Llama's attention with biases on q/k/v/o (`attention_bias`) and one sink logit per
query head; every layer sparse, with a biased router (E x D + E) and biased experts stored transposed:

    experts.gate_up_proj  E x D x 2I  + bias E x 2I         I = intermediate_size (the expert's width)
    experts.down_proj     E x I x D   + bias E x D

DeepSeek-V3 (`deepseek_v3`): multi-head latent attention (MLA) in place of q/k/v/o, with H heads of
qk = nope + rope wide queries and keys and v wide values:

    q_a_proj D x Rq, q_a_layernorm Rq, q_b_proj Rq x H qk      (or q_proj D x H qk when q_lora_rank is null)
    kv_a_proj_with_mqa D x (Rkv + rope), kv_a_layernorm Rkv, kv_b_proj Rkv x H (nope + v)
    o_proj H v x D                                              (+ biases on q_a, kv_a, o: attention_bias)

the first `first_k_dense_replace` layers with the dense MLP of `intermediate_size`, the others sparse: a
router E x D (its `e_score_correction_bias` is a buffer, not a parameter), the fused experts (3 E D Im) and
`n_shared_experts` shared experts as one MLP of n_shared x Im, without a gate. Its cache holds per layer
and token the latent and the rotary key (Rkv + rope values, not 2 x H x qk): the KV-cache estimate uses it.
For activations the attention is sized as H heads of width qk (keys and values expanded, as transformers'
eager and sdpa paths compute them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["LAYOUT_MODEL_TYPES", "layout_fields"]

LAYOUT_MODEL_TYPES = ("gpt_oss", "deepseek_v3")
"""The `model_type`s read here."""

_ATTENTION = ("hidden_size", "num_attention_heads", "vocab_size", "tie_word_embeddings")


def layout_fields(
    config: Any, model_type: str, field: Callable[[Any, str, str], int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Llama-style fields `shape_from_config` reads; the expert and layout fields of `ModelShape`) of a
    gpt-oss or DeepSeek-V3 `config`. `field(config, name, model_type)` reads a required positive integer."""
    attention = {name: getattr(config, name, None) for name in _ATTENTION}
    layers = field(config, "num_hidden_layers", model_type)
    heads = field(config, "num_attention_heads", model_type)
    attention.update(
        num_hidden_layers=layers,
        max_position_embeddings=getattr(config, "max_position_embeddings", 0),
        model_type="llama",
    )
    experts = field(config, "num_local_experts", model_type)  # DeepSeek's n_routed_experts (attribute map)
    top_k = field(config, "num_experts_per_tok", model_type)
    moe: dict[str, Any] = dict(num_experts=experts, experts_per_token=top_k)
    if model_type == "gpt_oss":
        width = field(config, "intermediate_size", model_type)
        attention.update(
            num_key_value_heads=getattr(config, "num_key_value_heads", None),
            head_dim=getattr(config, "head_dim", None),
            attention_bias=bool(getattr(config, "attention_bias", True)),
            intermediate_size=width,
        )
        moe.update(moe_intermediate_size=width, moe_layers=layers, expert_biases=True, attention_sinks=True)
        return attention, moe
    width = field(config, "moe_intermediate_size", model_type)
    dense = min(int(getattr(config, "first_k_dense_replace", 0) or 0), layers)
    nope = field(config, "qk_nope_head_dim", model_type)
    rope = field(config, "qk_rope_head_dim", model_type)
    v = field(config, "v_head_dim", model_type)
    rkv = field(config, "kv_lora_rank", model_type)
    rq = int(getattr(config, "q_lora_rank", 0) or 0)
    d = field(config, "hidden_size", model_type)
    bias = bool(getattr(config, "attention_bias", False))
    q = d * rq + rq + rq * heads * (nope + rope) + (rq if bias else 0) if rq else d * heads * (nope + rope)
    kv = d * (rkv + rope) + (rkv + rope if bias else 0) + rkv + rkv * heads * (nope + v)
    o = heads * v * d + (d if bias else 0)
    attention.update(
        num_key_value_heads=heads,
        head_dim=nope + rope,
        attention_bias=False,
        intermediate_size=field(config, "intermediate_size", model_type),
    )
    moe.update(
        moe_intermediate_size=width,
        moe_layers=layers - dense,
        shared_expert_intermediate_size=width * int(getattr(config, "n_shared_experts", 0) or 0),
        shared_expert_gate=False,
        attention_layer_params=q + kv + o,
        kv_cache_width=rkv + rope,
    )
    return attention, moe
