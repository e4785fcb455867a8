"""Log-probs over a small per-position set of tokens: a teacher's top-k, and a student's log-probs there.

GKD's generalised JSD (`quartet.core.gkd`) compares the teacher's and the student's next-token
distributions over the teacher's top-k tokens at each response position. The teacher needs its k most
likely tokens and their log-probs (no gradient); the student needs its log-probs at exactly those ids, with
gradient. Both come in two forms, matching the engine's two heads (`engines.engine._head`):

- from logits [b, K, V] (the plain head): a float32 log-softmax in chunks of positions, then `topk` or
  `gather`;
- from the last hidden states (the fused head, `engines.fused_head`), never building [N, V]:
  - top-k: the vocabulary in blocks; each block's top k merged into a running top k, and the log-sum-exp
    folded in by an online softmax; log p = z - logsumexp.
  - the student's support: z at the k ids is `h . W[id] / T` (k rows of the weight gathered per position),
    and the log-sum-exp is recovered as `z[target] - log p[target]` from the fused head's own log-prob of
    the sampled token, so its gradient (`onehot - p`, the fused head's backward) flows into the support's
    log-probs: d log p[id] / dz = onehot(id) - p, exact. Memory: k x hidden per position for the gathered
    weight rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "support_from_hidden",
    "support_from_logits",
    "topk_from_hidden",
    "topk_from_logits",
]

_CHUNK = 1024  # positions per chunk of the float32 log-softmax (as `heads`)
_VOCAB_BLOCK = 8192  # vocabulary entries per block of the fused top-k (as `fused_head`)


def _check_temperature(temperature: float) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def topk_from_logits(
    logits: torch.Tensor, k: int, temperature: float, chunk: int = _CHUNK
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens at each position of `logits` [b, K, V]: (log-probs [b, K, k] float32 under
    softmax(logits / temperature), in descending order; their ids [b, K, k] int64). No gradient."""
    _check_temperature(temperature)
    b, n, v = logits.shape
    if not 1 <= k <= v:
        raise ValueError(f"top-k needs 1 <= k <= vocabulary ({v}), got {k}")
    values, ids = [], []
    with torch.no_grad():
        for rows in torch.split(logits.reshape(b * n, v), chunk):
            top = torch.log_softmax(rows.float() / temperature, dim=-1).topk(k, dim=-1)
            values.append(top.values)
            ids.append(top.indices)
    if not values:
        return logits.new_zeros(b, n, k, dtype=torch.float32), torch.zeros(b, n, k, dtype=torch.long)
    return torch.cat(values).reshape(b, n, k), torch.cat(ids).reshape(b, n, k)


def support_from_logits(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float, chunk: int = _CHUNK
) -> torch.Tensor:
    """Log-probs [b, K, k] float32 at `ids` [b, K, k] under softmax(logits / temperature), differentiable."""
    _check_temperature(temperature)
    b, n, v = logits.shape
    if ids.shape[:2] != (b, n):
        raise ValueError(f"ids {tuple(ids.shape)} do not fit logits {tuple(logits.shape)} (want [b, K, k])")
    k = ids.shape[2]
    flat_ids = ids.reshape(b * n, k).to(logits.device)
    out = [
        torch.log_softmax(rows.float() / temperature, dim=-1).gather(-1, sel)
        for rows, sel in zip(
            torch.split(logits.reshape(b * n, v), chunk), torch.split(flat_ids, chunk), strict=True
        )
    ]
    return torch.cat(out).reshape(b, n, k) if out else logits.new_zeros(b, n, k, dtype=torch.float32)


def _linear_rows(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """[N, k] float32 logits h . W[ids] + b[ids] (the matmul's operands in `dtype`, as the lm_head's)."""
    rows = weight.to(dtype)[ids]  # [N, k, H]
    z = torch.einsum("nh,nkh->nk", h.to(dtype), rows).float()
    if bias is not None:
        z = z + bias.to(dtype)[ids].float()
    return z


def topk_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    temperature: float,
    dtype: torch.dtype,
    vocab_block: int = _VOCAB_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`topk_from_logits` of the logits `hidden [N, H] W^T + bias`, computed block by block over the
    vocabulary (matmuls in `dtype`): (log-probs [N, k] float32, ids [N, k] int64). No gradient."""
    _check_temperature(temperature)
    vocab = weight.shape[0]
    if not 1 <= k <= vocab:
        raise ValueError(f"top-k needs 1 <= k <= vocabulary ({vocab}), got {k}")
    n = hidden.shape[0]
    with torch.no_grad():
        h = hidden.to(dtype)
        best = torch.full((n, 0), -torch.inf, dtype=torch.float32, device=h.device)
        best_ids = torch.zeros((n, 0), dtype=torch.long, device=h.device)
        lse = torch.full((n,), -torch.inf, dtype=torch.float32, device=h.device)
        for start in range(0, vocab, vocab_block):
            stop = min(start + vocab_block, vocab)
            b = None if bias is None else bias[start:stop].to(dtype)
            z = F.linear(h, weight[start:stop].to(dtype), b).float() / temperature
            lse = torch.logaddexp(lse, torch.logsumexp(z, dim=-1))
            block = z.topk(min(k, stop - start), dim=-1)
            merged = torch.cat([best, block.values], dim=-1)
            merged_ids = torch.cat([best_ids, block.indices + start], dim=-1)
            top = merged.topk(min(k, merged.shape[1]), dim=-1)
            best, best_ids = top.values, merged_ids.gather(-1, top.indices)
    return best - lse.unsqueeze(-1), best_ids


def support_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    target_logprobs: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Log-probs [N, k] float32 at `ids` [N, k], differentiable, from the hidden states [N, H] and the fused
    head's log-probs `target_logprobs` [N] of `targets` [N] (module doc: the log-sum-exp is recovered from
    them, so no [N, V] tensor is built)."""
    _check_temperature(temperature)
    z_target = _linear_rows(hidden, weight, bias, targets.unsqueeze(-1), dtype).squeeze(-1) / temperature
    lse = z_target - target_logprobs
    return _linear_rows(hidden, weight, bias, ids, dtype) / temperature - lse.unsqueeze(-1)
