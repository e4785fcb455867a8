"""Batched next-token sampling with per-row parameters, on the logits' device.

Each row (sequence) has its own temperature, top-k, top-p and random stream. Sampling is by inverse CDF: a
sequence draws all its uniforms up front from a `torch.Generator` seeded by the request (`draw_uniforms`),
and at step t the engine passes that sequence's t-th uniform `u`. The token is the first one whose
cumulative probability exceeds `u * total`, walking the vocabulary in index order, or for a row with top-k
or top-p in ranked order (logit descending, equal logits by index), where the cuts are made. Each row's
order is its own: one uniform per token then keeps a sequence's samples independent of which other
sequences share its batch (up to floating-point differences in the logits), costs one gather per step
instead of a generator call per row, and works the same on CPU and GPU.

Log-probs are `log_softmax(logits / T)` at the sampled token, before top-k/top-p
(see `quartet.rollout.types`); `top_logprobs` reads the alternatives from the same distribution. The
`logits` given here are those the engine samples from: after penalties
(`quartet.rollout.torch.penalties`) when a request asks for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RowSampling", "draw_uniforms", "sample_next", "sample_seed", "top_logprobs"]

_GOLDEN = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads consecutive sample indices over the seed space
_MASK63 = (1 << 63) - 1


def sample_seed(request_seed: int, sample_index: int) -> int:
    """Seed of sample `sample_index` of a request seeded with `request_seed` (distinct per sample)."""
    return (request_seed * 1_000_003 + (sample_index + 1) * _GOLDEN) & _MASK63


def draw_uniforms(seed: int, count: int) -> torch.Tensor:
    """`count` uniforms in [0, 1) [count] float32 (CPU) from a generator seeded with `seed`."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return torch.rand(count, generator=gen, dtype=torch.float32)


@dataclass
class RowSampling:
    """Per-row sampling parameters of A rows, on the logits' device.

    temperature [A] float32 (0 = greedy), top_k [A] int64 (0 = off), top_p [A] float32 (1 = off).
    The flags are host-side summaries so the common cases skip work (no sort without top-k/top-p).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    any_filter: bool
    any_greedy: bool
    all_greedy: bool


def _filtered_inverse_cdf(scaled: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor) -> torch.Tensor:
    """Token [A] int64 sampled from softmax(scaled) [A, V] truncated by per-row top-k, then top-p."""
    vocab = scaled.shape[-1]
    # Stable: equal logits rank by vocab index (lower first), at the top-k cut, the top-p cut and the draw
    # alike; the fused sampler (`kernels.sampler`) follows the same rule.
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(vocab, device=scaled.device)
    k = torch.where(rows.top_k > 0, rows.top_k, vocab)
    keep = ranks.unsqueeze(0) < k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    # Top-p on the top-k-renormalised distribution (vLLM's and transformers' order): keep a token while the
    # mass strictly before it is below top_p, so the most likely token is always kept.
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs * (mass_before < rows.top_p.unsqueeze(1))
    pos = _inverse_cdf(probs, uniforms)
    return order.gather(1, pos.unsqueeze(1)).squeeze(1)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index [A] int64 of the first entry of cumsum(probs) [A, V] that exceeds `uniforms * total`.

    `right=True` skips zero-probability entries (a flat CDF never exceeds the value inside the flat part).
    """
    cdf = probs.cumsum(dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(1)
    pos = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return pos.clamp_(max=probs.shape[-1] - 1)


def sample_next(
    logits: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor, want_logprobs: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sample one token per row.

    logits [A, V] (any float dtype; computed in float32), uniforms [A] float32 in [0, 1).
    Returns tokens [A] int64 and, when `want_logprobs`, their log-probs [A] float32 under
    log_softmax(logits / T) (T = 1 for greedy rows).
    """
    logits = logits.float()
    if rows.all_greedy:
        tokens = logits.argmax(dim=-1)
        scaled = logits
    else:
        temp = torch.where(rows.temperature > 0, rows.temperature, 1.0)
        scaled = logits / temp.unsqueeze(1)
        tokens = _inverse_cdf(torch.softmax(scaled, dim=-1), uniforms)
        if rows.any_filter:  # the rows that filter walk the ranked order; the others keep theirs
            filters = (rows.top_k > 0) | (rows.top_p < 1.0)
            tokens = torch.where(filters, _filtered_inverse_cdf(scaled, rows, uniforms), tokens)
        if rows.any_greedy:
            tokens = torch.where(rows.temperature > 0, tokens, logits.argmax(dim=-1))
    if not want_logprobs:
        return tokens, None
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, logprobs


def top_logprobs(
    logits: torch.Tensor, temperature: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens of each row and their log-probs under log_softmax(logits / T).

    logits [A, V], temperature [A] float32 (0 = greedy, reported at T = 1, as `sample_next` does).
    Returns log-probs [A, k] float32 (descending) and token ids [A, k] int64.
    """
    temp = torch.where(temperature > 0, temperature, 1.0)
    logprobs = torch.log_softmax(logits.float() / temp.unsqueeze(1), dim=-1)
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    return values, ids
