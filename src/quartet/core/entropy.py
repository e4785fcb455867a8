"""Token entropy of the policy from its logits, and the entropy bonus of the actor loss.

For logits z over a vocabulary of V entries, p = softmax(z):

    H(p) = - sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v

computed in the stable form: with m = max_v z_v, s = sum_v exp(z_v - m) and u = sum_v exp(z_v - m) z_v,
H = m + log s - u / s. Nothing is exponentiated above 0, and entries with z = -inf (banned tokens) add
exactly 0 instead of 0 * inf = NaN.

Memory. Logits of a long response over a large vocabulary are the largest tensor of a training step (8k
tokens x 152k entries is 5 GB in float32). The entropy is computed over chunks of `chunk_size` tokens,
and within a chunk over blocks of `vocab_chunk_size` entries, so the float32 temporaries are at most
chunk_size x vocab_chunk_size. When gradients are needed each token chunk runs under activation
checkpointing: backward recomputes the chunk's softmax instead of keeping it, so the saved activations are
the logits themselves. Half-precision logits are upcast to float32 per chunk (bf16 sums over 10^5 entries
lose several digits); float32/float64 logits are used as they are.

Entropy bonus (the PPO paper's c2 * S term, Schulman et al. 2017): the actor minimises
L = L_pg - coef * aggregate(H), with the same aggregation (and global denominators) as the policy loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from quartet.core.choices import LossAggMode
from quartet.core.loss_agg import aggregate_loss
from quartet.core.metrics import ENTROPY, TensorMetrics

__all__ = ["EntropyBonusOutput", "entropy_bonus", "entropy_from_logits"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _block_sums(z: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    e = torch.exp(z - m.unsqueeze(-1))
    # z = -inf gives e = 0; zero z there before the product so neither the value nor the gradient is NaN.
    z_safe = torch.where(e > 0, z, torch.zeros((), dtype=z.dtype, device=z.device))
    return e.sum(dim=-1), (e * z_safe).sum(dim=-1)


def _chunk_entropy(logits: torch.Tensor, vocab_chunk_size: int) -> torch.Tensor:
    """H for a [N, V] chunk, streaming over vocabulary blocks: [N] in the compute dtype."""
    dtype = _compute_dtype(logits.dtype)
    blocks = torch.split(logits, vocab_chunk_size, dim=-1)
    # H does not depend on the shift m, so m carries no gradient.
    m = torch.stack([b.detach().to(dtype).amax(dim=-1) for b in blocks], dim=-1).amax(dim=-1)
    # An all -inf row (fully masked vocabulary) has no distribution; keep it finite and give it H = 0.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    s = torch.zeros_like(m)
    u = torch.zeros_like(m)
    for b in blocks:
        bs, bu = _block_sums(b.to(dtype), m)
        s, u = s + bs, u + bu
    s_safe = s.clamp(min=torch.finfo(dtype).tiny)
    h = m + torch.log(s_safe) - u / s_safe
    return torch.where(s > 0, h, torch.zeros_like(h))


def entropy_from_logits(
    logits: torch.Tensor, chunk_size: int = 1024, vocab_chunk_size: int | None = None
) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension.

    Args:
        logits: [..., V] (typically [B, T, V]); any float dtype.
        chunk_size: tokens (rows of the flattened [N, V] logits) per chunk.
        vocab_chunk_size: vocabulary entries per block within a chunk; None = the whole vocabulary.

    Returns:
        [...] entropies (typically [B, T]) in float32 for half-precision logits, else in logits' dtype.
        Differentiable with respect to the logits (chunks are checkpointed when gradients are needed).
    """
    if chunk_size < 1 or (vocab_chunk_size is not None and vocab_chunk_size < 1):
        raise ValueError(f"chunk sizes must be >= 1, got {chunk_size} and {vocab_chunk_size}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    block = vocab if vocab_chunk_size is None else vocab_chunk_size
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    out = []
    for chunk in torch.split(flat, chunk_size, dim=0):
        if needs_grad:
            h = checkpoint(_chunk_entropy, chunk, block, use_reentrant=False)
            assert isinstance(h, torch.Tensor)
            out.append(h)
        else:
            out.append(_chunk_entropy(chunk, block))
    if not out:  # no tokens at all
        return torch.zeros(lead, dtype=_compute_dtype(logits.dtype), device=logits.device)
    return torch.cat(out).reshape(lead)


@dataclass(frozen=True)
class EntropyBonusOutput:
    """-coef * aggregated entropy (0-d, graph attached; add it to the loss) and `actor/entropy`."""

    loss: torch.Tensor
    metrics: TensorMetrics


def entropy_bonus(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    *,
    agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN,
    global_token_count: float | int | torch.Tensor | None = None,
    global_seq_count: float | int | torch.Tensor | None = None,
    norm_constant: float | None = None,
) -> EntropyBonusOutput:
    """Entropy bonus term -coef * aggregate(H) of the actor loss.

    entropy, response_mask: [B, T] (entropy from `entropy_from_logits`). `actor/entropy` is the aggregated
    entropy itself (logged even when coef is 0). Aggregation arguments: see `loss_agg.aggregate_loss`.
    """
    value = aggregate_loss(
        entropy,
        response_mask,
        agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        norm_constant=norm_constant,
    )
    return EntropyBonusOutput(-coef * value, {ENTROPY: value.detach()})
