"""The shape of a decoder-only transformer, read from its config alone: what the memory planner sizes.

Supported: Llama-style decoders as transformers builds them (`llama`, `mistral`, `qwen2`, `qwen3`), which
are also what the built-in rollout engine runs, and their mixture-of-experts kin (below). Every layer holds

    q_proj  D x (H * hd)   [+ bias]        input_layernorm           D
    k_proj  D x (K * hd)   [+ bias]        post_attention_layernorm  D
    v_proj  D x (K * hd)   [+ bias]        q_norm, k_norm            hd each (qwen3 only)
    o_proj  (H * hd) x D   [+ bias]
    gate_proj, up_proj  D x I,  down_proj  I x D   [+ bias]

around an embedding V x D, a final norm D and an output head V x D (none when tied to the embedding).
D = hidden_size, I = intermediate_size, H / K = query / key-value heads, hd = head_dim, V = vocab_size.
Biases: qwen2 has them on q/k/v (hard-wired in transformers), llama/qwen3/mistral follow
`attention_bias` (all four projections) and llama `mlp_bias`.

The heads the engines load change the top only: a value model (critic) has no output head but a
`score` Linear(D, 1) with bias; a reward model a `score` Linear(D, 1) without bias.

Mixture-of-experts models (`qwen3_moe`, `qwen2_moe`, `mixtral`; `gpt_oss` and `deepseek_v3` as
`planning.moe_layouts` reads them; docs/moe.md): the attention as above
(qwen3_moe has qwen3's q/k norms and `attention_bias`, qwen2_moe `qkv_bias`, mixtral none), and in each sparse
layer (all of mixtral's; qwen*_moe: every `decoder_sparse_step`-th layer not in `mlp_only_layers`, the
others keep the dense MLP of `intermediate_size`) instead of the dense MLP

    router (gate)              E x D               E = num_experts (mixtral: num_local_experts)
    experts.gate_up_proj       E x 2 Im x D        Im = moe_intermediate_size (mixtral: intermediate_size)
    experts.down_proj          E x D x Im
    shared_expert (qwen2_moe)  gate/up/down of Is = shared_expert_intermediate_size, and its gate D x 1

Weights, gradients and optimizer states are sized by the total (`total_params`, every expert); what one
token computes, hence activations, by the active part (`active_params`: k = num_experts_per_tok experts of
each sparse layer, the router, the shared expert and everything outside the MLPs; `mlp_width` = k Im + Is).

Vision-language models (`qwen2_vl`, `qwen2_5_vl`): the language model is sized as above from the config's
`text_config` (Qwen2's layout), and the vision tower's parameters (`vision_params`) are counted by building
it on the meta device (no memory), its block sizes read into `vision` (`planning.vision`, which sizes its
activations). Image tokens are prompt tokens (`data.max_prompt_length` counts them). A value model on a
VLM keeps the tower (`models.vision_value`).

Counting from the config (never from weights) keeps planning free: a 70B config plans in microseconds.
Any other architecture is refused with `UnknownModelShapeError` rather than sized wrongly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from quartet.config.model import LoraConfig, ModelConfig, TinyArch, TinyModelConfig
from quartet.planning.moe import MOE_LORA_NAMES, moe_config_fields, moe_lora_params
from quartet.planning.vision import VisionShape, vision_shape_of

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HeadKind",
    "MOE_MODEL_TYPES",
    "ModelShape",
    "VISION_MODEL_TYPES",
    "UnknownModelShapeError",
    "policy_shape",
    "shape_from_config",
    "shape_from_path",
    "shape_from_tiny",
]

MOE_MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "deepseek_v3")
"""The mixture-of-experts `model_type`s (fused expert weights and a top-k router per sparse layer)."""

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_vl", "qwen2_5_vl", *MOE_MODEL_TYPES)
"""transformers `model_type`s whose parameter layout this module knows."""

VISION_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
"""The vision-language `model_type`s (the tiny VLM's shape carries them too)."""

_LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class UnknownModelShapeError(ValueError):
    """A model config the planner cannot size (unknown architecture or missing fields)."""


class HeadKind(StrEnum):
    """What sits on top of the decoder trunk (as the training engine loads it)."""

    CAUSAL_LM = "causal_lm"  # output head V x D (or tied to the embedding)
    VALUE = "value"  # token classification, one label: score D x 1 + bias (the critic)
    REWARD = "reward"  # sequence classification, one label: score D x 1, no bias


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a Llama-style decoder; parameter counts are derived (see the module doc)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 0
    vision_params: int = 0
    """Parameters of a vision-language model's vision tower (0 for text models)."""
    vision: VisionShape | None = None
    """A vision-language model's tower sizes (None for text models)."""
    num_experts: int = 0
    """Routed experts of each sparse (MoE) layer; 0 for a dense model."""
    experts_per_token: int = 0
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: int = 0
    """Width of one expert's MLP."""
    shared_expert_intermediate_size: int = 0
    """Width of the shared expert every token runs (qwen2_moe); 0: none."""
    moe_layers: int = 0
    """Decoder layers whose MLP is sparse; the other layers have the dense MLP of `intermediate_size`."""
    shared_expert_gate: bool = True
    """The shared expert has a sigmoid gate D x 1 (qwen2_moe; DeepSeek's has none)."""
    expert_biases: bool = False
    """Biases on every expert's gate/up (2 Im) and down (D) and on the router (E): gpt-oss."""
    attention_sinks: bool = False
    """One learned sink logit per query head in every layer: gpt-oss."""
    attention_layer_params: int = 0
    """One layer's attention parameters where it is not q/k/v/o_proj (DeepSeek's MLA, with its latent norms
    and biases; `planning.moe_layouts`); 0: q/k/v/o as above."""
    kv_cache_width: int = 0
    """Values one token caches per layer where it is not keys and values of kv heads (MLA: its latent and
    rotary key); 0: 2 x kv_dim."""

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model (some layer routes tokens to experts)."""
        return self.moe_layers > 0

    @property
    def dense_layers(self) -> int:
        """Decoder layers with the dense MLP."""
        return self.num_layers - self.moe_layers

    @property
    def mlp_width(self) -> int:
        """The MLP width one token runs through in the widest layer: `intermediate_size` for a dense layer,
        k x `moe_intermediate_size` + the shared expert's for a sparse one (what activations scale with)."""
        active = self.experts_per_token * self.moe_intermediate_size + self.shared_expert_intermediate_size
        return max(self.intermediate_size if self.dense_layers else 0, active if self.is_moe else 0)

    @property
    def expert_tensor_params(self) -> int:
        """The largest single parameter of a sparse layer: the fused gate/up weights of all its experts."""
        return self.num_experts * 2 * self.moe_intermediate_size * self.hidden_size if self.is_moe else 0

    def _moe_mlp_params(self, experts: int) -> int:
        """A sparse layer's MLP holding `experts` of its experts: those, the router, the shared expert."""
        d = self.hidden_size
        shared = 3 * d * self.shared_expert_intermediate_size
        shared += d if self.shared_expert_intermediate_size and self.shared_expert_gate else 0  # D x 1
        router = self.num_experts * (d + 1 if self.expert_biases else d)
        return experts * self._expert_params + router + shared

    @property
    def _expert_params(self) -> int:
        """One expert's parameters: gate/up and down (with gpt-oss's biases)."""
        biases = 2 * self.moe_intermediate_size + self.hidden_size if self.expert_biases else 0
        return 3 * self.hidden_size * self.moe_intermediate_size + biases

    def _attention_linear_params(self) -> int:
        d = self.hidden_size
        return self.attention_layer_params or 2 * d * self.q_dim + 2 * d * self.kv_dim

    @property
    def q_dim(self) -> int:
        """Width of the query projection output: heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection output: kv heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    def linear_modules(self) -> list[tuple[str, int, int, int]]:
        """(name, in_features, out_features, layers holding it) of each `nn.Linear` of the decoder layers:
        what LoRA can adapt. A sparse layer's experts and router are 3-D or plain parameters, not Linear
        modules: only the dense layers' MLP (and qwen2_moe's shared expert) have gate/up/down_proj."""
        d, n = self.hidden_size, self.num_layers
        out = [("q_proj", d, self.q_dim, n), ("k_proj", d, self.kv_dim, n), ("v_proj", d, self.kv_dim, n)]
        out.append(("o_proj", self.q_dim, d, n))
        widths = (
            (self.intermediate_size, self.dense_layers),
            (self.shared_expert_intermediate_size, self.moe_layers),
        )
        for width, layers in widths:
            if width and layers:
                out += [("gate_proj", d, width, layers), ("up_proj", d, width, layers)]
                out.append(("down_proj", width, d, layers))
        if self.shared_expert_intermediate_size and self.moe_layers:  # the shared expert's gate, D x 1
            out.append(("shared_expert_gate", d, 1, self.moe_layers))
        return out

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear module of one decoder layer (a dense one where a
        model has both kinds)."""
        shapes: dict[str, tuple[int, int]] = {}
        for name, fan_in, fan_out, _ in self.linear_modules():
            shapes.setdefault(name, (fan_in, fan_out))
        return shapes

    @property
    def layer_linear_params(self) -> int:
        """Weights (no biases) that run through matrix products in the largest decoder layer (a sparse
        layer's with all its experts and its router)."""
        dense = 3 * self.hidden_size * self.intermediate_size if self.dense_layers else 0
        sparse = self._moe_mlp_params(self.num_experts) if self.is_moe else 0
        return self._attention_linear_params() + max(dense, sparse)

    @property
    def layers_linear_params(self) -> int:
        """`layer_linear_params` summed over all decoder layers."""
        dense = self.dense_layers * 3 * self.hidden_size * self.intermediate_size
        sparse = self.moe_layers * self._moe_mlp_params(self.num_experts) if self.is_moe else 0
        return self.num_layers * self._attention_linear_params() + dense + sparse

    @property
    def _layer_small_params(self) -> int:
        """Biases and norms of one decoder layer."""
        biases = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        biases += self.hidden_size if self.o_bias else 0
        biases += (2 * self.intermediate_size + self.hidden_size) if self.mlp_bias else 0
        sinks = self.num_heads if self.attention_sinks else 0
        return biases + 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0) + sinks

    @property
    def layer_params(self) -> int:
        """All parameters of the largest decoder layer (what FSDP gathers for one layer)."""
        return self.layer_linear_params + self._layer_small_params

    @property
    def layers_params(self) -> int:
        """All parameters of all decoder layers."""
        return self.layers_linear_params + self.num_layers * self._layer_small_params

    @property
    def embedding_params(self) -> int:
        """Input embedding plus an untied output head (both V x D)."""
        untied_head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.vocab_size * self.hidden_size + untied_head

    @property
    def non_embedding_params(self) -> int:
        """Decoder layers and the final norm (the causal LM's total minus `embedding_params`)."""
        return self.layers_params + self.hidden_size

    @property
    def total_params(self) -> int:
        """Parameters of the causal LM (tied weights counted once, as `model.parameters()` does), a VLM's
        vision tower included."""
        return self.embedding_params + self.non_embedding_params + self.vision_params

    @property
    def active_params(self) -> int:
        """Parameters one token computes with: `total_params` less the experts a sparse layer does not route
        it to (num_experts - num_experts_per_tok of each). A dense model's equal its total."""
        if not self.is_moe:
            return self.total_params
        idle = self.num_experts - self.experts_per_token
        return self.total_params - self.moe_layers * idle * self._expert_params

    def params(self, head: HeadKind = HeadKind.CAUSAL_LM) -> int:
        """Parameters of the model loaded with `head` on the trunk."""
        trunk = self.vocab_size * self.hidden_size + self.non_embedding_params + self.vision_params
        if head is HeadKind.CAUSAL_LM:
            return self.total_params
        return trunk + self.hidden_size + (1 if head is HeadKind.VALUE else 0)

    def linear_params(self, head: HeadKind = HeadKind.CAUSAL_LM) -> int:
        """Weights that run through matrix products (layers' linears and the output head or score).

        These are what autocast casts to half precision (the embedding lookup is not autocast).
        """
        top = self.vocab_size * self.hidden_size if head is HeadKind.CAUSAL_LM else self.hidden_size
        return self.layers_linear_params + top

    def lora_params(self, lora: LoraConfig) -> int:
        """Adapter parameters (A: r x in, B: out x r) that peft adds for `lora` (0 when rank is 0); on an MoE
        model's experts and router as `planning.moe_lora` says."""
        if lora.rank <= 0:
            return 0
        modules = self.linear_modules()
        targets = set(lora.target_modules)
        fused = MOE_LORA_NAMES.get(self.model_type) if self.is_moe else None
        if "all-linear" in targets:  # peft's shorthand: every linear layer except the output head
            targets = (targets - {"all-linear"}) | set(_LAYER_LINEARS) | {m for m, *_ in modules}
            targets |= (
                set(fused[0]) | {fused[1], fused[2]} if fused else set()
            )  # were Linear in transformers 4
        total, taken = moe_lora_params(
            self.model_type,
            targets,
            lora.rank,
            hidden=self.hidden_size,
            width=self.moe_intermediate_size,
            experts=self.num_experts,
            layers=self.moe_layers,
        )
        known = set(_LAYER_LINEARS) | {m for m, *_ in modules}
        for name in sorted(targets - taken):
            if name in known:  # an MoE model's sparse layers have no gate/up/down_proj: none there
                found = [(i, o, n) for m, i, o, n in modules if m == name]
                total += sum(n * lora.rank * (fan_in + fan_out) for fan_in, fan_out, n in found)
            elif name == "lm_head":
                total += lora.rank * (self.hidden_size + self.vocab_size)
            else:
                raise UnknownModelShapeError(
                    f"LoRA target module '{name}' is not a linear module of a {self.model_type} model; "
                    f"known: {', '.join(sorted(known))}, lm_head, all-linear"
                )
        return total

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes of one token: layers x 2 (key, value) x kv heads x head_dim x dtype bytes (MLA:
        layers x its latent and rotary key, `kv_cache_width`)."""
        return self.num_layers * (self.kv_cache_width or 2 * self.kv_dim) * dtype_bytes


def _field(config: Any, name: str, model_type: str) -> int:
    value = getattr(config, name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UnknownModelShapeError(
            f"the {model_type} config has no positive integer '{name}' (got {value!r}); "
            "the planner sizes models from hidden_size, intermediate_size, num_hidden_layers, "
            "num_attention_heads and vocab_size"
        )
    return value


def _check_model_type(model_type: str) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnknownModelShapeError(
            f"cannot plan memory for model_type '{model_type or '?'}': the planner knows the parameter "
            f"layout of {', '.join(SUPPORTED_MODEL_TYPES)} only; other architectures (mixture of experts, "
            "fused projections, multimodal) would be sized wrongly"
        )


def shape_from_config(config: Any) -> ModelShape:
    """The shape of a transformers `PretrainedConfig` (or any object with the same attributes).

    Raises `UnknownModelShapeError` for an architecture outside `SUPPORTED_MODEL_TYPES`.
    """
    model_type = str(getattr(config, "model_type", "") or "")
    _check_model_type(model_type)
    if model_type in VISION_MODEL_TYPES:
        text = shape_from_config(_as_qwen2(config.text_config))
        params = _vision_params(config)
        vision = vision_shape_of(model_type, config.vision_config, params)
        return replace(text, model_type=model_type, vision_params=params, vision=vision)
    if model_type in MOE_MODEL_TYPES:
        return _moe_shape(config, model_type)
    hidden = _field(config, "hidden_size", model_type)
    heads = _field(config, "num_attention_heads", model_type)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention_bias = bool(getattr(config, "attention_bias", False))
    return ModelShape(
        model_type=model_type,
        vocab_size=_field(config, "vocab_size", model_type),
        hidden_size=hidden,
        intermediate_size=_field(config, "intermediate_size", model_type),
        num_layers=_field(config, "num_hidden_layers", model_type),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=attention_bias and model_type != "qwen2",
        mlp_bias=bool(getattr(config, "mlp_bias", False)) and model_type == "llama",
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 0) or 0),
    )


def _moe_shape(config: Any, model_type: str) -> ModelShape:
    """A mixture-of-experts config: its attention (and dense MLP) as its dense kin's, then its experts."""
    attention, experts = moe_config_fields(config, model_type, _field)
    return replace(shape_from_config(SimpleNamespace(**attention)), model_type=model_type, **experts)


def _as_qwen2(text_config: Any) -> Any:
    """A VLM's text config read with Qwen2's layout (biases on q/k/v)."""
    fields = {k: getattr(text_config, k, None) for k in ("hidden_size", "num_attention_heads", "vocab_size")}
    fields.update({k: getattr(text_config, k, None) for k in ("intermediate_size", "num_hidden_layers")})
    fields.update(num_key_value_heads=getattr(text_config, "num_key_value_heads", None), model_type="qwen2")
    fields.update(tie_word_embeddings=getattr(text_config, "tie_word_embeddings", False))
    fields.update(max_position_embeddings=getattr(text_config, "max_position_embeddings", 0))
    return SimpleNamespace(**fields)


def _vision_params(config: Any) -> int:
    """The vision tower's parameters, from the model built on the meta device (no memory, no init)."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)  # type: ignore[no-untyped-call]
    return sum(p.numel() for p in model.model.visual.parameters())


def shape_from_path(path: str | Path) -> ModelShape:
    """The shape of the model saved in folder `path` (or of the `config.json` file itself); weights unread.

    The file is parsed by transformers' `AutoConfig`, so defaults missing from the file are the library's.
    """
    target = Path(path).expanduser()
    config_file = target / "config.json" if target.is_dir() else target
    if not config_file.is_file():
        raise UnknownModelShapeError(f"no config.json at '{path}' (looked for {config_file})")
    # Refuse unknown architectures before transformers looks for their config class.
    _check_model_type(str(json.loads(config_file.read_text()).get("model_type", "")))
    from transformers import AutoConfig

    return shape_from_config(AutoConfig.from_pretrained(config_file, local_files_only=True))


def _tiny_vision(spec: TinyModelConfig) -> tuple[int, VisionShape]:
    """Parameters and shape of the tiny VLM's vision tower (`models.tiny_vision`), built on the meta device
    under a one-layer text model."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    from quartet.models.tiny_vision import tiny_vision_config

    head_dim = spec.hidden_size // spec.num_attention_heads
    text: dict[str, Any] = dict(hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size)
    text.update(num_hidden_layers=1, bos_token_id=None, eos_token_id=None)
    text.update(num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads)
    sections = [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]
    text.update(
        vocab_size=spec.vocab_size, rope_parameters={"rope_type": "default", "mrope_section": sections}
    )
    kind = Qwen2_5_VLConfig if spec.arch is TinyArch.QWEN2_5_VL else Qwen2VLConfig
    config = kind(text_config=text, vision_config=tiny_vision_config(spec))
    params = _vision_params(config)
    return params, vision_shape_of(spec.arch.value, config.vision_config, params)


def shape_from_tiny(spec: TinyModelConfig) -> ModelShape:
    """The shape of the tiny model `quartet.models.tiny` builds from `spec` (a tiny VLM's with its tower).

    Its vocabulary is `len(tokenizer)` of a BPE trained on generated text, which stops short of large
    `vocab_size` targets (about 523 tokens at most); `vocab_size` is used as the upper bound.
    """
    if spec.arch in (TinyArch.GPT_OSS, TinyArch.DEEPSEEK_V3):
        from quartet.models.tiny import tiny_shape_config  # transformers' config classes

        return shape_from_config(tiny_shape_config(spec))
    vision_params, vision = _tiny_vision(spec) if spec.arch.is_vision else (0, None)
    return ModelShape(
        model_type=spec.arch.value,
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_layers=spec.num_hidden_layers,
        num_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads,
        tie_word_embeddings=spec.tie_word_embeddings,
        qkv_bias=spec.arch in (TinyArch.QWEN2, TinyArch.QWEN2_VL, TinyArch.QWEN2_5_VL),
        qk_norm=spec.arch is TinyArch.QWEN3_MOE,
        max_position_embeddings=spec.max_position_embeddings,
        vision_params=vision_params,
        vision=vision,
        **_tiny_moe(spec),
    )


def _tiny_moe(spec: TinyModelConfig) -> dict[str, Any]:
    """The MoE fields of the tiny Qwen3-MoE (`models.tiny`: every layer sparse, no shared expert)."""
    if not spec.arch.is_moe:
        return {}
    return dict(
        num_experts=spec.num_experts,
        experts_per_token=spec.num_experts_per_tok,
        moe_intermediate_size=spec.moe_intermediate_size,
        moe_layers=spec.num_hidden_layers,
    )


def policy_shape(model: ModelConfig) -> ModelShape:
    """The shape of the run's policy: `model.path`'s config.json, else the tiny model of `model.tiny`."""
    return shape_from_path(model.path) if model.path else shape_from_tiny(model.tiny)
