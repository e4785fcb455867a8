"""What an engine is built from, and the types that cross its `train_step` boundary.

`EngineSpec` says which model to load and how to train it; roles build one from their config. `MicroSpec`
says how a batch is cut into micro-batches. A `LossFn` receives `ModelOutputs` for one micro-batch together
with the micro-batch itself and a `LossScale` holding the counts of the WHOLE mini-batch (all micro-batches,
all data-parallel ranks), so that it can return its micro-batch's share of the big-batch loss (see
`quartet.core.loss_agg`: pass `scale.tokens` as `global_token_count`, `scale.sequences` as
`global_seq_count`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import torch

from quartet.config.model import Dtype, LoraConfig
from quartet.config.optim import LrSchedule, OptimConfig
from quartet.config.parallel import layout_problems
from quartet.config.roles import MicroBatching
from quartet.core.batch import Batch
from quartet.engines.precision import resolve_precision

__all__ = ["EngineSpec", "LossFn", "LossScale", "MicroSpec", "ModelKind", "ModelOutputs"]


class ModelKind(StrEnum):
    """Which transformers head the engine loads."""

    CAUSAL_LM = "causal_lm"
    """`AutoModelForCausalLM`: log-probs and entropy of response tokens."""

    VALUE = "value"
    """`AutoModelForTokenClassification` with one label: one value per token (a critic)."""

    REWARD = "reward"
    """`AutoModelForSequenceClassification` with one label: one score per sequence."""


@dataclass(frozen=True)
class EngineSpec:
    """Everything a `TrainingEngine` needs to load a model and train it."""

    model_path: str
    """Local folder with a transformers model (see `quartet.models.loading`)."""

    kind: ModelKind = ModelKind.CAUSAL_LM
    """Head to load; VALUE may start from a causal LM folder (a fresh value head is initialised)."""

    mixed_precision: Dtype = Dtype.BFLOAT16
    """Autocast dtype of forward/backward; weights stay float32 (master weights). FLOAT32 turns it off;
    AUTO is resolved here, in the process that computes (`quartet.engines.precision`)."""

    optim: OptimConfig | None = None
    """Optimizer and schedule; None: a frozen engine (reference, reward model), no grads, no optimizer."""

    total_steps: int = 0
    """Optimizer steps of the whole run, for the cosine schedule (unused by the constant schedule)."""

    gradient_checkpointing: bool = False
    """Recompute activations in backward (transformers' checkpointing, `use_reentrant=False`)."""

    lora: LoraConfig | None = None
    """LoRA adapters (rank > 0): only adapter weights train; None or rank 0 trains the full model."""

    param_offload: bool = False
    """`offload()` moves parameters (and gradients) to host memory."""

    optimizer_offload: bool = False
    """`offload()` moves optimizer states to host memory."""

    seed: int = 0
    """Seeds the RNG before the model is built (same on every rank: fresh heads and adapters agree)."""

    remove_padding: bool = False
    """Causal LM and value model: forward passes on packed micro-batches (`engines.packing`); the reward
    model ignores it."""

    shared_prompts: bool = True
    """Packed passes: rows of a micro-batch with the same prompt run it once (`engines.shared_prompts`);
    text-only dense models without SP."""

    sequence_parallel_size: int = 1
    """Causal LM and value model: ranks per sequence group (Ulysses, `engines.ulysses`); 1: off. Implies
    packed passes whatever `remove_padding` says (`engines.packed_run`). The reward model refuses it."""

    tensor_parallel_size: int = 1
    """Causal LM: ranks per tensor group (DTensor, `engines.tensor_parallel`); 1: off. Not with SP or LoRA."""

    expert_parallel_size: int = 1
    """Causal LM with mixture-of-experts layers: ranks per expert group, over which each layer's experts are
    split (all-to-all token dispatch, `engines.expert_parallel`); 1: off. Not with TP or LoRA."""

    fused_head: bool | None = None
    """Causal LM: log-probs and entropy from the hidden states in vocabulary blocks, never the [N, V] logits
    (`engines.fused_head`); None: on when the engine computes on CUDA. Other kinds ignore it."""

    freeze_vision_tower: bool = True
    """Vision-language models: the vision tower (`model.visual`) gets no gradient and no optimizer state."""

    routing_replay: bool = False
    """Causal LM with MoE layers: every pass routes each token to the experts of the batch's `routed_experts`
    (`engines.routing_replay`); a batch without them raises. Not with sequence or tensor parallelism."""
    moe_aux_loss_coef: float | None = None
    """Mixture-of-experts models: weight of the router's load-balancing loss added in `train_step`
    (`engines.router`); None: the model config's `router_aux_loss_coef`; 0: off. Dense models ignore it."""

    moe_z_loss_coef: float = 0.0
    """Mixture-of-experts models: weight of the router z-loss added in `train_step`; 0: off."""

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("EngineSpec.model_path is empty; pass a local model folder")
        # Plain strings from a config are accepted; store the enum members (the engine compares with `is`).
        object.__setattr__(self, "kind", ModelKind(self.kind))
        object.__setattr__(self, "mixed_precision", resolve_precision(self.mixed_precision))
        kind = self.kind
        if self.optim is not None and self.mixed_precision is Dtype.FLOAT16:
            raise ValueError(
                "float16 mixed precision needs loss scaling, which the engine does not do; use bfloat16"
            )
        _check_parallel(self)
        if self.routing_replay and (self.sequence_parallel_size > 1 or self.tensor_parallel_size > 1):
            raise ValueError(
                "routing replay feeds whole rows to each rank: not with sequence or tensor parallelism"
            )
        if self.uses_lora and kind is ModelKind.REWARD:
            raise ValueError("LoRA on a reward model: reward models are frozen in quartet; drop `lora`")
        if (
            self.optim is not None
            and self.optim.schedule is LrSchedule.COSINE
            and self.total_steps <= self.optim.warmup_steps
        ):
            raise ValueError(
                f"the cosine schedule needs total_steps > warmup_steps, got total_steps={self.total_steps} "
                f"and warmup_steps={self.optim.warmup_steps}"
            )

    @property
    def uses_lora(self) -> bool:
        """True when LoRA adapters are configured (rank > 0)."""
        return self.lora is not None and self.lora.rank > 0

    @property
    def packs(self) -> bool:
        """True when the per-token passes run packed: `remove_padding`, or sequence parallelism (which needs
        the packed sequence to cut by tokens). The reward model always runs padded."""
        if self.kind is ModelKind.REWARD:
            return False
        return self.remove_padding or self.sequence_parallel_size > 1

    @property
    def trainable(self) -> bool:
        """True when the engine has an optimizer."""
        return self.optim is not None


def _check_parallel(spec: EngineSpec) -> None:
    """The parallel sizes on their own (`config.parallel`), then what each engine kind supports."""
    sp = spec.sequence_parallel_size
    tp = spec.tensor_parallel_size
    lora_rank = spec.lora.rank if spec.lora is not None else 0
    ep = spec.expert_parallel_size
    problems = layout_problems(sp, tp, lora_rank, ep=ep)
    if problems:
        raise problems[0].under("model")
    if sp > 1 and spec.kind is ModelKind.REWARD:
        raise ValueError(
            f"sequence_parallel_size={sp} on a reward model: its one score per row is not built for sequence "
            "parallelism; the reward model runs data parallel only (sequence_parallel_size: 1)"
        )
    if tp > 1 and spec.kind is not ModelKind.CAUSAL_LM:
        raise ValueError(
            f"model.tensor_parallel_size={tp} is built for the policy (causal LM) only; this engine holds a "
            f"{spec.kind} model: run it with tensor_parallel_size: 1"
        )
    if ep > 1 and spec.kind is not ModelKind.CAUSAL_LM:
        raise ValueError(
            f"model.expert_parallel_size={ep} is built for the policy (causal LM) only; this engine holds a "
            f"{spec.kind} model: run it with expert_parallel_size: 1"
        )


@dataclass(frozen=True)
class MicroSpec:
    """How one rank cuts its rows into micro-batches (one forward, and in training one backward, each).

    Fixed: `size` rows per micro-batch, in order. Token budget (`max_tokens` set): rows are packed, longest
    first, into the first micro-batch whose valid tokens (prompt + response, from `attention_mask`) stay
    within `max_tokens`; a row longer than the budget gets a micro-batch of its own. Outputs always come back
    in the batch's row order.
    """

    size: int = 8
    """Rows per micro-batch (fixed mode)."""

    max_tokens: int | None = None
    """Token budget of one micro-batch; None: fixed mode."""

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"MicroSpec.size must be >= 1, got {self.size}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"MicroSpec.max_tokens must be >= 1 or None, got {self.max_tokens}")

    @classmethod
    def from_config(cls, cfg: MicroBatching) -> MicroSpec:
        """The micro-batching of a no-grad pass as the config states it."""
        budget = cfg.max_tokens_per_micro_batch if cfg.use_dynamic_batch else None
        return cls(size=cfg.micro_batch_size_per_device, max_tokens=budget)


@dataclass(frozen=True)
class LossScale:
    """Counts of the whole mini-batch (all micro-batches, all ranks) that a micro-batch loss divides by."""

    tokens: int
    """Valid response tokens (`response_mask != 0`) of the mini-batch."""

    sequences: int
    """Rows with at least one valid response token."""

    dp_size: int
    """Data-parallel world size (the engine already cancels FSDP's averaging over ranks; for information)."""

    attended_tokens: int = 0
    """Attended tokens, prompt and response (`attention_mask != 0`), of the mini-batch: what a mixture of
    experts' router loss weighs each micro-batch by (`engines.router`)."""


@dataclass(frozen=True)
class ModelOutputs:
    """Forward outputs at response positions of one micro-batch, each [b, R] float32 (or None).

    Positions past a row's last attended response token hold 0. In `train_step` they carry the graph.
    """

    logprobs: torch.Tensor | None = None
    """Causal LM: log p(response token t | everything before it) under logits / temperature."""

    entropy: torch.Tensor | None = None
    """Causal LM, when asked for: entropy of the same (temperature-scaled) distribution."""

    values: torch.Tensor | None = None
    """Value model: value of the state before response token t (see `TrainingEngine.forward_values`)."""

    routing_mismatch: torch.Tensor | None = None
    """MoE causal LM on a batch with `routed_experts`, when asked for: the share of MoE layers whose own top-k
    set differs from the rollout engine's at response token t (0 where the engine recorded nothing)."""

    topk_logprobs: torch.Tensor | None = None
    """Causal LM, when asked for (`TopK`): [b, R, k] the k largest log-probs at each response position,
    descending (the teacher's side of GKD, `core.gkd`)."""

    topk_ids: torch.Tensor | None = None
    """[b, R, k] int64: their token ids."""

    support_logprobs: torch.Tensor | None = None
    """Causal LM, when asked for: [b, R, k] log-probs at the batch's given ids per position (the student's
    side of GKD), with graph in `train_step`."""

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The fields in declaration order (None where not computed)."""
        return (
            self.logprobs,
            self.entropy,
            self.values,
            self.routing_mismatch,
            self.topk_logprobs,
            self.topk_ids,
            self.support_logprobs,
        )

    def present(self) -> list[torch.Tensor]:
        """The computed fields."""
        return [t for t in self.tensors() if t is not None]

    def zero_loss(self, device: torch.device) -> torch.Tensor:
        """A zero that depends on every computed field: the loss of a stand-in micro-batch, which keeps a
        rank in step with the others' collectives and adds nothing."""
        return sum((t.sum() for t in self.present()), torch.zeros((), device=device)) * 0.0

    def required(self, name: str) -> torch.Tensor:
        """Field `name`; a `ValueError` when the pass did not compute it."""
        value: torch.Tensor | None = getattr(self, name)
        if value is None:
            raise ValueError(f"the forward output '{name}' was not computed")
        return value


LossFn = Callable[[ModelOutputs, Batch, LossScale], tuple[torch.Tensor, Mapping[str, torch.Tensor | float]]]
"""(outputs, micro-batch, scale) -> (0-d loss: this micro-batch's share of the mini-batch loss, metrics)."""
