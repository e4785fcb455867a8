"""Moving parameters (with their gradients) and optimizer states between the compute device and host memory.

On a GPU this frees device memory while another role (rollout, another model) runs; on a CPU-only machine
the compute device IS host memory and the engine skips the move unless forced. The move always copies into
fresh storage (`Tensor.to(copy=True)`), so a forced CPU -> CPU round trip exercises the same path as a
GPU -> CPU one.

Parameters move through `nn.Module._apply`, the method `Module.to` uses: FSDP2 overrides it to re-register
its sharded parameters after the move, and it keeps each Parameter object (optimizer references and tied
weights stay valid). `Module.to` itself cannot be used because it skips tensors already on the target
device. Optimizer states are tensors in `optimizer.state`; AdamW's `step` counters stay where they are
(they live on the CPU unless the optimizer is capturable).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["move_module", "move_optimizer_state"]


def _copy_to(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, copy=True)

    return fn


def move_module(module: nn.Module, device: torch.device) -> None:
    """Copy every parameter, gradient and buffer of `module` to `device` in place of the old storage."""
    module._apply(_copy_to(device))  # type: ignore[no-untyped-call]  # see module doc: FSDP2-aware, copies


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Copy the optimizer's state tensors (moments) to `device`, leaving step counters in place."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, copy=True)
