"""Routing replay (R3) in the training engine: the MoE routers route each token as the rollout engine did.

The rollout engine records the top-k experts of every MoE layer for every token it fed
(`rollout.record_routing`); the batch carries them as `routed_experts`, aligned with the input ids, and
`build_inputs` trims them like the ids (`ModelInputs.routing`). For one micro-batch, `RoutingReplay.pass_`
replaces each router's forward (an instance attribute, removed on exit) by one that

- computes the router logits and their float32 softmax as transformers' router does,
- takes the top-k INDICES from the record instead of its own `topk`,
- returns as weights the softmax probabilities gathered at those indices, renormalised over the k when the
  router's `norm_topk_prob` says so, cast to the logits' dtype.

So the experts are the engine's, and the gate still gets a gradient through the gathered probabilities
(as in the R3 paper and verl/Megatron's replay): a token's loss moves the router towards or away from the
experts it actually used. The flattened token order is the router's input order: [b * T] row-major on the
padded path, the real tokens row after row on the packed path (`packing.pack_inputs`), so the record is
flattened the same way. The patch must stay on through the backward: gradient checkpointing recomputes the
layer's forward there (the engine holds the pass around forward and backward).

With `record`, the pass also keeps each router's OWN top-k (without replay: a hook on the original forward;
with replay: the top-k of the same probabilities, i.e. what this layer would have chosen for its inputs)
for `response_mismatch`, the per-token share of MoE layers whose top-k set differs from the engine's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quartet.core.routing import fed_response_mask, routing_mismatch
from quartet.engines.inputs import ModelInputs, pad_responses
from quartet.engines.spec import ModelOutputs
from quartet.models.moe import moe_routers, moe_routing

__all__ = ["RoutingCapture", "RoutingReplay", "response_mismatch", "with_mismatch"]


class RoutingCapture:
    """The own top-k of every MoE layer in one forward (when recording), next to the record replayed."""

    def __init__(self, recorded: torch.Tensor, layers: int, packed: bool) -> None:
        self.recorded = recorded
        """[N, L, k] int64: the engine's routing of the micro-batch's flattened tokens."""
        self.packed = packed
        """The tokens are the packed sequence's (real tokens only), else the padded [b * T]."""
        self.own: list[torch.Tensor | None] = [None] * layers
        """Per layer, [N, k]: the top-k the router chose itself (None until its forward ran)."""

    def keep(self, layer: int, indices: torch.Tensor) -> None:
        """Layer `layer`'s own choice for this forward (a recomputation overwrites it with equal values)."""
        self.own[layer] = indices.detach()

    def layer_mismatch(self) -> torch.Tensor:
        """[N, L] bool: where the router's own top-k set differs from the recorded one."""
        if any(o is None for o in self.own):
            raise RuntimeError("a MoE layer did not run in the recorded forward")
        own = torch.stack([o for o in self.own if o is not None], dim=1)
        return routing_mismatch(own, self.recorded.to(own.device))


def _replayed_forward(router: Any, indices: torch.Tensor, layer: int, capture: RoutingCapture | None) -> Any:
    """A router forward that returns `indices` [N, k] with the softmax weights gathered there."""

    def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = hidden_states.reshape(-1, router.weight.shape[1])
        if hidden.shape[0] != indices.shape[0]:
            raise RuntimeError(
                f"routing replay: the router of MoE layer {layer} sees {hidden.shape[0]} tokens, the "
                f"record of the micro-batch has {indices.shape[0]}"
            )
        logits = F.linear(hidden, router.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        if capture is not None:
            capture.keep(layer, probs.topk(int(router.top_k), dim=-1).indices)
        weights = probs.gather(-1, indices)
        if router.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(logits.dtype), indices

    return forward


class RoutingReplay:
    """A model's MoE routers, and passes that replay a micro-batch's recorded routing on them."""

    def __init__(self, module: nn.Module, replay: bool) -> None:
        """`replay`: the engine's passes replay `routed_experts` (`actor.routing_replay=rollout`); a dense
        model then raises ValueError. Without it, only the mismatch of a recorded batch is measured."""
        self.module = module
        self.replay = replay
        self._routers: list[nn.Module] | None = None
        self._experts: int | None = None
        if replay and not self.routers:
            raise ValueError(
                f"routing replay (actor.routing_replay=rollout) needs a mixture-of-experts model; "
                f"{type(module).__name__} has no MoE layers"
            )

    @property
    def routers(self) -> list[nn.Module]:
        """The routers, in forward order (found on first use)."""
        if self._routers is None:
            self._routers = moe_routers(self.module)
        return self._routers

    def flat_record(self, inputs: ModelInputs, packed: bool, device: torch.device) -> torch.Tensor | None:
        """The micro-batch's recorded routing as [N, L, k] int64 in the router's token order, or None; a
        record that does not fit the model (its layers, an expert index out of range) is a ValueError."""
        if inputs.routing is None:
            return None
        if packed:
            flat = inputs.routing[inputs.attention_mask != 0]
        else:
            flat = inputs.routing.reshape(-1, *inputs.routing.shape[2:])
        if flat.shape[1] != len(self.routers):
            raise ValueError(
                f"the batch's routed_experts has {flat.shape[1]} MoE layers, the model {len(self.routers)}"
            )
        if self._experts is None:
            shape = moe_routing(self.module)
            self._experts = shape.num_experts if shape is not None else 0
        experts = self._experts
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= experts):
            raise ValueError(  # never an out-of-range gather (a device assert on CUDA) from a bad record
                f"the batch's routed_experts names experts {int(flat.min())}..{int(flat.max())}; the model "
                f"has {experts}"
            )
        return flat.to(device=device, dtype=torch.int64)

    @contextmanager
    def pass_(
        self, inputs: ModelInputs, packed: bool, device: torch.device, record: bool = False
    ) -> Iterator[RoutingCapture | None]:
        """One micro-batch's forward (and backward) with the recorded routing replayed (when `replay`), and
        the routers' own choices kept (when `record` and the batch has a record). Yields the capture or None.
        """
        flat = self.flat_record(inputs, packed, device) if (self.replay or record) else None
        if self.replay and flat is None:
            raise ValueError(
                "actor.routing_replay=rollout, but the batch carries no routed_experts: generate it with "
                "the built-in engine recording routing (rollout.record_routing)"
            )
        if flat is None:
            yield None
            return
        capture = RoutingCapture(flat, len(self.routers), packed) if record else None
        undo = self._replay(flat, capture) if self.replay else self._hook(capture)
        try:
            yield capture
        finally:
            undo()

    def _replay(self, flat: torch.Tensor, capture: RoutingCapture | None) -> Callable[[], None]:
        """Each router's forward replaced by the replaying one (an instance attribute); returns the undo."""
        for layer, router in enumerate(self.routers):
            router.forward = _replayed_forward(router, flat[:, layer], layer, capture)

        def undo() -> None:
            for router in self.routers:
                del router.forward

        return undo

    def _hook(self, capture: RoutingCapture | None) -> Callable[[], None]:
        """Hooks that keep each router's own top-k in `capture` (none without one); returns the undo."""
        handles = []
        if capture is not None:
            for layer, router in enumerate(self.routers):

                def keep(module: nn.Module, args: Any, output: Any, layer: int = layer) -> None:
                    capture.keep(layer, output[2])

                handles.append(router.register_forward_hook(keep))

        def undo() -> None:
            for handle in handles:
                handle.remove()

        return undo


def response_mismatch(capture: RoutingCapture, inputs: ModelInputs) -> torch.Tensor:
    """[b, R'] float32: per response token, the share of MoE layers whose own top-k set differs from the
    engine's; 0 where the engine recorded nothing (padding, and each row's last token, never fed back)."""
    share = capture.layer_mismatch().float().mean(dim=1)  # [N]
    mask = inputs.attention_mask != 0
    if capture.packed:
        share = torch.zeros(mask.shape, device=share.device).masked_scatter(mask.to(share.device), share)
    else:
        share = share.view(mask.shape)
    width = inputs.response_width
    fed = fed_response_mask(inputs.response_mask).to(share.device)
    return torch.where(fed, share[:, share.shape[1] - width :], torch.zeros((), device=share.device))


def with_mismatch(out: ModelOutputs, capture: RoutingCapture | None, inputs: ModelInputs) -> ModelOutputs:
    """`out` of one micro-batch with its `routing_mismatch` [b, R] (`response_mismatch`, padded to the
    outputs' width) when the pass kept the routers' choices; `out` unchanged otherwise."""
    if capture is None or out.logprobs is None:
        return out
    shares = pad_responses(response_mismatch(capture, inputs), out.logprobs.shape[1])
    return dataclasses.replace(out, routing_mismatch=shares)
