"""Value models (critics) for Qwen2-VL and Qwen2.5-VL: the multimodal trunk and one scalar per token.

transformers has no token-classification head for these architectures, so a VLM critic is built here the
way transformers builds `Qwen2ForTokenClassification` for text (the layout verl's critics use): the
trunk of the causal model (`Qwen2VLModel`: vision tower + language model, no LM head) under the attribute
`model`, and `score`, a Linear(hidden, num_labels) with a bias, on every token's last hidden state. The
images reach the trunk exactly as in the causal model's forward (`pixel_values`, `image_grid_thw`, 3-D
`position_ids`), so the engine's image inputs (`engines.vision_inputs`) serve both.

Loading goes through transformers' own `from_pretrained`:

- from a causal VLM folder (`Qwen2VLForConditionalGeneration`): the trunk's weights are reused, `lm_head` is
  dropped and `score` starts fresh (how a critic starts from the policy); the causal model's checkpoint
  conversions are registered for the value classes too, so hub folders in the older key layout
  (`visual.*`, `model.layers.*`) load the same way;
- from a saved value model (`save_pretrained` of one of these classes): everything is reused.

The classes are registered with `AutoModelForTokenClassification` for their config types on import, so
`AutoModelForTokenClassification.from_pretrained(folder)` loads a saved VLM value model once this module is
imported (`quartet.models.loading.load_value_model` imports it for a VLM folder).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AutoModelForTokenClassification, PreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput
from transformers.models.qwen2_5_vl import Qwen2_5_VLConfig, Qwen2_5_VLModel
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLPreTrainedModel
from transformers.models.qwen2_vl import Qwen2VLConfig, Qwen2VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLPreTrainedModel

__all__ = ["VALUE_MODEL_CLASSES", "Qwen2VLValueModel", "Qwen2_5_VLValueModel", "value_model_class"]


class _VisionValueHead:
    """The forward shared by both value classes (mixed into a transformers `PreTrainedModel`)."""

    model: nn.Module
    score: nn.Linear

    def _build(self, trunk: nn.Module, config: Any) -> None:
        self.model = trunk
        self.score = nn.Linear(config.get_text_config().hidden_size, config.num_labels)

    def get_input_embeddings(self) -> nn.Module:
        """The language model's token embedding (transformers' resize / tie helpers read it)."""
        embeddings: nn.Module = self.model.get_input_embeddings()  # type: ignore[operator]
        return embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        image_grid_thw: torch.Tensor | None = None,
        mm_token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = False,
        **kwargs: Any,
    ) -> TokenClassifierOutput:
        """Values [b, T, num_labels] (as `logits`) of every position. Without `position_ids` the trunk
        computes the M-RoPE positions itself (`get_rope_index`), as the causal model does; extra keyword
        arguments (attention implementation's, e.g. packed bounds) go to the trunk."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            pixel_values=pixel_values,
            image_grid_thw=image_grid_thw,
            mm_token_type_ids=mm_token_type_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return TokenClassifierOutput(logits=self.score(out.last_hidden_state))


class Qwen2VLValueModel(_VisionValueHead, Qwen2VLPreTrainedModel):  # type: ignore[no-untyped-call]  # unannotated in transformers
    """Qwen2-VL trunk (`Qwen2VLModel`) with a per-token value head `score`."""

    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]  # noqa: RUF012  # transformers' class attribute

    def __init__(self, config: Qwen2VLConfig) -> None:
        super().__init__(config)
        self._build(Qwen2VLModel(config), config)
        self.post_init()  # type: ignore[no-untyped-call]  # unannotated in transformers


class Qwen2_5_VLValueModel(_VisionValueHead, Qwen2_5_VLPreTrainedModel):  # type: ignore[no-untyped-call]  # unannotated in transformers
    """Qwen2.5-VL trunk (`Qwen2_5_VLModel`) with a per-token value head `score`."""

    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]  # noqa: RUF012  # transformers' class attribute

    def __init__(self, config: Qwen2_5_VLConfig) -> None:
        super().__init__(config)
        self._build(Qwen2_5_VLModel(config), config)  # type: ignore[no-untyped-call]  # unannotated in transformers
        self.post_init()  # type: ignore[no-untyped-call]  # unannotated in transformers


VALUE_MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "qwen2_vl": Qwen2VLValueModel,
    "qwen2_5_vl": Qwen2_5_VLValueModel,
}
"""The value class of each supported vision-language `model_type`."""


def value_model_class(model_type: str) -> type[PreTrainedModel]:
    """The value class for a VLM's `model_type`; ValueError naming the supported ones otherwise."""
    cls = VALUE_MODEL_CLASSES.get(model_type)
    if cls is None:
        raise ValueError(
            f"no value model (critic) for the vision-language model type {model_type!r}: quartet has one for "
            f"{sorted(VALUE_MODEL_CLASSES)}; use a critic-free estimator (algorithm.adv_estimator: grpo, "
            "rloo, ...) or a supported model"
        )
    return cls


def _register() -> None:
    """Auto-class registration and the causal model's checkpoint key conversions, for both classes."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )

    pairs = (
        (Qwen2VLConfig, Qwen2VLValueModel, "Qwen2VLForConditionalGeneration"),
        (Qwen2_5_VLConfig, Qwen2_5_VLValueModel, "Qwen2_5_VLForConditionalGeneration"),
    )
    for config, cls, causal in pairs:
        AutoModelForTokenClassification.register(config, cls, exist_ok=True)
        conversions = get_checkpoint_conversion_mapping(causal)  # type: ignore[no-untyped-call]  # unannotated in transformers
        if conversions is not None:
            register_checkpoint_conversion_mapping(cls.__name__, conversions, overwrite=True)


_register()
