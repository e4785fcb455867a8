"""The built-in engine's record of MoE routing: the top-k expert indices of every layer, per token it feeds.

Routing replay (docs/moe_routing_replay.md) needs, for every token the engine processed, the experts each
MoE layer sent it to. A forward hook on each layer's router (`mlp.gate`) keeps the indices it returns; the
runner stacks them after the layer loop into one [tokens, L, k] tensor in the smallest integer dtype
(`quartet.core.routing.routing_dtype`), on the device, so no host sync happens per step.

The hooks only collect between `begin()` and `finish()`, which the runner calls around its own prefill and
decode forwards: a trainer sharing the model (or a `generate` of transformers) is not recorded. Under a CUDA
graph capture the hooks run once, at capture, and the stack is part of the graph: each replay rewrites the
same output tensor, which `BucketedDecoder` hands on like the logits (recorded inside the graph).
Without `record_routing` no recorder exists and no hook is registered: zero cost.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from quartet.core.routing import routing_dtype
from quartet.models.moe import MoeRouting, moe_routers, moe_routing

__all__ = ["RoutingRecorder"]


class RoutingRecorder:
    """Hooks on a model's routers that collect the top-k indices of the forwards between begin and finish."""

    def __init__(self, model: nn.Module) -> None:
        shape = moe_routing(model)
        if shape is None:
            raise ValueError(
                f"{type(model).__name__} has no mixture-of-experts layers: there is no routing to record "
                "(rollout.record_routing / actor.routing_replay need an MoE model)"
            )
        self.shape: MoeRouting = shape
        self.dtype = routing_dtype(shape.num_experts)
        self._parts: list[torch.Tensor] | None = None
        self._handles: list[RemovableHandle] = [
            router.register_forward_hook(self._keep) for router in moe_routers(model)
        ]

    def _keep(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._parts is not None:
            self._parts.append(output[2])

    def begin(self) -> None:
        """Start collecting (the runner's forward begins)."""
        self._parts = []

    def finish(self) -> torch.Tensor:
        """The collected indices as [tokens, L, k] in `dtype` (tokens: the forward's flattened positions)."""
        parts, self._parts = self._parts, None
        if parts is None or len(parts) != self.shape.num_layers:
            got = None if parts is None else len(parts)
            raise RuntimeError(
                f"recorded {got} MoE layers in one forward, the model has {self.shape.num_layers}"
            )
        return torch.stack(parts, dim=1).to(self.dtype)

    def remove(self) -> None:
        """Take the hooks off the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
