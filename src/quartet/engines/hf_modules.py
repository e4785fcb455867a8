"""Where the parts of a transformers model sit inside whatever wraps it (PEFT, FSDP2, tensor parallelism).

Every step of the engine's build (`engines.build`) and several passes need the same few look-ups: the
transformers model inside a PEFT wrapper, its repeated decoder layers, its LM head. They live here, in a
module that imports no other engine module, so that each step can use them without importing another step.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import PreTrainedModel

__all__ = ["decoder_layers", "hf_model", "lm_head", "module_name"]


def hf_model(module: nn.Module) -> PreTrainedModel:
    """The transformers model inside `module` (the base model of a peft wrapper)."""
    unwrap = getattr(module, "get_base_model", None)
    inner = unwrap() if callable(unwrap) else module
    if not isinstance(inner, PreTrainedModel):
        raise TypeError(f"expected a transformers model, got {type(inner).__name__}")
    return inner


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP2 shards one by one: modules whose class is in `_no_split_modules`."""
    names = set(getattr(hf_model(module), "_no_split_modules", None) or ())
    layers = [m for m in module.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"found no decoder layers ({sorted(names)}) in {type(module).__name__}")
    return layers


def lm_head(model: Any) -> nn.Module:
    """The output embeddings (LM head) of the transformers model `model`."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no lm_head to split by vocabulary")
    return head


def module_name(root: nn.Module, target: nn.Module) -> str:
    """The dotted path of `target` inside `root`."""
    for name, module in root.named_modules():
        if module is target:
            return str(name)
    raise ValueError(f"{type(target).__name__} is not inside {type(root).__name__}")
