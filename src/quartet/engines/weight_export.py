"""The trainer's weights as an inference engine wants them: transformers names, full tensors, LoRA merged.

    for name, tensor in inference_weights(engine.module):
        ...   # e.g. rollout_engine.load_weights(inference_weights(engine.module))

A stream, one tensor at a time, so the peak extra memory is one gathered parameter, not a second model.
With FSDP2 every parameter is a DTensor shard; `full_tensor()` all-gathers it, a collective: every rank must
walk the stream in the same order (they do: the order is the module's) and each rank gets the full weights
for its own engine replica. With LoRA, each adapted linear layer is sent as `W + scaling * B @ A` under the
base layer's name (`...q_proj.weight`); adapter tensors themselves are not sent, and the live parameters
are never modified (peft's in-place `merge_adapter`/`unmerge_adapter` round trip would perturb the fp32
master weights by rounding every step).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from quartet.engines.hf_modules import hf_model

__all__ = ["inference_weights"]

_BASE_LAYER = ".base_layer"


def _full(t: torch.Tensor) -> torch.Tensor:
    gather = getattr(t, "full_tensor", None)  # DTensor (FSDP2 shard): all-gather the whole tensor
    return (gather() if callable(gather) else t).detach()


def _lora_delta(layer: nn.Module) -> torch.Tensor:
    """`scaling * B @ A` of the active adapter of a peft LoRA linear layer, gathered in full."""
    adapters = list(getattr(layer, "active_adapters", None) or ["default"])
    if len(adapters) != 1:
        raise NotImplementedError(f"weight sync supports one active LoRA adapter, found {adapters}")
    name = adapters[0]
    if getattr(layer, "use_dora", {}).get(name, False):
        raise NotImplementedError("weight sync of DoRA adapters is not supported; use plain LoRA")
    lora_a, lora_b = layer.get_submodule(f"lora_A.{name}"), layer.get_submodule(f"lora_B.{name}")
    if not isinstance(lora_a, nn.Linear) or not isinstance(lora_b, nn.Linear):
        raise NotImplementedError(
            f"weight sync merges LoRA on linear layers only, not {type(lora_a).__name__}"
        )
    scaling = float(layer.scaling[name])  # type: ignore[index]  # a plain dict that peft sets
    delta = (_full(lora_b.weight) @ _full(lora_a.weight)) * scaling
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta


def inference_weights(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers parameter name, full tensor) for every parameter of the trained model, LoRA merged.

    Tied weights appear once (under the input embedding's name); `load_named_tensors` on the engine side
    writes the shared storage. Tensors are the trainer's dtype; the engine casts them to its own.
    """
    base = hf_model(module)
    lora_layers = {
        name: m for name, m in base.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")
    }
    with torch.no_grad():
        for name, param in base.named_parameters():
            if ".lora_" in name:
                continue  # adapter weights arrive merged into their base layer
            owner, _, leaf = name.rpartition(".")
            if owner.endswith(_BASE_LAYER) and owner[: -len(_BASE_LAYER)] in lora_layers:
                layer_name = owner[: -len(_BASE_LAYER)]
                merged = _full(param)
                if leaf == "weight":
                    merged = merged + _lora_delta(lora_layers[layer_name]).to(merged.dtype)
                yield f"{layer_name}.{leaf}", merged
            else:
                yield name, _full(param)
