"""Copying trainer weights into an inference model in the same process, by transformers parameter name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["load_named_tensors"]

# Wrappers that insert a path component into parameter names (DDP, torch.compile, FSDP1, checkpointing).
_WRAPPER_PARTS = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def _strip_wrappers(name: str) -> str:
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _targets(model: nn.Module) -> dict[str, torch.Tensor]:
    # remove_duplicate=False lists tied weights under every name (lm_head.weight and embed_tokens.weight),
    # so a trainer may send either; both point at the same storage.
    targets: dict[str, torch.Tensor] = dict(model.named_buffers(remove_duplicate=False))
    targets.update(model.named_parameters(remove_duplicate=False))
    return targets


def load_named_tensors(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each (name, tensor) into the parameter or buffer of that name; returns how many were copied.

    Names are transformers' (`model.layers.0.self_attn.q_proj.weight`); DDP/compile/FSDP wrapper parts are
    ignored. A DTensor is gathered first. Values are cast to the target's dtype and device. An unknown name
    or a shape mismatch raises before anything later in the stream is copied.
    """
    targets = _targets(model)
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
            target.copy_(full.detach().to(device=target.device, dtype=target.dtype))
            count += 1
    return count
