"""Copying trainer weights into an inference model in the same process, by transformers parameter name.

A module that stores its weight in another format than the trainer sends (the built-in engine's fp8
projections, `quartet.rollout.torch.fp8`) takes the sent tensor through its own `load_weight`, which
converts it (`QuantizedWeight`); every other target is copied with a cast.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["QuantizedWeight", "load_named_tensors"]

# Wrappers that insert a path component into parameter names (DDP, torch.compile, FSDP1, checkpointing).
_WRAPPER_PARTS = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def _strip_wrappers(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


@runtime_checkable
class QuantizedWeight(Protocol):
    """A module whose `weight` is stored converted (with `weight_scale`): a sync hands it the trainer's
    tensor to convert in place, instead of a cast copy."""

    weight_scale: torch.Tensor

    def load_weight(self, weight: torch.Tensor, name: str = "weight") -> None:
        """Convert `weight` (the trainer's dtype) into this module's storage, in place."""


def _loaders(model: nn.Module) -> dict[str, QuantizedWeight]:
    """`<module>.weight` -> the module, for every `QuantizedWeight` module of `model`."""
    return {
        f"{name}.weight" if name else "weight": module
        for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, QuantizedWeight)
    }


def _targets(model: nn.Module) -> dict[str, torch.Tensor]:
    # remove_duplicate=False lists tied weights under every name (lm_head.weight and embed_tokens.weight),
    # so a trainer may send either; both point at the same storage.
    targets: dict[str, torch.Tensor] = dict(model.named_buffers(remove_duplicate=False))
    targets.update(model.named_parameters(remove_duplicate=False))
    return targets


def load_named_tensors(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each (name, tensor) into the parameter or buffer of that name; returns how many were copied.

    Names are transformers' (`model.layers.0.self_attn.q_proj.weight`); DDP/compile/FSDP wrapper parts are
    ignored. A DTensor is gathered first. Values are cast to the target's dtype and device; the weight of a
    `QuantizedWeight` module is quantized by it instead. An unknown name
    or a shape mismatch raises before anything later in the stream is copied.
    """
    targets = _targets(model)
    loaders = _loaders(model)
    count = 0
    with torch.no_grad():
        for raw_name, tensor in named_tensors:
            name = raw_name if raw_name in targets else _strip_wrappers(raw_name)
            target = targets.get(name)
            if target is None:
                close = difflib.get_close_matches(name, list(targets), n=3)
                raise KeyError(
                    f"no parameter or buffer '{raw_name}' in {type(model).__name__}; close names: {close}"
                )
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            if tuple(full.shape) != tuple(target.shape):
                raise ValueError(
                    f"'{raw_name}' has shape {tuple(full.shape)}, the model's is {tuple(target.shape)}"
                )
            if (loader := loaders.get(name)) is not None:
                loader.load_weight(full.detach(), name)
            else:
                target.copy_(full.detach().to(device=target.device, dtype=target.dtype))
            count += 1
    return count
