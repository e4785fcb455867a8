"""The router of a mixture-of-experts model: its load-balancing loss, z-loss and per-step metrics.

Every function takes the router logits of one forward pass, one [N, E] tensor per MoE layer (N tokens in
the layer's flattened order, E experts), and an optional [N] mask of the tokens that count (1: a real
token, 0: padding). All non-pad tokens count, prompt and response alike: the router balances the load of
every token it routes, and that is what transformers' own training loss uses (`attention_mask`).

    load_balancing_loss   Switch Transformer's E * sum_e f_e * P_e, pooled over layers, exactly as
                          transformers' `load_balancing_loss_func` (f_e: share of top-k assignments that
                          went to expert e, summing to k; P_e: mean router probability of expert e)
    router_z_loss         ST-MoE's mean over tokens of logsumexp(logits)^2, averaged over layers
    router_metrics        mean per-token entropy of the router's distribution over experts, and per layer
                          the busiest expert's assignments over the mean expert's (1 = perfectly
                          balanced), its max and mean over layers

Two kinds of router: a softmax router (Qwen-MoE, Mixtral, gpt-oss) picks the top-k of softmax(logits), and
its distribution is that softmax. A sigmoid router (DeepSeek-V3) scores each expert sigmoid(logit) on its
own and picks the top-k of those scores plus a correction bias within the best groups of experts: its
distribution here is the scores normalised to sum to 1 (`sigmoid=True`). The load metrics count the experts
the router chose (`chosen`, its top-k indices) where the caller has them: for a sigmoid router the top-k of
its logits is not its choice. The load-balancing loss counts the top-k of the softmax, as transformers'
loss does.

All three are formed from `RouterStats`, the sums over tokens they need (`router_stats`). Sums add up: the
statistics of disjoint token slices (sequence parallelism's ranks) summed are those of the whole pass, so a
sequence group sums its ranks' statistics once (`engines.router`) and forms the same loss and metrics as one
process holding every token. The loss and z-loss keep the graph (they are added to a training loss); the
metrics are detached floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "RouterStats",
    "load_balancing_loss",
    "router_log_probs",
    "router_metrics",
    "router_stats",
    "router_z_loss",
]


@dataclass(frozen=True)
class RouterStats:
    """Sums over the counted tokens of one pass's router logits, per MoE layer (L layers, E experts)."""

    counts: torch.Tensor
    """[L, E] top-k assignments each expert got (no graph: top-k picks indices)."""
    probs: torch.Tensor
    """[L, E] router probability of each expert summed over tokens (keeps the graph)."""
    tokens: torch.Tensor
    """[L] counted tokens."""
    z: torch.Tensor
    """[L] logsumexp(logits)^2 summed over tokens (keeps the graph)."""
    entropy: torch.Tensor
    """[L] entropy of the router's distribution (`router_log_probs`) summed over tokens (no graph)."""
    load: torch.Tensor
    """[L, E] assignments each expert got as the router chose them (`chosen`; else `counts`; no graph)."""

    def flat(self) -> torch.Tensor:
        """Every statistic in one 1-D float32 tensor (one collective sums them all; `from_flat` undoes it)."""
        parts = [self.counts.flatten(), self.probs.flatten(), self.tokens, self.z, self.entropy]
        return torch.cat([*parts, self.load.flatten()])

    @classmethod
    def from_flat(cls, flat: torch.Tensor, layers: int, experts: int) -> RouterStats:
        """The statistics of `flat()` for `layers` layers of `experts` experts."""
        le = layers * experts
        rest = flat[2 * le : 2 * le + 3 * layers]
        return cls(
            counts=flat[:le].reshape(layers, experts),
            probs=flat[le : 2 * le].reshape(layers, experts),
            tokens=rest[:layers],
            z=rest[layers : 2 * layers],
            entropy=rest[2 * layers :],
            load=flat[2 * le + 3 * layers :].reshape(layers, experts),
        )

    def load_balancing_loss(self) -> torch.Tensor:
        """E * sum_e f_e * P_e with the counts and probabilities pooled over layers (transformers' way)."""
        rows = self.tokens.sum().clamp_min(1.0)
        return self.counts.shape[1] * torch.sum((self.counts.sum(0) / rows) * (self.probs.sum(0) / rows))

    def z_loss(self) -> torch.Tensor:
        """Per layer the mean over tokens of logsumexp(logits)^2, averaged over layers."""
        return (self.z / self.tokens.clamp_min(1.0)).mean()

    def metrics(self) -> dict[str, float]:
        """`router_entropy`, `load_imbalance_max` and `load_imbalance_mean` (see `router_metrics`)."""
        with torch.no_grad():
            entropy = (self.entropy / self.tokens.clamp_min(1.0)).mean()
            mean = self.load.mean(dim=1)
            ratio = torch.where(mean > 0, self.load.amax(dim=1) / mean.clamp_min(1e-30), 1.0)
        return {
            "router_entropy": float(entropy),
            "load_imbalance_max": float(ratio.max()),
            "load_imbalance_mean": float(ratio.mean()),
        }


def _weights(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[N] float32 token weights: the mask, or ones."""
    if mask is None:
        return torch.ones(logits.shape[0], dtype=torch.float32, device=logits.device)
    return mask.reshape(-1).to(device=logits.device, dtype=torch.float32)


def router_log_probs(logits: torch.Tensor, sigmoid: bool = False) -> torch.Tensor:
    """[N, E] float32 log of the router's distribution over experts: log softmax(logits), or for a sigmoid
    router the log of its scores sigmoid(logits) normalised to sum to 1."""
    if not sigmoid:
        return torch.log_softmax(logits.float(), dim=-1)
    log_scores = torch.nn.functional.logsigmoid(logits.float())
    return log_scores - torch.logsumexp(log_scores, dim=-1, keepdim=True)


def router_stats(
    layers: Sequence[torch.Tensor],
    top_k: int,
    mask: torch.Tensor | None = None,
    chosen: Sequence[torch.Tensor] | None = None,
    sigmoid: bool = False,
) -> RouterStats:
    """The sums of `RouterStats` over the tokens `mask` counts, of the router logits `layers` ([N, E] each)
    routing to `top_k` experts. `chosen`: each layer's [N, k] expert indices as the router picked them (the
    load metrics count those; None: the top-k of the softmax); `sigmoid`: a sigmoid router's entropy."""
    counts: list[torch.Tensor] = []
    load: list[torch.Tensor] = []
    probs: list[torch.Tensor] = []
    tokens: list[torch.Tensor] = []
    z: list[torch.Tensor] = []
    entropy: list[torch.Tensor] = []
    for i, logits in enumerate(layers):
        w = _weights(logits, mask)
        p = torch.softmax(logits.float(), dim=-1)
        top = torch.topk(p, top_k, dim=-1).indices
        per_expert = torch.zeros(logits.shape[-1], dtype=torch.float32, device=logits.device)
        counts.append(per_expert.scatter_add(0, top.reshape(-1), w.repeat_interleave(top_k)).detach())
        if chosen is None:
            load.append(counts[-1])
        else:
            picked = chosen[i].reshape(-1).long().to(logits.device)
            weights = w.repeat_interleave(chosen[i].shape[-1])
            load.append(per_expert.scatter_add(0, picked, weights).detach())
        probs.append((p * w.unsqueeze(-1)).sum(dim=0))
        tokens.append(w.sum())
        z.append((torch.logsumexp(logits.float(), dim=-1).square() * w).sum())
        with torch.no_grad():
            logp = router_log_probs(logits, sigmoid)
            entropy.append((-(logp.exp() * logp).sum(dim=-1) * w).sum())
    return RouterStats(
        counts=torch.stack(counts),
        probs=torch.stack(probs),
        tokens=torch.stack(tokens),
        z=torch.stack(z),
        entropy=torch.stack(entropy),
        load=torch.stack(load),
    )


def load_balancing_loss(
    layers: Sequence[torch.Tensor], top_k: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The auxiliary load-balancing loss of the router logits `layers` ([N, E] each) routing to `top_k`.

    Pooled over layers like transformers' `load_balancing_loss_func`: the assignment counts and the
    probabilities of all layers are summed, then divided by the counted tokens of all layers."""
    return router_stats(layers, top_k, mask).load_balancing_loss()


def router_z_loss(layers: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
    """ST-MoE's router z-loss: per layer the mean over counted tokens of logsumexp(logits)^2, averaged over
    layers. It keeps the logits small, which keeps the router's softmax numerically stable."""
    return router_stats(layers, 1, mask).z_loss()


def router_metrics(
    layers: Sequence[torch.Tensor],
    top_k: int,
    mask: torch.Tensor | None = None,
    chosen: Sequence[torch.Tensor] | None = None,
    sigmoid: bool = False,
) -> dict[str, float]:
    """`router_entropy` (mean over layers and counted tokens of the entropy of the router's distribution,
    `router_log_probs`), `load_imbalance_max` and `load_imbalance_mean` (per layer: the most top-k
    assignments any expert got over the mean per expert; then the max and the mean over layers).

    `chosen`: each layer's [N, k] expert indices as the router picked them; None: the top-k of the logits
    (a softmax router's choice)."""
    with torch.no_grad():
        return router_stats(layers, top_k, mask, chosen, sigmoid).metrics()
