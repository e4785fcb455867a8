"""The router's load-balancing loss, z-loss and metrics against transformers and a hand computation."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from quartet.core.router import RouterStats, load_balancing_loss, router_metrics, router_stats, router_z_loss


def _layers(seed: int, tokens: int = 12, experts: int = 6, n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, experts, generator=g) * 2 for _ in range(n)]


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_load_balancing_loss_equals_transformers(top_k: int) -> None:
    layers = _layers(0)
    ours = load_balancing_loss(layers, top_k)
    theirs = load_balancing_loss_func(tuple(layers), num_experts=6, top_k=top_k)
    torch.testing.assert_close(ours, theirs)


def test_load_balancing_loss_counts_only_masked_tokens_as_transformers_does() -> None:
    layers = _layers(1)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1]])  # [batch 2, seq 6] -> 12 tokens
    ours = load_balancing_loss(layers, 2, mask.reshape(-1))
    theirs = load_balancing_loss_func(tuple(layers), num_experts=6, top_k=2, attention_mask=mask)
    torch.testing.assert_close(ours, theirs)
    kept = mask.reshape(-1).bool()  # the same as dropping the padded rows
    torch.testing.assert_close(ours, load_balancing_loss([t[kept] for t in layers], 2))


def test_load_balancing_loss_keeps_the_graph() -> None:
    layers = [t.requires_grad_() for t in _layers(2)]
    load_balancing_loss(layers, 2).backward()
    assert all(t.grad is not None and float(t.grad.abs().sum()) > 0 for t in layers)


def test_z_loss_is_the_mean_squared_logsumexp_averaged_over_layers() -> None:
    layers = _layers(3, tokens=4, experts=3, n=2)
    mask = torch.tensor([1, 0, 1, 1])
    per_layer = []
    for logits in layers:
        kept = [
            math.log(sum(math.exp(float(x)) for x in row)) ** 2
            for row, m in zip(logits, mask, strict=True)
            if m
        ]
        per_layer.append(sum(kept) / len(kept))
    assert float(router_z_loss(layers, mask)) == pytest.approx(sum(per_layer) / 2, rel=1e-5)


def test_metrics_by_hand() -> None:
    # Layer 0: tokens 0, 1 prefer experts (0, 1), token 2 (0, 2); token 3 is padding.
    # Layer 1: uniform logits: entropy log(4), and top-2 of ties picks the same two experts for every token.
    layer0 = torch.tensor(
        [[5.0, 4.0, 0.0, 0.0], [5.0, 4.0, 0.0, 0.0], [5.0, 0.0, 4.0, 0.0], [0.0, 0.0, 5.0, 4.0]]
    )
    layer1 = torch.zeros(4, 4)
    mask = torch.tensor([1, 1, 1, 0])
    got = router_metrics([layer0, layer1], 2, mask)
    # counts layer 0: expert0 3, expert1 2, expert2 1, expert3 0 -> mean 6/4 = 1.5, max 3 -> 2.0
    # counts layer 1: two experts get 3 each -> max 3 / mean 1.5 = 2.0
    assert got["load_imbalance_max"] == pytest.approx(2.0)
    assert got["load_imbalance_mean"] == pytest.approx(2.0)

    def entropy(row: list[float]) -> float:
        z = sum(math.exp(x) for x in row)
        return -sum(math.exp(x) / z * (x - math.log(z)) for x in row)

    layer0_entropy = (2 * entropy([5, 4, 0, 0]) + entropy([5, 0, 4, 0])) / 3
    assert got["router_entropy"] == pytest.approx((layer0_entropy + math.log(4)) / 2, rel=1e-5)


def test_balanced_routing_has_imbalance_one() -> None:
    logits = torch.full((4, 4), -10.0)
    logits[torch.arange(4), torch.arange(4)] = 10.0  # token i -> expert i
    got = router_metrics([logits], 1)
    assert got["load_imbalance_max"] == pytest.approx(1.0)
    assert got["router_entropy"] < 1e-6


def test_the_statistics_of_token_slices_add_up_to_the_whole_pass() -> None:
    """What a sequence group does: each rank sums over its slice, the sums are added, the losses formed."""
    layers = [t.requires_grad_() for t in _layers(4, tokens=13)]
    mask = torch.ones(13)
    mask[-2:] = 0  # padding at the end, as SP's rounding up leaves it
    slices = [(0, 5), (5, 13)]
    parts = [router_stats([t[a:b] for t in layers], 2, mask[a:b]) for a, b in slices]
    summed = RouterStats.from_flat(parts[0].flat() + parts[1].flat(), layers=3, experts=6)
    want_aux = load_balancing_loss(layers, 2, mask)
    torch.testing.assert_close(summed.load_balancing_loss(), want_aux)
    torch.testing.assert_close(summed.z_loss(), router_z_loss(layers, mask))
    assert summed.metrics() == pytest.approx(router_metrics(layers, 2, mask), rel=1e-6)
    # the gradient through the summed statistics is the whole pass's
    (summed.load_balancing_loss() + summed.z_loss()).backward()
    got = [t.grad.clone() for t in layers]  # type: ignore[union-attr]
    for t in layers:
        t.grad = None
    (want_aux + router_z_loss(layers, mask)).backward()
    for g, t in zip(got, layers, strict=True):
        torch.testing.assert_close(g, t.grad)
    # while a slice's own load-balancing loss is another number (a product of means is not a mean)
    assert abs(float(parts[0].load_balancing_loss()) - float(want_aux)) > 1e-2
