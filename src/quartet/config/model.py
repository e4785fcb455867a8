"""The policy model: a local Hugging Face folder, or a tiny model built in-process."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from quartet.config.errors import ConfigError, require
from quartet.config.moe_shapes import shape_problems
from quartet.config.parallel import (
    expert_problems,
    head_problems,
    layout_problems,
    moe_problems,
    vision_problem,
)

__all__ = ["Dtype", "LoraConfig", "ModelConfig", "TinyArch", "TinyModelConfig"]


class Dtype(StrEnum):
    """Floating point type of weights or compute."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    AUTO = "auto"
    """`<role>.mixed_precision` only: bfloat16 where this machine computes it faster than float32, else
    float32, measured once per machine (`quartet.engines.precision`; `quartet doctor` shows the figures)."""


class TinyArch(StrEnum):
    """Real transformers architectures the tiny-model kit can build."""

    QWEN2 = "qwen2"
    LLAMA = "llama"
    QWEN2_VL = "qwen2_vl"
    """Qwen2-VL: the tiny Qwen2 text model with a two-block vision tower (docs/vision.md)."""
    QWEN2_5_VL = "qwen2_5_vl"
    """Qwen2.5-VL: as `qwen2_vl` with Qwen2.5-VL's windowed vision tower."""
    QWEN3_MOE = "qwen3_moe"
    """Qwen3-MoE: Qwen3's attention (q/k norms) with a sparse mixture-of-experts MLP in every layer
    (`num_experts`, `num_experts_per_tok`, `moe_intermediate_size`; docs/moe.md)."""
    GPT_OSS = "gpt_oss"
    """gpt-oss: attention with sinks, sliding-window layers alternating with full ones (window 8 tokens in
    the tiny model), biased experts with a clamped SwiGLU and a biased softmax router; every layer sparse.
    Not decoded by the built-in rollout engine (docs/moe.md)."""
    DEEPSEEK_V3 = "deepseek_v3"
    """DeepSeek-V3: multi-head latent attention (MLA), the first layer dense, then sparse layers with one
    shared expert and a sigmoid router with grouped top-k (2 groups, tokens routed within 1) and a score
    correction bias. Not decoded by the built-in rollout engine (docs/moe.md)."""

    @property
    def is_vision(self) -> bool:
        """True for the vision-language architectures (their prompts may hold images)."""
        return self in (TinyArch.QWEN2_VL, TinyArch.QWEN2_5_VL)

    @property
    def is_moe(self) -> bool:
        """True for the mixture-of-experts architectures (their MLPs route each token to a few experts)."""
        return self in (TinyArch.QWEN3_MOE, TinyArch.GPT_OSS, TinyArch.DEEPSEEK_V3)


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of a tiny causal LM built from scratch (used when `model.path` is empty)."""

    arch: TinyArch = TinyArch.QWEN2
    """transformers architecture of the tiny model."""

    vocab_size: int = 512
    """Target size of the byte-level BPE vocabulary trained on generated text (special tokens included)."""

    hidden_size: int = 64
    """Width of the residual stream."""

    num_hidden_layers: int = 2
    """Number of decoder layers."""

    num_attention_heads: int = 4
    """Query heads per layer; must divide `hidden_size`."""

    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention); must divide `num_attention_heads`."""

    intermediate_size: int = 128
    """Width of the MLP."""

    max_position_embeddings: int = 512
    """Longest sequence, in tokens, the model accepts (prompt + response)."""

    tie_word_embeddings: bool = True
    """Share input embedding and output head (common in small models, and a case weight sync must handle)."""

    num_experts: int = 8
    """Experts per MoE layer (mixture-of-experts architectures only: `qwen3_moe`, `gpt_oss`, `deepseek_v3`;
    `deepseek_v3` splits them in 2 groups)."""

    num_experts_per_tok: int = 2
    """Experts each token is routed to (top-k; MoE only)."""

    moe_intermediate_size: int = 64
    """Width of each expert's MLP (MoE only)."""

    seed: int = 0
    """Seed of the random initialisation and of the tokenizer's training text."""

    def __post_init__(self) -> None:
        require(self.vocab_size >= 300, "vocab_size", "must be >= 300 (256 bytes + special tokens + merges)")
        require(self.hidden_size > 0 and self.num_hidden_layers > 0, "hidden_size", "sizes must be > 0")
        require(
            self.hidden_size % self.num_attention_heads == 0,
            "num_attention_heads",
            f"{self.num_attention_heads} does not divide hidden_size={self.hidden_size}",
            "choose a head count that divides hidden_size",
        )
        require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_key_value_heads",
            f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}",
            "choose a key/value head count that divides num_attention_heads",
        )
        require(self.max_position_embeddings > 0, "max_position_embeddings", "must be > 0")
        head_dim = self.hidden_size // self.num_attention_heads
        require(
            not self.arch.is_vision or head_dim % 16 == 0,
            "num_attention_heads",
            f"a {self.arch} tiny model needs a head size divisible by 16 (M-RoPE sections), got {head_dim}",
            "choose hidden_size / num_attention_heads = 16, 32, 64, ...",
        )
        if self.arch.is_moe:
            require(
                1 <= self.num_experts_per_tok <= self.num_experts,
                "num_experts_per_tok",
                f"must be between 1 and num_experts={self.num_experts}, got {self.num_experts_per_tok}",
                "route each token to at least one and at most all experts",
            )
            require(self.moe_intermediate_size > 0, "moe_intermediate_size", "must be > 0")
        if self.arch is TinyArch.DEEPSEEK_V3:  # 2 groups of experts, each token's k within 1 of them
            require(
                self.num_experts % 2 == 0
                and self.num_experts >= 4  # a group's score is the sum of its 2 best experts'
                and self.num_experts_per_tok <= self.num_experts // 2,
                "num_experts",
                "a deepseek_v3 tiny model routes within 1 of 2 expert groups: num_experts="
                f"{self.num_experts} must be even and >= 4, and num_experts_per_tok="
                f"{self.num_experts_per_tok} at most half of it",
                "e.g. num_experts: 8, num_experts_per_tok: 2",
            )


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters through `peft`; rank 0 trains the full model."""

    rank: int = 0
    """Adapter rank; 0 disables LoRA."""

    alpha: int = 16
    """Scaling numerator (the update is scaled by alpha / rank)."""

    dropout: float = 0.0
    """Dropout on the adapter input."""

    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    """Names of the linear modules that get adapters."""

    def __post_init__(self) -> None:
        require(self.rank >= 0, "rank", "must be >= 0", "use 0 to disable LoRA")
        require(self.alpha > 0, "alpha", "must be > 0")
        require(0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)")
        require(not self.rank or bool(self.target_modules), "target_modules", "is empty while rank > 0")


@dataclass(frozen=True)
class ModelConfig:
    """The policy (actor, rollout and reference share it)."""

    path: str = ""
    """Local folder with a transformers causal LM and its tokenizer. Empty: build the tiny model below."""

    tokenizer_path: str = ""
    """Tokenizer folder when it differs from `path`. Empty: same as `path`."""

    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the model built when `path` is empty."""

    dtype: Dtype = Dtype.FLOAT32
    """Dtype of the master weights (keep float32 for training; compute dtype is `actor.mixed_precision`)."""

    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""

    freeze_vision_tower: bool = True
    """Vision-language models: keep the vision tower (the image encoder and its merger) frozen and train the
    language model only, as verl's and TRL's Qwen2-VL recipes commonly do (docs/vision.md). false trains it
    too. No effect on text-only models."""

    remove_padding: bool = False
    """Run the policy's training passes (update, old and reference log-probs, SFT) on packed micro-batches:
    real tokens only, rows end to end, attention confined to each row (`quartet.engines.packing`; verl's
    `use_remove_padding`). Same log-probs as padded up to rounding; faster when lengths vary. Sequence
    parallelism packs whatever this says. Without sequence parallelism the critic, reward model and the
    rollout engines run padded."""

    shared_prompts: bool = True
    """With packed passes (`remove_padding`, without sequence parallelism): the rows of a micro-batch that
    share their prompt (GRPO's n samples of one prompt) run it once, each response attending to that one copy
    (`quartet.engines.shared_prompts`). Same log-probs and gradients as unshared up to float rounding; the
    passes skip (n - 1) x the prompt tokens of each group. Text-only dense models; false packs every row
    whole."""

    sequence_parallel_size: int = 1
    """Ulysses sequence parallelism of the policy's training passes (docs/parallelism.md): groups of this
    many consecutive devices split every micro-batch by tokens, dividing activation memory by it; attention
    all-to-alls tokens and heads. 1: off. The passes run packed under it (with or without `remove_padding`).
    Must divide the devices of the policy's pool and the model's attention heads (key/value heads fewer than
    it are replicated). verl's `actor.ulysses_sequence_parallel_size`. The critic has its own
    (`critic.sequence_parallel_size`); the reward model runs without it."""

    tensor_parallel_size: int = 1
    """Tensor parallelism of the policy's training engine (docs/parallelism.md): groups of this many
    consecutive devices split every attention and MLP layer by heads and hidden columns (PyTorch DTensor,
    composed with FSDP2 on a (data x tensor) mesh), and the LM head by vocabulary. 1: off. Must divide the
    devices of the policy's pool and the model's attention and key/value heads (Qwen2, Qwen3, Llama and
    Mistral have plans). Not with sequence parallelism or LoRA; the critic and reward model run without it.
    verl's megatron `tensor_model_parallel_size`. The rollout engines receive full tensors as without it."""

    expert_parallel_size: int = 1
    """Expert parallelism of the policy's training engines (actor and reference; docs/moe_expert_parallel.md):
    each mixture-of-experts layer keeps num_experts / this many experts per device, and tokens travel by
    all-to-all to the devices that hold their experts and back. Every device keeps its own rows (data
    parallel as without it); expert weights are FSDP-sharded over the devices that hold the same experts,
    the rest over all. 1: off. Must divide the devices of the policy's pool and the model's experts per
    layer; composes with sequence parallelism, not with tensor parallelism or LoRA; a dense model refuses
    it. The critic and reward model run without it. verl's megatron `expert_model_parallel_size`. The
    rollout engines receive full expert tensors as without it."""

    fused_head: bool | None = None
    """Compute the policy's log-probs and entropy from the last hidden states in vocabulary blocks, never
    building the [tokens, vocab] logits (`quartet.engines.fused_head`): the same values, without the logits'
    memory (a 152k vocabulary x 10k tokens is 3 GB of bf16 logits and 6 GB of float32 copies). None: on
    where the policy computes on CUDA, off on CPU. Models whose lm_head is not a plain linear layer, or that
    scale or soft-cap the logits, fall back to the plain head with a warning."""

    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings; with rank > 0 the reference is the same model with adapters disabled."""

    def __post_init__(self) -> None:
        require(
            self.dtype is not Dtype.AUTO, "dtype", "auto is for <role>.mixed_precision only", "use float32"
        )
        problems = layout_problems(
            self.sequence_parallel_size,
            self.tensor_parallel_size,
            self.lora.rank,
            ep=self.expert_parallel_size,
        )
        if not problems and self.is_tiny:  # the sizes are valid on their own: now against the heads
            problems = self._tiny_problems()
        if problems:
            raise problems[0]

    def _tiny_problems(self) -> list[ConfigError]:
        """The parallel sizes against the tiny model's heads, known before it is built."""
        sp = self.sequence_parallel_size
        tiny = self.tiny
        vision = vision_problem(sp) if tiny.arch.is_vision else None
        if tiny.arch.is_moe and (moe := moe_problems(self.tensor_parallel_size)):
            return moe
        heads = head_problems(
            tiny.num_attention_heads,
            tiny.num_key_value_heads,
            sp,
            self.tensor_parallel_size,
            "the tiny model's",
        )
        experts = expert_problems(
            tiny.num_experts if tiny.arch.is_moe else 0, self.expert_parallel_size, "the tiny model's"
        )
        shape = shape_problems(
            tiny.arch.value, self.expert_parallel_size, self.lora.rank, sp=self.sequence_parallel_size
        )
        return [vision, *heads, *experts, *shape] if vision else [*heads, *experts, *shape]

    @property
    def is_tiny(self) -> bool:
        """True when the run builds its own tiny model."""
        return not self.path
