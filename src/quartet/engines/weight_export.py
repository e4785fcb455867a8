"""The trainer's weights as an inference engine wants them: transformers names, full tensors, LoRA merged.

    for name, tensor in inference_weights(engine.module):
        ...   # e.g. rollout_engine.load_weights(inference_weights(engine.module))

A stream, one tensor at a time, so the peak extra memory is one gathered parameter, not a second model.
With FSDP2 every parameter is a DTensor shard; `full_tensor()` all-gathers it, a collective: every rank must
walk the stream in the same order (they do: the order is the module's) and each rank gets the full weights
for its own engine replica. With LoRA, each adapted linear layer is sent as `W + scaling * B @ A` under the
base layer's name (`...q_proj.weight`); adapter tensors themselves are not sent, and the live parameters
are never modified (peft's in-place `merge_adapter`/`unmerge_adapter` round trip would perturb the fp32
master weights by rounding every step). A mixture-of-experts model's fused expert weights (3-D parameters,
not Linear modules) get peft's `ParamWrapper` adapters, one low-rank pair per expert, nested one wrapper per
adapted parameter: each is sent as `W + delta` under its transformers name (the `.base_layer` segments the
wrappers add dropped), the delta computed as peft's `ParamWrapper.get_delta_weight` does (docs/moe.md).
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
    name = _single_adapter(layer)
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


def _single_adapter(layer: nn.Module) -> str:
    adapters = list(getattr(layer, "active_adapters", None) or ["default"])
    if len(adapters) != 1:
        raise NotImplementedError(f"weight sync supports one active LoRA adapter, found {adapters}")
    return str(adapters[0])


def _param_delta(wrapper: nn.Module) -> torch.Tensor:
    """The delta of a peft `ParamWrapper` on a fused [experts, ., .] parameter, gathered in full: expert e's
    `scaling * B_e @ A_e`, laid out as the parameter (peft's `get_delta_weight`)."""
    name = _single_adapter(wrapper)
    experts = int(wrapper.num_experts)  # type: ignore[arg-type]  # set by peft
    if experts < 2:
        raise NotImplementedError(
            "weight sync merges LoRA on fused expert weights (num_experts > 1) only, not on a 2-D parameter "
            "such as an MoE router's (target 'gate'): drop it from model.lora.target_modules"
        )
    weights = [wrapper.get_submodule(f"lora_{ab}.{name}").weight for ab in "AB"]
    if not all(isinstance(w, torch.Tensor) for w in weights):
        raise NotImplementedError("weight sync merges LoRA adapters with plain weight matrices only")
    lora_a, lora_b = (_full(w) for w in weights)  # type: ignore[arg-type]  # checked above
    # lora_a: [experts x rank, in], lora_b: [out, rank x experts]
    a = lora_a.reshape(experts, -1, lora_a.shape[-1])
    b = lora_b.reshape(lora_b.shape[0], -1, experts)
    layout = "e o i" if wrapper._did_swap_in_out_features else "e i o"
    scaling = float(wrapper.scaling[name])  # type: ignore[index]  # a plain dict that peft sets
    delta: torch.Tensor = torch.einsum(f"o r e, e r i -> {layout}", b, a) * scaling
    return delta


def _without_base_layers(name: str) -> str:
    """A module path with peft's wrapper segments removed: the name transformers gives the same module."""
    return ".".join(part for part in name.split(".") if part != _BASE_LAYER[1:])


def inference_weights(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers parameter name, full tensor) for every parameter of the trained model, LoRA merged.

    Tied weights appear once (under the input embedding's name); `load_named_tensors` on the engine side
    writes the shared storage. Tensors are the trainer's dtype; the engine casts them to its own.
    """
    base = hf_model(module)
    lora_layers, wrappers = {}, {}
    for name, m in base.named_modules():
        if not (hasattr(m, "lora_A") and hasattr(m, "base_layer")):
            continue
        if getattr(m, "parameter_name", None):  # a ParamWrapper: LoRA on a raw parameter (fused experts)
            wrappers[(_without_base_layers(name), m.parameter_name)] = m
        else:
            lora_layers[name] = m
    with torch.no_grad():
        for name, param in base.named_parameters():
            if ".lora_" in name:
                continue  # adapter weights arrive merged into their base layer
            owner, _, leaf = name.rpartition(".")
            target = _without_base_layers(owner)
            tensor = _full(param)
            if target in lora_layers and leaf == "weight":
                tensor = tensor + _lora_delta(lora_layers[target]).to(tensor.dtype)
            elif (target, leaf) in wrappers:
                tensor = tensor + _param_delta(wrappers[(target, leaf)]).to(tensor.dtype)
            yield f"{target}.{leaf}", tensor
