"""What the planner's shape needs to know of a mixture-of-experts model: its config's expert fields, and the
LoRA adapters peft puts on its experts and router.

`moe_config_fields` reads a qwen3_moe, qwen2_moe or mixtral config into the fields of its attention's dense
kin (qwen3, qwen2, mistral: `model_shape.shape_from_config` sizes those) and the expert fields of
`ModelShape`: sparse layers are all of mixtral's, and a Qwen*-MoE's every `decoder_sparse_step`-th layer
not in `mlp_only_layers` (the others keep a dense MLP of `intermediate_size`, as transformers builds them).

LoRA:
With transformers 5 an MoE's experts are fused 3-D parameters (`experts.gate_up_proj` [E, 2I, H],
`experts.down_proj` [E, H, I]) and its router a plain parameter, not Linear modules. peft rewrites the
transformers-4 names in `target_modules` into `target_parameters` for the model types it knows
(`peft.utils.transformers_weight_conversion`: qwen2_moe and qwen3_moe from `gate_proj`/`up_proj`/
`down_proj`/`gate`, mixtral from `w1`/`w3`/`w2`/`gate`) and wraps each targeted parameter (`ParamWrapper`):

    gate_up_proj   both of its two names targeted: rank 2r per expert (alpha doubled: the same scaling),
                   A [E x 2r, H], B [2I, 2r x E]
    down_proj      rank r per expert: A [E x r, I], B [H, r x E]
    gate (router)  the [E, H] weight as one matrix of rank r: A [r, H], B [E, r]

The names it rewrites no longer target Linear modules, so a dense layer's MLP or a shared expert with those
names gets no adapter (the attention's q/k/v/o_proj keep theirs). One of gate_proj/up_proj without the
other is refused by peft ("they are fused").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quartet.planning.moe_layouts import LAYOUT_MODEL_TYPES, layout_fields

__all__ = ["MOE_LORA_NAMES", "moe_config_fields", "moe_lora_params"]

MOE_LORA_NAMES: dict[str, tuple[frozenset[str], str, str]] = {
    "qwen3_moe": (frozenset({"gate_proj", "up_proj"}), "down_proj", "gate"),
    "qwen2_moe": (frozenset({"gate_proj", "up_proj"}), "down_proj", "gate"),
    "mixtral": (frozenset({"w1", "w3"}), "w2", "gate"),
}
"""Per model type: the names fused into gate_up_proj, the name of down_proj, the router's name."""


def moe_lora_params(
    model_type: str,
    targets: set[str],
    rank: int,
    *,
    hidden: int,
    width: int,
    experts: int,
    layers: int,
) -> tuple[int, set[str]]:
    """Adapter parameters peft adds to the experts and routers of `layers` sparse layers for `targets`, and
    the target names it takes for them (they then target no Linear module). (0, empty) for another type."""
    names = MOE_LORA_NAMES.get(model_type)
    if names is None:
        return 0, set()
    fused, down, router = names
    taken = targets & (fused | {down, router})
    total = 0
    if fused <= targets:
        total += 2 * rank * experts * (hidden + 2 * width)
    if down in targets:
        total += rank * experts * (width + hidden)
    if router in targets:
        total += rank * (hidden + experts)
    return layers * total, taken


def moe_config_fields(
    config: Any, model_type: str, field: Callable[[Any, str, str], int]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the fields `shape_from_config` reads, as the attention's dense kin has them; the expert fields of
    `ModelShape`) of an MoE `config`. `field(config, name, model_type)` reads a required positive integer.
    gpt-oss and DeepSeek-V3 are read by `planning.moe_layouts`."""
    if model_type in LAYOUT_MODEL_TYPES:
        return layout_fields(config, model_type, field)
    mixtral = model_type == "mixtral"
    experts = field(config, "num_local_experts" if mixtral else "num_experts", model_type)
    width = field(config, "intermediate_size" if mixtral else "moe_intermediate_size", model_type)
    layers = field(config, "num_hidden_layers", model_type)
    if mixtral:
        sparse = layers
    else:
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        dense_only = set(getattr(config, "mlp_only_layers", None) or ())
        sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    kin = {"qwen3_moe": "qwen3", "mixtral": "mistral"}.get(model_type, "mistral")
    if model_type == "qwen2_moe" and bool(getattr(config, "qkv_bias", True)):  # q/k/v biases, as qwen2
        kin = "qwen2"
    names: tuple[str, ...] = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    names += ("vocab_size",)
    names += ("attention_bias", "tie_word_embeddings", "max_position_embeddings", "intermediate_size")
    attention = {name: getattr(config, name, None) for name in names}
    if mixtral or not attention["intermediate_size"]:  # no dense MLP of its own
        attention["intermediate_size"] = width
    attention.update(num_hidden_layers=layers, model_type=kin)
    moe: dict[str, Any] = dict(
        num_experts=experts,
        experts_per_token=field(config, "num_experts_per_tok", model_type),
        moe_intermediate_size=width,
        shared_expert_intermediate_size=int(getattr(config, "shared_expert_intermediate_size", 0) or 0),
        moe_layers=sparse,
    )
    return attention, moe
