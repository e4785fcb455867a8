"""The routers of a mixture-of-experts model, found in its module tree (for routing record and replay).

transformers' sparse MoE blocks (Qwen3-MoE, Qwen2-MoE, OLMoE, ...) hold a router `gate` and the fused
`experts`; the router's forward returns (router_logits, top-k weights, top-k indices). Recording reads the
indices; replay (`quartet.engines.routing_replay`) replaces that forward for the duration of a pass. Only
softmax-then-top-k routers are supported (those with `top_k`, `num_experts`, `norm_topk_prob` and a
`weight` [E, H]): a router of another kind (sigmoid scores, grouped top-k, a bias term) raises instead of
being replayed with the wrong weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["MoeRouting", "UnsupportedRouterError", "moe_routers", "moe_routing"]

_ROUTER_PARTS = ("top_k", "num_experts", "norm_topk_prob", "weight")


class UnsupportedRouterError(ValueError):
    """A mixture-of-experts router whose forward routing replay does not reproduce."""


@dataclass(frozen=True)
class MoeRouting:
    """The routing shape of a model: what one token's recorded routing holds."""

    num_layers: int
    """MoE layers (those whose MLP is a sparse block), in order."""
    top_k: int
    """Experts per token."""
    num_experts: int
    """Experts per layer."""


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The `gate` of every sparse MoE block of `model`, in forward order (empty for a dense model).

    Raises `UnsupportedRouterError` for a router that is not a softmax top-k router (see the module doc).
    """
    routers: list[nn.Module] = []
    for name, module in model.named_modules():
        other = getattr(module, "router", None)  # gpt-oss: `mlp.router`, a biased top-k-then-softmax router
        if isinstance(other, nn.Module) and hasattr(module, "experts"):
            raise UnsupportedRouterError(
                f"the router {name}.router ({type(other).__name__}) is not a softmax top-k `gate`: routing "
                "record and replay support softmax top-k routers (Qwen3-MoE style) only"
            )
        gate = getattr(module, "gate", None)
        if not isinstance(gate, nn.Module) or not hasattr(module, "experts"):
            continue
        missing = [p for p in _ROUTER_PARTS if not hasattr(gate, p)]
        if hasattr(gate, "e_score_correction_bias"):  # DeepSeek-V3: sigmoid scores, grouped top-k
            missing.append("softmax scores (it scores by sigmoid with a correction bias, grouped top-k)")
        if missing:
            raise UnsupportedRouterError(
                f"the router {name}.gate ({type(gate).__name__}) lacks {missing}: routing record and "
                "replay support softmax top-k routers (Qwen3-MoE style) only"
            )
        routers.append(gate)
    return routers


def moe_routing(model: nn.Module) -> MoeRouting | None:
    """The routing shape of `model`, or None for a dense model. All routers must agree on k and E."""
    routers = moe_routers(model)
    if not routers:
        return None
    shapes: set[tuple[int, int]] = set()
    for router in routers:
        attrs: Any = router  # a transformers router: plain int attributes
        shapes.add((int(attrs.top_k), int(attrs.num_experts)))
    if len(shapes) != 1:
        raise UnsupportedRouterError(f"the MoE layers differ in (top_k, num_experts): {sorted(shapes)}")
    top_k, experts = shapes.pop()
    return MoeRouting(len(routers), top_k, experts)
