"""A mixture-of-experts model's router in the training engine: capture its logits, add its losses.

transformers' MoE models declare their routers in `_can_record_outputs["router_logits"]` (the router class
and which output is the logits: Qwen3-MoE's `Qwen3MoeTopKRouter` returns (logits, top-k weights, top-k
indices)). `RouterLoss.of(module, spec, group)` finds that declaration on the loaded model (inside a peft or
FSDP wrapper too) and hooks every such router; a dense model has none and gets None, so nothing changes.

    router = RouterLoss.of(module, spec, seq_group)       # coefficients from the spec; group: SP or None
    with routing(router, inputs, packs) as routed:        # the micro-batch's `ModelInputs`
        outputs = model(...)
    loss, metrics = router.add(loss, metrics, routed, scale)  # scale: the mini-batch's `LossScale`

Each micro-batch's terms are weighted by its share of the mini-batch's attended tokens (all micro-batches,
all data-parallel ranks: `scale.attended_tokens`), so the terms summed over micro-batches and ranks are the
token-weighted mean of each micro-batch's loss, as the policy loss is the mean of the whole mini-batch.
The terms (`core.router`) count every non-pad token: the padded pass's `attention_mask`, and on a packed
pass every token (it holds real tokens only) but, under sequence parallelism, the padding that rounds the
packed length up to a multiple of sp. Capture happens in the forward only: under gradient checkpointing
(non-reentrant) the recomputation in backward is not recorded twice, and the captured logits carry the
graph back to the routers.

Sequence parallelism: each rank of a sequence group routes its slice of the micro-batch's tokens. The
load-balancing loss is a product of per-expert means over ALL the tokens, which no slice gives; so each
rank forms the sums of `core.router.RouterStats` over its slice, the group sums them (one all-reduce per
micro-batch, `ulysses.sum_over_group`, whose backward hands each rank the gradient of the shared loss), and
every rank forms the loss and metrics of the whole micro-batch, exactly one process's. Expert parallelism
changes nothing here: routers run on the rank's own tokens either way.

Metrics (per micro-batch, then averaged like the loss's): `moe/aux_loss` and `moe/z_loss` (the terms
before their coefficients), `moe/router_entropy`, `moe/load_imbalance_max`, `moe/load_imbalance_mean`. The
load metrics count the experts each router returned (its top-k indices, the third output of transformers'
routers), so a router that does not pick the top-k of its logits is measured by what it picked.

A sigmoid router (DeepSeek-V3's: a score correction bias and grouped top-k) has no load-balancing loss in
its model's training (DeepSeek balances the load by moving the bias outside the gradient, which quartet
does not do; the bias stays as loaded): a nonzero `moe_aux_loss_coef` is refused (`aux_loss_problem`),
null takes 0, and `moe/aux_loss` is not logged. Its entropy is that of its scores normalised to sum to 1
(`core.router.router_log_probs`); the z-loss still penalises the size of its logits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quartet.core.router import RouterStats, router_stats
from quartet.engines.inputs import ModelInputs
from quartet.engines.spec import EngineSpec, LossScale
from quartet.engines.ulysses import SeqGroup, slice_mask, sum_over_group

__all__ = [
    "Routed",
    "RouterLoss",
    "aux_loss_problem",
    "find_routers",
    "is_sigmoid_router",
    "routing",
    "token_mask",
]


def is_sigmoid_router(router: nn.Module) -> bool:
    """A router that scores experts by sigmoid with a correction bias (DeepSeek-V3's
    `e_score_correction_bias`, grouped top-k), whose model defines no load-balancing loss."""
    return hasattr(router, "e_score_correction_bias")


def aux_loss_problem(model_type: str, sigmoid: bool, aux_coef: float | None) -> str:
    """Why `aux_coef` cannot weigh this model's load-balancing loss ('' when it can): a sigmoid router's
    model has none to weigh."""
    if not sigmoid or not aux_coef:
        return ""
    return (
        f"moe_aux_loss_coef is {aux_coef}, but a {model_type} model's router (sigmoid scores with a "
        "correction bias and grouped top-k) has no load-balancing loss in its model's training "
        "(DeepSeek balances the load through the bias, outside the gradient); set "
        "actor.moe_aux_loss_coef (critic.moe_aux_loss_coef for the critic) to 0 or null (docs/moe.md)"
    )


def find_routers(module: nn.Module) -> tuple[list[nn.Module], int, Any]:
    """The router modules of `module`'s MoE model, the output index of their logits, and the model's config
    (empty list, 0, None for a dense model)."""
    for sub in module.modules():
        recorders = getattr(type(sub), "_can_record_outputs", None) or {}
        recorder = recorders.get("router_logits")
        if recorder is None:
            continue
        routers = [m for m in module.modules() if isinstance(m, recorder.target_class)]
        if routers:
            return routers, int(recorder.index or 0), getattr(sub, "config", None)
    return [], 0, None


@dataclass
class Routed:
    """The router logits of one forward pass ([N, E] per MoE layer), the experts each router chose ([N, k]
    per layer, when its output holds them) and the [N] mask of counted tokens."""

    layers: list[torch.Tensor] = field(default_factory=list)
    mask: torch.Tensor | None = None
    chosen: list[torch.Tensor] = field(default_factory=list)


class RouterLoss:
    """Hooks on a MoE model's routers, and the router terms added to a micro-batch's loss."""

    def __init__(
        self,
        routers: list[nn.Module],
        index: int,
        top_k: int,
        aux_coef: float,
        z_coef: float,
        group: SeqGroup | None = None,
        sigmoid: bool = False,
    ):
        self.top_k = top_k
        self.aux_coef = aux_coef
        self.z_coef = z_coef
        self.sigmoid = sigmoid
        """The routers score by sigmoid (`is_sigmoid_router`): no load-balancing loss, normalised scores."""
        self.group = group
        """The sequence group whose ranks route slices of one micro-batch (None without SP)."""
        self._index = index
        self._current: Routed | None = None
        for router in routers:
            router.register_forward_hook(self._record)

    @classmethod
    def of(cls, module: nn.Module, spec: EngineSpec, group: SeqGroup | None = None) -> RouterLoss | None:
        """Hooks on `module`'s routers (None for a dense model), with `spec.moe_aux_loss_coef` (None: the
        model config's `router_aux_loss_coef`, 0 when it has none) and `spec.moe_z_loss_coef`; `group`: the
        engine's sequence group. Raises ValueError for a nonzero `moe_aux_loss_coef` on a model that defines
        no load-balancing loss (`aux_loss_problem`)."""
        routers, index, config = find_routers(module)
        if not routers:
            return None
        sigmoid = is_sigmoid_router(routers[0])
        aux_coef = spec.moe_aux_loss_coef
        problem = aux_loss_problem(str(getattr(config, "model_type", "?")), sigmoid, aux_coef)
        if problem:
            raise ValueError(problem)
        if aux_coef is None:
            aux_coef = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)
        top_k = int(config.num_experts_per_tok)
        return cls(routers, index, top_k, aux_coef, spec.moe_z_loss_coef, group, sigmoid)

    def _record(self, _module: nn.Module, _inputs: Any, output: Any) -> None:
        if self._current is None:
            return
        logits = output[self._index] if isinstance(output, tuple | list) else output
        self._current.layers.append(logits.reshape(-1, logits.shape[-1]))
        # transformers' routers return (logits, top-k weights, top-k indices): the choice actually made
        if isinstance(output, tuple | list) and len(output) == 3 and not output[2].is_floating_point():
            self._current.chosen.append(output[2].detach().reshape(-1, output[2].shape[-1]))

    @contextmanager
    def capturing(self, attention_mask: torch.Tensor | None) -> Iterator[Routed]:
        """Record the router logits of the forward passes inside the block; `attention_mask` [b, T] marks
        the padded pass's real tokens (None: every token counts)."""
        routed = Routed(mask=None if attention_mask is None else attention_mask.reshape(-1))
        self._current = routed
        try:
            yield routed
        finally:
            self._current = None

    def add(
        self,
        loss: torch.Tensor,
        metrics: Mapping[str, torch.Tensor | float],
        routed: Routed,
        scale: LossScale,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """`loss` plus the micro-batch's share of the mini-batch's tokens x (aux_coef x aux loss + z_coef x
        z-loss) of `routed`, and `metrics` with the `moe/*` metrics (see the module doc)."""
        out = dict(metrics)
        if not routed.layers:
            return loss, out
        stats = self.stats(routed)
        share = float(stats.tokens[0]) / max(scale.attended_tokens, 1)
        if not self.sigmoid:  # a sigmoid router's model defines no load-balancing loss (module doc)
            aux = stats.load_balancing_loss()
            if self.aux_coef:
                loss = loss + share * self.aux_coef * aux
            out["moe/aux_loss"] = float(aux.detach())
        z = stats.z_loss()
        if self.z_coef:
            loss = loss + share * self.z_coef * z
        out["moe/z_loss"] = float(z.detach())
        out.update({f"moe/{k}": v for k, v in stats.metrics().items()})
        return loss, out

    def stats(self, routed: Routed) -> RouterStats:
        """The router statistics of the whole micro-batch: this rank's, summed over its sequence group."""
        chosen = routed.chosen if len(routed.chosen) == len(routed.layers) else None
        mine = router_stats(routed.layers, self.top_k, routed.mask, chosen, self.sigmoid)
        if self.group is None:
            return mine
        layers, experts = mine.counts.shape
        return RouterStats.from_flat(sum_over_group(mine.flat(), self.group), layers, experts)


def token_mask(router: RouterLoss, inputs: ModelInputs, packs: bool) -> torch.Tensor | None:
    """[N] the tokens the router's terms count among those this rank routes: the padded pass's attention
    mask; on a packed pass all (None), or under SP those of this rank's slice that are not the padding
    (`ulysses.slice_mask`)."""
    if not packs:
        return inputs.attention_mask
    if router.group is None or router.group.size == 1:
        return None
    return slice_mask(int((inputs.attention_mask != 0).sum()), router.group)


@contextmanager
def routing(router: RouterLoss | None, inputs: ModelInputs, packs: bool) -> Iterator[Routed]:
    """`router.capturing` the micro-batch `inputs` (`packs`: run packed), or an empty `Routed` for a dense
    model (no router)."""
    if router is None:
        yield Routed()
        return
    with router.capturing(token_mask(router, inputs, packs)) as routed:
        yield routed
