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
its logits is not its choice.

The loss and z-loss keep the graph (they are added to a training loss); the metrics are detached floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["load_balancing_loss", "router_log_probs", "router_metrics", "router_z_loss"]


def _weights(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[N] float32 token weights: the mask, or ones."""
    if mask is None:
        return torch.ones(logits.shape[0], dtype=torch.float32, device=logits.device)
    return mask.reshape(-1).to(device=logits.device, dtype=torch.float32)


def load_balancing_loss(
    layers: Sequence[torch.Tensor], top_k: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The auxiliary load-balancing loss of the router logits `layers` ([N, E] each) routing to `top_k`.

    Pooled over layers like transformers' `load_balancing_loss_func`: the assignment counts and the
    probabilities of all layers are summed, then divided by the counted tokens of all layers."""
    experts = layers[0].shape[-1]
    device = layers[0].device
    counts = torch.zeros(experts, dtype=torch.float32, device=device)
    probs = torch.zeros(experts, dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for logits in layers:
        w = _weights(logits, mask)
        p = torch.softmax(logits.float(), dim=-1)
        chosen = torch.topk(p, top_k, dim=-1).indices
        counts = counts.scatter_add(0, chosen.reshape(-1), w.repeat_interleave(top_k))
        probs = probs + (p * w.unsqueeze(-1)).sum(dim=0)
        rows = rows + w.sum()
    rows = rows.clamp_min(1.0)
    return experts * torch.sum((counts / rows) * (probs / rows))


def router_z_loss(layers: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
    """ST-MoE's router z-loss: per layer the mean over counted tokens of logsumexp(logits)^2, averaged over
    layers. It keeps the logits small, which keeps the router's softmax numerically stable."""
    total = torch.zeros((), dtype=torch.float32, device=layers[0].device)
    for logits in layers:
        w = _weights(logits, mask)
        z = torch.logsumexp(logits.float(), dim=-1)
        total = total + (z.square() * w).sum() / w.sum().clamp_min(1.0)
    return total / len(layers)


def router_log_probs(logits: torch.Tensor, sigmoid: bool = False) -> torch.Tensor:
    """[N, E] float32 log of the router's distribution over experts: log softmax(logits), or for a sigmoid
    router the log of its scores sigmoid(logits) normalised to sum to 1."""
    if not sigmoid:
        return torch.log_softmax(logits.float(), dim=-1)
    log_scores = torch.nn.functional.logsigmoid(logits.float())
    return log_scores - torch.logsumexp(log_scores, dim=-1, keepdim=True)


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
    entropies, imbalance = [], []
    with torch.no_grad():
        for i, logits in enumerate(layers):
            w = _weights(logits, mask)
            logp = router_log_probs(logits, sigmoid)
            entropy = -(logp.exp() * logp).sum(dim=-1)
            entropies.append(float((entropy * w).sum() / w.sum().clamp_min(1.0)))
            picked = torch.topk(logp, top_k, dim=-1).indices if chosen is None else chosen[i]
            counts = torch.zeros(logits.shape[-1], dtype=torch.float32, device=logits.device)
            counts.scatter_add_(0, picked.reshape(-1).long(), w.repeat_interleave(picked.shape[-1]))
            mean = counts.mean()
            imbalance.append(float(counts.max() / mean) if float(mean) > 0 else 1.0)
    return {
        "router_entropy": sum(entropies) / len(entropies),
        "load_imbalance_max": max(imbalance),
        "load_imbalance_mean": sum(imbalance) / len(imbalance),
    }
