"""The engine's model from an `EngineSpec`: head by kind, LoRA adapters, checkpointing, freezing.

The first step of the engine's build (`engines.build`): it knows nothing of ranks; the parallel split and
the sharding come after it.

Reward models are loaded as `AutoModelForSequenceClassification` (one label). Their own pooling picks the
last token that differs from `pad_token_id`, which is wrong when a real token equals the pad id (a common
pad = eos setup); the engine instead reads the head's per-token output with a forward hook on the `score`
module and gathers at the last ATTENDED token (`ScoreCapture`). The hook runs inside the model's own
forward, so it works unchanged under FSDP2 (where calling the trunk and head separately would bypass the
root module's all-gather).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from quartet.engines.hf_modules import hf_model
from quartet.engines.packing import VARLEN, register_varlen_attention
from quartet.engines.spec import EngineSpec, ModelKind
from quartet.models.loading import ModelFolderError, is_vision_model, load_causal_lm, load_value_model
from quartet.models.vision import guard_placeholders, is_vision_module, vision_model

__all__ = ["ScoreCapture", "build_model", "load_reward_model"]


def load_reward_model(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A sequence-classification model with one label from the local folder `path`."""
    folder = Path(path).expanduser()
    if not (folder / "config.json").exists():
        raise ModelFolderError(f"reward model path '{path}' is not a local folder with a config.json")
    if is_vision_model(folder):
        # A VLM critic exists (`models.vision_value`); a VLM reward model would also need the images routed
        # through the reward role's scoring pass, which it does not do.
        raise ModelFolderError(
            f"reward.model_path '{folder}' is a vision-language model: quartet has no vision-language reward "
            "model; score with a rule or a custom function (reward.function), or set reward.model_path to a "
            "text sequence-classification model"
        )
    config = AutoConfig.from_pretrained(folder, num_labels=1, local_files_only=True)
    if config.pad_token_id is None:
        # transformers refuses batches > 1 without a pad id; its pooling is not used (see module doc).
        config.pad_token_id = 0
    model: PreTrainedModel = AutoModelForSequenceClassification.from_pretrained(
        folder, config=config, dtype=dtype, local_files_only=True
    )
    return model


def _load(spec: EngineSpec) -> PreTrainedModel:
    if spec.kind is ModelKind.REWARD:
        return load_reward_model(spec.model_path)
    model = (
        load_causal_lm(spec.model_path)
        if spec.kind is ModelKind.CAUSAL_LM
        else load_value_model(spec.model_path)
    )
    vision = is_vision_module(model)
    if vision:
        guard_placeholders(model)  # training passes read the prompt's image tokens only (`models.vision`)
    if spec.packs:  # sequence parallelism wraps this attention in its all-to-alls (`engines.build`)
        register_varlen_attention()
        # a VLM packs its language model only: the vision tower keeps its own attention over its patches
        config = model.config.text_config if vision else model.config
        config._attn_implementation = VARLEN
    return model


def _add_lora(model: PreTrainedModel, spec: EngineSpec) -> nn.Module:
    import peft  # optional dependency: imported only when LoRA is asked for

    assert spec.lora is not None
    config = peft.LoraConfig(
        r=spec.lora.rank,
        lora_alpha=spec.lora.alpha,
        lora_dropout=spec.lora.dropout,
        target_modules=list(spec.lora.target_modules),
        # A value head is new: it trains in full next to the adapters.
        modules_to_save=["score"] if spec.kind is ModelKind.VALUE else None,
    )
    # task_type left unset: the plain PeftModel forwards every keyword (position_ids, logits_to_keep) as is.
    peft_model: nn.Module = peft.get_peft_model(model, config)
    return peft_model


def build_model(spec: EngineSpec) -> nn.Module:
    """The model of `spec`, float32, on CPU, with adapters/checkpointing applied and frozen if no optimizer.

    Seeds torch's RNG with `spec.seed` first, so fresh value heads and LoRA weights agree across ranks.
    """
    torch.manual_seed(spec.seed)
    model = _load(spec)
    model.config.use_cache = False
    if spec.gradient_checkpointing:
        # Non-reentrant checkpointing: works with frozen inputs (LoRA) and with FSDP2.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    module: nn.Module = _add_lora(model, spec) if spec.uses_lora else model
    if not spec.trainable:
        module.requires_grad_(False)
    trunk = vision_model(module)
    if trunk is not None and spec.freeze_vision_tower:
        trunk.visual.requires_grad_(False)
    return module


class ScoreCapture:
    """Holds the per-token output [b, T, 1] of a reward model's `score` head during one forward."""

    def __init__(self, module: nn.Module) -> None:
        head = getattr(hf_model(module), "score", None)
        if not isinstance(head, nn.Module):
            raise TypeError(f"{type(hf_model(module)).__name__} has no `score` head to read per-token scores")
        self._head = head
        self.output: torch.Tensor | None = None

    def _hook(self, _module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        self.output = output

    @contextmanager
    def capturing(self) -> Iterator[ScoreCapture]:
        """Record the head's output while the block runs."""
        handle = self._head.register_forward_hook(self._hook)
        self.output = None
        try:
            yield self
        finally:
            handle.remove()
